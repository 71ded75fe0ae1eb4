"""One monthly update of one arm: D_bandit from the warehouse -> ABPOTrainer -> a LoRA checkpoint + MLflow run.

    run_update(cfg, UpdateRun(variant, arm, months, init_model, output))  ->  UpdateResult(adapter_dir, model_dir, ...)

``cfg`` (section ``update``) says how to train; :class:`UpdateRun` says what this one update trains. Layout under
``<paths.models>/<run.output or update-<letter>-<first month>_<last month>-seed<seed>>/``:

    checkpoints/checkpoint-N/   TRL/Trainer checkpoints (adapter, optimizer, scheduler, RNG): the resume points
    adapter/                    the final LoRA adapter + tokenizer (``PeftModel.from_pretrained(pi_init, adapter/)``)
    model/                      the LoRA-merged full model + tokenizer (when update.save_merged), what serving loads
    update.json                 what was trained on, the variant, the MLflow run id

Variant (A) performs no update: ``run_update`` returns pi_init unchanged (and says so).

The parts, one idea per module (each name imported from its own module): `abpo.train.runs` (UpdateRun,
UpdateResult, the rollout signal), `abpo.train.grpo_args` (the config -> GRPOConfig / ABPOSettings mapping),
`abpo.train.strata` (D_bandit from the warehouse, the refusal of untrusted rows); this module loads pi_init, builds
the trainer, trains, saves and logs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo import registry
from abpo.algo.variants import get_variant
from abpo.policy.model import load_policy, lora_config
from abpo.policy.prompt import check_answers_fit
from abpo.train import signals
from abpo.train.dataset import subsample_strata, update_dataset_from_strata
from abpo.train.distributed import barrier, broadcast_from_main, check_launch, check_trainer, dist_state
from abpo.train.grpo_args import grpo_config, output_dir_for, settings_for, variant_update_config
from abpo.train.runs import (
    UpdateInputMissing,
    UpdateResult,
    UpdateRun,
    rollout_signal,
)
from abpo.train.strata import (
    warehouse_strata,
)

if TYPE_CHECKING:
    from abpo.config import Config
    from abpo.config.update import UpdateConfig
    from abpo.train.records import ABPOSettings


# ------------------------------------------------------------------------------------------------------ inputs


def init_dir_for(cfg: Config, run: UpdateRun) -> Path:
    """pi_init: ``run.init_model`` (a relative path that does not exist here is taken from the repository root, or
    installed from the current directory then the bundled resources: `abpo.paths.repo_path`), else the directory
    `abpo sft` writes for this config."""
    if run.init_model is None:
        return cfg.paths.resolve("models") / cfg.sft.output
    p = run.init_model
    if not p.is_absolute() and not p.exists():
        from abpo.paths import repo_path

        p = repo_path(p)
    return p


def load_start_model(init_dir: Path, cfg: Config):
    """(model, tokenizer) of pi_init; a PEFT adapter directory is merged into its base first (the update trains a
    fresh LoRA on top of pi_init)."""

    if not (init_dir / "config.json").exists() and not (init_dir / "adapter_config.json").exists():
        raise UpdateInputMissing(
            f"{init_dir}: pi_init not found (no config.json / adapter_config.json); run `abpo sft "
            f"--config {cfg.name}` first, or pass the model directory (`abpo update --init-model DIR`)"
        )
    policy = dataclasses.replace(cfg.policy, model=str(init_dir))
    model, tokenizer = load_policy(policy, cfg.paths, seed=cfg.seed)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.train()
    return model, tokenizer


# ------------------------------------------------------------------------------------------------------- train


def _last_checkpoint(ckpt_dir: Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(ckpt_dir)) if ckpt_dir.is_dir() else None


def make_trainer(
    model,
    tokenizer,
    train_dataset,
    update_cfg: UpdateConfig,
    settings: ABPOSettings,
    *,
    output_dir: Path,
    seed: int,
    peft_config=None,
    callbacks: list | None = None,
    grpo_overrides: dict | None = None,
    quiet: bool = False,
    item_popularity: dict[int, int] | None = None,
):
    """ABPOTrainer for ``settings.variant`` writing checkpoints under `output_dir/checkpoints`, checked against the
    launch (abpo.train.distributed.check_trainer: a process group needs a distributed trainer, a DeepSpeed config
    must not be dropped) before anything trains or an MLflow run opens. `quiet` drops the console
    progress/printer callbacks (metrics still reach `trainer.state.log_history` and MLflow). ``item_popularity``
    (item -> training interaction count) feeds the diagnostic abpo/r_sc_corr_popularity (docs/diagnostics.md)."""
    from abpo.train.callbacks import MLflowStepCallback
    from abpo.train.trainer import ABPOTrainer

    ckpt_dir = Path(output_dir) / "checkpoints"
    args = grpo_config(update_cfg, settings.variant, output_dir=ckpt_dir, seed=seed, **(grpo_overrides or {}))
    trainer = ABPOTrainer(
        model=model,
        args=args,
        settings=settings,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[MLflowStepCallback(), *(callbacks or [])],
        item_popularity=item_popularity,
    )
    check_trainer(trainer, update_cfg)
    if quiet:
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    return trainer


@contextlib.contextmanager
def reproducible_on_cpu(model):
    """torch's deterministic algorithms while an update trains on the CPU, the previous setting restored after.

    With 2 torch threads (policy.num_threads, the demo's) an op of the ABPO/GRPO step accumulated in a thread-dependent
    order: the same seed, rows and starting model gave different weights run to run (the demo's abpo update of
    2026-01, 6 steps: three runs, three weights files; the demo's reports then drifted apart from month 2 on). In
    deterministic mode two runs give one file, the file one thread gives, at the same speed. On an accelerator
    nothing is changed (CUDA's deterministic mode needs its own workspace settings, docs/operations.md)."""
    import torch

    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    before, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    if on_cpu:
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        if on_cpu:
            torch.use_deterministic_algorithms(before, warn_only=warn)


RESUME_KEY = "resume-key.json"  # <output>/resume-key.json: what the checkpoints under <output>/checkpoints train


def resume_key(cfg: Config, variant: str, init_dir: Path, tables, reward: str = "logged") -> dict[str, str]:
    """What an update's checkpoints are of, recorded beside them (:data:`RESUME_KEY`) and compared before a resume:
    the variant, the update's settings (every ``update.*`` but how often it logs and saves), the seed, the policy
    settings, the starting model, the reward, and a fingerprint of the training rows (sha256 of each table's Arrow
    IPC stream: the same rows in the same order, the same fingerprint)."""
    import hashlib

    import pyarrow as pa

    skip = {"resume", "logging_steps", "save_steps", "save_total_limit", "mlflow_experiment"}
    settings = {k: v for k, v in dataclasses.asdict(cfg.update).items() if k not in skip}
    rows = hashlib.sha256()
    for t in tables:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as writer:
            writer.write_table(t)
        rows.update(hashlib.sha256(sink.getvalue().to_pybytes()).digest())
    return {
        "variant": variant,
        "config": json.dumps(settings, sort_keys=True, default=str),
        "seed": str(cfg.seed),
        "policy": json.dumps(dataclasses.asdict(cfg.policy), sort_keys=True, default=str),
        "init_model": str(init_dir),
        "reward": reward,
        "data": rows.hexdigest()[:32],
    }


def resume_decision(output_dir: Path, resume: bool | str, key: dict[str, str]) -> tuple[bool | str, str]:
    """``(resume, why)``: ``resume`` as given unless it is True and ``output_dir/checkpoints`` holds checkpoints whose
    recorded :func:`resume_key` is missing or differs from ``key`` (another variant, config, seed, starting model or
    data wrote them): then False, and ``why`` says what differs (the caller logs it and starts fresh). Reads only."""
    if resume is not True or _last_checkpoint(Path(output_dir) / "checkpoints") is None:
        return resume, ""
    try:
        recorded = json.loads((Path(output_dir) / RESUME_KEY).read_text())
    except (OSError, ValueError):
        recorded = None
    if recorded == key:
        return True, ""
    what = (
        "no resume key is recorded beside them"
        if not isinstance(recorded, dict)
        else "their " + ", ".join(k for k in key if recorded.get(k) != key[k]) + " differ"
    )
    return False, (
        f"update {output_dir}: not resuming its checkpoints ({what}: they were written by another update into the "
        "same output); starting fresh"
    )


def checkpoint_problem(ckpt: str | Path) -> str | None:
    """Why the Trainer checkpoint directory ``ckpt`` cannot be resumed from, or None when it is whole: its
    ``trainer_state.json`` (the Trainer writes it after the model, optimizer, scheduler and RNG states: a save killed
    before its end has none) readable with a global step, the model's files there (config or adapter config, and
    weights: abpo.registry.missing_pretrained_files), and every weights or state file whole (``*.safetensors``
    against its header, ``*.pt`` / ``*.pth`` / ``*.bin`` against its zip directory: abpo.registry.weights_problem)."""
    ckpt = Path(ckpt)
    state = ckpt / "trainer_state.json"
    try:
        json.loads(state.read_text())["global_step"]
    except FileNotFoundError:
        return f"no {state.name} (its save did not finish: the Trainer writes it last)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{state.name} unreadable ({type(e).__name__})"
    missing = registry.missing_pretrained_files(ckpt)
    if missing:
        return f"missing {', '.join(missing)}"
    for f in sorted(ckpt.iterdir()):
        if f.suffix in (".pth", ".bin") and f.is_file():
            why = registry.torch_weights_problem(f)
            why = None if why is None else f"not a whole torch file ({why})"
        else:
            why = registry.weights_problem(f) if f.is_file() else None
        if why is not None:
            return f"{f.name}: {why}"
    return None


def _last_whole_checkpoint(ckpt_dir: Path) -> str | None:
    """The newest checkpoint under ``ckpt_dir`` that is whole (:func:`checkpoint_problem`), or None. Each newer one
    skipped is logged on one line naming it, why, and where the training starts instead: a save killed midway or a
    damaged file would otherwise fail every later resume (FileNotFoundError, SafetensorError)."""
    import logging
    import re

    if not ckpt_dir.is_dir():
        return None
    found = sorted(
        (int(m.group(1)), p)
        for p in ckpt_dir.iterdir()
        if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name))
    )
    skipped: list[tuple[Path, str]] = []
    good = None
    for _, p in reversed(found):
        why = checkpoint_problem(p)
        if why is None:
            good = p
            break
        skipped.append((p, why))
    instead = f"resuming from {good.name}" if good is not None else "starting fresh"
    for p, why in skipped:
        logging.getLogger(__name__).warning(
            f"update {ckpt_dir.parent}: not resuming from {p}: {why}; rule: a training resumes only from a whole "
            f"checkpoint; {instead}"
        )
    return str(good) if good is not None else None


def resume_point(output_dir: Path, resume: bool | str) -> str | None:
    """The checkpoint a training resumes from: ``resume`` itself when a path, the newest whole one under
    `output_dir/checkpoints` when True (a broken one skipped with a log line: :func:`_last_whole_checkpoint`), else
    None."""
    if isinstance(resume, str):
        return resume
    return _last_whole_checkpoint(Path(output_dir) / "checkpoints") if resume else None


def train_update(
    model,
    tokenizer,
    train_dataset,
    update_cfg: UpdateConfig,
    settings: ABPOSettings,
    *,
    output_dir: Path,
    seed: int,
    peft_config=None,
    resume: bool | str = True,
    callbacks: list | None = None,
    grpo_overrides: dict | None = None,
    quiet: bool = False,
    item_popularity: dict[int, int] | None = None,
):
    """Build ABPOTrainer (:func:`make_trainer`) and train (resuming from the last checkpoint in
    `output_dir/checkpoints` when `resume`). Returns (trainer, resumed_from). Logging to MLflow happens when a run
    is active."""
    trainer = make_trainer(
        model,
        tokenizer,
        train_dataset,
        update_cfg,
        settings,
        output_dir=output_dir,
        seed=seed,
        peft_config=peft_config,
        callbacks=callbacks,
        grpo_overrides=grpo_overrides,
        quiet=quiet,
        item_popularity=item_popularity,
    )
    resumed_from = resume_point(output_dir, resume)
    try:
        with reproducible_on_cpu(trainer.model):
            trainer.train(resume_from_checkpoint=resumed_from)
    finally:
        from abpo.train.callbacks import flush_step_metrics

        flush_step_metrics(trainer)  # the steps logged since the last write, when training stopped early
    return trainer, resumed_from


def save_update(trainer, tokenizer, output_dir: Path, *, save_merged: bool) -> tuple[Path, Path | None]:
    """adapter/ (LoRA or full weights) and, if asked, model/ (merged); both with the tokenizer. Called by every
    process of a multi-process update: ``trainer.save_model`` is collective (DeepSpeed gathers there) and writes on
    the main process; the tokenizer and the merged model are written by rank 0 alone, the others wait."""

    main = trainer.accelerator.is_main_process
    adapter_dir = Path(output_dir) / "adapter"
    if main and adapter_dir.exists():
        shutil.rmtree(adapter_dir)
    barrier()
    trainer.save_model(str(adapter_dir))
    if main:
        tokenizer.save_pretrained(adapter_dir)
    merged_dir = None
    if save_merged:
        from abpo.policy.model import save_policy

        merged_dir = Path(output_dir) / "model"
    if merged_dir is not None and main:
        if merged_dir.exists():
            shutil.rmtree(merged_dir)
        model = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(model, "merge_and_unload"):
            import copy

            model = copy.deepcopy(model).merge_and_unload()
        save_policy(model, tokenizer, merged_dir)
    barrier()
    return adapter_dir, merged_dir


class UpdateTerminated(BaseException):
    """SIGTERM reached an update with an open MLflow run (a BaseException, as KeyboardInterrupt for SIGINT: no
    ``except Exception`` on the way may swallow it). Raised by :func:`run_ends_with_the_process`'s handler."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


@dataclasses.dataclass
class RunWatch:
    """The MLflow run :func:`run_ends_with_the_process` ends: ``run_id`` is set once the run is open."""

    run_id: str | None = None

    def opened(self, mlrun) -> None:
        """Record the id of ``mlrun`` (None: no MLflow run was opened)."""
        if mlrun is not None:
            self.run_id = mlrun.info.run_id


@contextlib.contextmanager
def run_ends_with_the_process(enabled: bool = True):
    """Around the opening and the life of the update's MLflow run (its id set on the yielded :class:`RunWatch` once
    open): a SIGTERM or SIGINT (``kill``, Ctrl-C, a scheduler stopping the job) ends the run KILLED and any exception
    FAILED, so a killed standalone `abpo update` leaves no run RUNNING. The handlers are in place
    before the run opens, so no signal finds the run open without them. The signal keeps its effect: SIGINT raises
    KeyboardInterrupt; SIGTERM calls the handler that was there before (Airflow's task runner raises its own) or, when
    that was the default, is delivered again with the default action once the run is ended, so the process still dies
    by SIGTERM. Handlers are installed from the main thread only (Python's rule); elsewhere an exception still ends the
    run FAILED (MLflow's own context does). A signal arriving inside an MLflow store write (the run's opening and
    ending, params, metrics, tags: :func:`abpo.train.signals.held`) is handled as that write returns, so that it
    never leaves a SQLite store locked. ``enabled`` false (no MLflow run, not rank 0): nothing is done."""
    import logging
    import os
    import signal
    import threading

    watch = RunWatch()
    if not enabled:
        yield watch
        return
    received: list[int] = []
    previous: dict[int, object] = {}

    def on_signal(signum, frame):
        if signals.holding():  # inside an MLflow store write: raised as it returns (abpo.train.signals)
            signals.defer(lambda: on_signal(signum, frame))
            return
        before = previous.get(signum)
        if before == signal.SIG_IGN:  # ignored before: still ignored
            return
        received.append(signum)
        if callable(before):  # Python's SIGINT handler (KeyboardInterrupt), Airflow's SIGTERM handler
            before(signum, frame)
        raise UpdateTerminated(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        yield watch
    except BaseException as e:
        if watch.run_id is not None:
            status = "KILLED" if received or isinstance(e, KeyboardInterrupt) else "FAILED"
            # the active run ends through MLflow's run stack; one its own context already ended (FAILED, whatever
            # the cause) is set to what the cause decides
            ended = status
            with signals.held(drop=True):  # a second signal while the run ends: the first one's effect follows
                try:
                    registry.terminate_run(watch.run_id, status)
                except Exception as end_error:
                    # a full or damaged store refuses this write too: the refusal already raised says so and is
                    # what the caller meets, not a second traceback from ending the run
                    if registry.store_failure(end_error) is None:
                        raise
                    ended = "as the store left it (it takes no write)"
            why = f"signal {signal.Signals(received[0]).name}" if received else type(e).__name__
            logging.getLogger(__name__).warning(
                f"update: stopped by {why}; its MLflow run {watch.run_id} ended {ended}"
            )
        if isinstance(e, UpdateTerminated) and previous.get(e.signum) in (signal.SIG_DFL, None):
            signal.signal(e.signum, signal.SIG_DFL)  # the default action, now that the run is ended: the process dies
            os.kill(os.getpid(), e.signum)
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]


def run_update(
    cfg: Config,
    run: UpdateRun,
    *,
    progress: bool = True,
    strata=None,
    log_mlflow: bool = True,
    nested: bool = False,
    callbacks=None,
    run_tags: dict[str, str] | None = None,
    gate_users: str | None = None,
    gate_holdout_fraction: float | None = None,
    reward: str = "logged",
    gate_ope_rows: str = "all",
) -> UpdateResult:
    """The `abpo update` job: pi_init + D_bandit (warehouse) -> the variant's update, logged to MLflow; ``cfg`` says
    how to train, ``run`` what (:class:`UpdateRun`).

    ``strata``: (positive, no_response) tables in IMPRESSIONS_SCHEMA, the logs of ``run.months``, to train on
    instead of the warehouse's (the arm loop passes an arm's own rows it has already read and checked; the
    experiment runner the log it built in memory). ``log_mlflow=False`` runs without an
    MLflow run (the metrics stay in ``result.metrics`` / ``result.history``); ``nested`` opens the run inside the
    active one. ``callbacks``: extra transformers TrainerCallbacks (progress reporting). ``run_tags``: extra tags of
    the update's MLflow run (the production loop's task key). ``gate_users`` / ``gate_holdout_fraction`` / ``gate_ope_rows``:
    config ``arms.gate_users`` / ``arms.gate_holdout_fraction`` / ``arms.gate_ope_rows`` (section arms sits above
    abpo.train), which users' rows the warehouse's D_bandit leaves out (:func:`warehouse_strata`); required without ``strata``. ``reward``: the rollouts'
    reward (abpo.train.records.ABPOSettings.reward): ``logged`` (the paper) or ``simulated_click`` (the online
    upper bound, a diagnostic: ``strata`` carrying the column candidate_click_prob, variant grpo); not a config
    setting, so no arm or experiment row can select it."""
    from abpo.data.loaders import load_dataset

    variant = get_variant(run.variant)
    check_strata_source(run, strata, gate_users, gate_holdout_fraction, trains=variant.update)
    # the settings the variant fixes (docs/update-variants.md), so that the logged params say what trained
    cfg = dataclasses.replace(cfg, update=variant_update_config(cfg.update, variant.name))
    init_dir = init_dir_for(cfg, run)
    if not variant.update:
        return no_update(cfg, run, variant, init_dir, log_mlflow=log_mlflow, nested=nested)
    check_launch(cfg.update)  # a launch that would train wrongly stops here, before a model loads
    dist = dist_state(deepspeed=bool(cfg.update.deepspeed))
    model, tokenizer = load_start_model(init_dir, cfg)
    positive, no_response, run = training_strata(cfg, run, strata, gate_users, gate_holdout_fraction, gate_ope_rows)
    dataset = load_dataset(cfg.data)
    rows = update_rows(cfg, positive, no_response, dataset.titles(), tokenizer)
    out = output_dir_for(cfg, run)
    resume = prepare_output(cfg, out, resume_key(cfg, variant.name, init_dir, rows.tables, reward), dist.is_main)
    # built before the MLflow run opens: the trainer's refusals (a process group without a distributed trainer, a
    # dropped DeepSpeed config, settings it rejects) leave no FAILED run behind
    trainer = make_trainer(
        model,
        tokenizer,
        rows.dataset,
        cfg.update,
        dataclasses.replace(settings_for(cfg, variant.name, click_rate=rows.click_rate), reward=reward),
        output_dir=out,
        seed=cfg.seed,
        peft_config=lora_config(cfg.policy),
        callbacks=callbacks,
        grpo_overrides={"disable_tqdm": not progress},
        item_popularity=dataset.popularity(),
    )
    # rank 0 alone opens the run (and logs params, tags and the metrics of MLflowStepCallback)
    run_ctx = (
        update_run(cfg, run, variant, init_dir, out, reward=reward, extra_tags=run_tags, nested=nested)
        if log_mlflow and dist.is_main
        else contextlib.nullcontext()
    )
    # the handlers that end the run are in place before it opens; its opening and ending hold a signal off (signals)
    ends_with_the_process = run_ends_with_the_process(log_mlflow and dist.is_main)
    with ends_with_the_process as watch, signals.HeldOnEntryAndExit(run_ctx, watch.opened) as mlrun:
        if mlrun is not None:
            _log_params(run_params(cfg, run, variant.name, rows.report.as_params()))
        result = train_and_save(cfg, variant.name, trainer, tokenizer, out, init_dir, resume, rows.report)
        result.mlflow_run_id = broadcast_from_main(mlrun.info.run_id if mlrun is not None else None)
        if mlrun is not None:
            _log_outputs(result)
    if dist.is_main:
        write_update_json(out, result)
    barrier()  # update.json is there when any process returns
    return result


def write_update_json(out: Path, result: UpdateResult) -> None:
    """<out>/update.json: the result (abpo.train.runs.read_update_json reads it back); its presence marks the update
    finished."""
    (out / "update.json").write_text(
        json.dumps(
            {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(result).items()},
            indent=1,
            default=str,
        )
    )


def check_strata_source(
    run: UpdateRun, strata, gate_users: str | None, gate_holdout_fraction: float | None, *, trains: bool
) -> None:
    """ValueError, before any model loads, when the rows to train on are not said: ``strata`` without the months
    they hold, or (for a variant that ``trains``) neither ``strata`` nor the gate settings the warehouse's D_bandit
    is read with."""
    if strata is not None and not run.months:
        raise ValueError("run_update: strata without run.months; rule: name the months whose logs the tables hold")
    if trains and strata is None and (gate_users is None or gate_holdout_fraction is None):
        raise ValueError(
            "run_update: no strata and no gate_users / gate_holdout_fraction; rule: reading D_bandit "
            "from the warehouse needs config arms.gate_users and arms.gate_holdout_fraction"
        )


def training_strata(
    cfg: Config,
    run: UpdateRun,
    strata,
    gate_users: str | None,
    gate_holdout_fraction: float | None,
    gate_ope_rows: str = "all",
):
    """(positive, no_response, run) of D_bandit: ``strata`` as given, else the warehouse's rows of ``run.arm`` in
    ``run.months`` (every ingested month when empty: ``run`` then names them) without the gate's held-out users
    (abpo.train.strata.warehouse_strata)."""
    if strata is not None:
        positive, no_response = strata
        return positive, no_response, run
    if gate_users is None or gate_holdout_fraction is None:
        raise ValueError(
            "run_update: no strata and no gate_users / gate_holdout_fraction; rule: reading D_bandit "
            "from the warehouse needs config arms.gate_users and arms.gate_holdout_fraction"
        )
    positive, no_response, months = warehouse_strata(
        cfg, run, gate_users=gate_users, gate_holdout_fraction=gate_holdout_fraction, gate_ope_rows=gate_ope_rows
    )
    return positive, no_response, dataclasses.replace(run, months=tuple(months))


def update_run(
    cfg: Config,
    run: UpdateRun,
    variant,
    init_dir: Path,
    out: Path,
    *,
    reward: str,
    extra_tags: dict[str, str] | None,
    nested: bool,
):
    """The update's MLflow run (opened on entry, abpo.registry.start_run), tagged with what trained (variant, arm,
    months), from what and into where."""
    tags = {
        "abpo.variant": variant.name,
        "abpo.variant_letter": variant.letter,
        "abpo.arm": run.arm,
        "abpo.months": ",".join(run.months),
        "abpo.init_model": str(init_dir),
        "abpo.output_dir": str(out),
        **({"abpo.reward": reward} if reward != "logged" else {}),  # the online upper bound's runs say so
        **(extra_tags or {}),
    }
    name = f"update-{variant.letter}-{'_'.join(run.months)}"
    return registry.start_run(cfg, cfg.update.mlflow_experiment, name, tags=tags, nested=nested)


def no_update(cfg: Config, run: UpdateRun, variant, init_dir: Path, *, log_mlflow: bool, nested: bool) -> UpdateResult:
    """Variant (A): no update, pi_init is the result (an MLflow run records that it was asked for)."""
    out = output_dir_for(cfg, run)
    if not init_dir.exists():
        raise UpdateInputMissing(f"{init_dir}: pi_init not found; run `abpo sft --config {cfg.name}` first")
    if not log_mlflow:
        return UpdateResult(variant.name, out, None, init_dir, None, init_dir, None, 0)
    with registry.start_run(
        cfg,
        cfg.update.mlflow_experiment,
        f"update-{variant.letter}",
        nested=nested,
        tags={"abpo.variant": variant.name, "abpo.init_model": str(init_dir)},
    ) as mlrun:
        _log_params({"update.variant": variant.name})
    return UpdateResult(variant.name, out, None, init_dir, None, init_dir, mlrun.info.run_id, 0)


@dataclasses.dataclass
class UpdateRows:
    """D_bandit as the update trains on it: the strata (subsampled to update.max_examples), the HF dataset of
    stratified batches built from them, its batching report and c, the share of positive rows."""

    positive: Any
    no_response: Any
    dataset: Any
    report: Any  # abpo.train.dataset.BatchingReport
    click_rate: float | None

    @property
    def tables(self) -> tuple[Any, Any]:
        return self.positive, self.no_response


def update_rows(cfg: Config, positive, no_response, titles, tokenizer) -> UpdateRows:
    """The strata subsampled to update.max_examples and turned into the stratified batches of step 3's SNIPS
    mini-batches (abpo.train.dataset): one optimizer step over all processes (update.batch_size counts the examples
    of every process's micro-batch). c is taken from the rows trained on, before the batches oversample a stratum
    (update.no_response_weight_rule)."""
    examples_per_batch = cfg.update.batch_size * cfg.update.grad_accum
    positive, no_response, note = subsample_strata(positive, no_response, cfg.update.max_examples, cfg.seed)
    shown = {int(c) for t in (positive, no_response) for cands in t.column("candidates").to_pylist() for c in cands}
    check_answers_fit(tokenizer, titles, cfg, "the update's rows", items=shown)  # before anything trains
    n_rows = positive.num_rows + no_response.num_rows
    click_rate = positive.num_rows / n_rows if n_rows else None
    train_ds, report = update_dataset_from_strata(
        positive,
        no_response,
        titles,
        tokenizer,
        cfg.policy,
        examples_per_batch=examples_per_batch,
        seed=cfg.seed,
        stratification=cfg.update.stratification,
    )
    if note:
        report.notes.insert(0, note)
    return UpdateRows(positive, no_response, train_ds, report, click_rate)


def prepare_output(cfg: Config, out: Path, key: dict[str, str], is_main: bool) -> bool | str:
    """The output directory made ready for this update, and whether (or from where) it resumes: a checkpoint is
    resumed only by the update that wrote it (same resume ``key``: variant, settings, seed, model and rows);
    another update killed into the same output leaves checkpoints this one must not continue. A finished update of
    the same inputs retrains from scratch (same seed -> same result) instead of "resuming" a completed run; only an
    interrupted update (checkpoints, no update.json) resumes. Every process calls it; rank 0 removes and writes."""
    resume, not_resumed = resume_decision(out, cfg.update.resume, key)
    finished = (out / "update.json").exists()
    barrier()  # every process has looked before rank 0 removes anything
    if not_resumed:
        import logging

        logging.getLogger(__name__).warning(not_resumed)
        if is_main:
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
    if finished:
        if is_main:
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            (out / "update.json").unlink()
        resume = False
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / RESUME_KEY).write_text(json.dumps(key, indent=1) + "\n")
    barrier()
    return resume


def run_params(cfg: Config, run: UpdateRun, variant: str, batching: dict) -> dict:
    """The update's MLflow params: every update.* setting, what was trained under the names these inputs have as
    settings (runs stay comparable in MLflow), the policy settings that shape it and the batching report; the
    starting model and the output directory are the tags abpo.init_model and abpo.output_dir."""
    params = {f"update.{k}": v for k, v in dataclasses.asdict(cfg.update).items()}
    params.update({"update.variant": variant, "update.arm": run.arm, "update.months": list(run.months)})
    params.update(
        {
            "policy.tau": cfg.policy.tau,
            "policy.lora_r": cfg.policy.lora_r,
            "seed": cfg.seed,
            "policy.constrained_rollouts": cfg.policy.constrained_rollouts,
        }
    )
    params.update(batching)
    return params


def train_and_save(
    cfg: Config, variant: str, trainer, tokenizer, out: Path, init_dir: Path, resume, report
) -> UpdateResult:
    """Train (from the resume point), save the adapter (and the merged model), and the result with the per-step
    metrics of the log history (its MLflow run id is set by the caller)."""
    resumed_from = resume_point(out, resume)
    try:
        with reproducible_on_cpu(trainer.model):
            trainer.train(resume_from_checkpoint=resumed_from)
    finally:
        from abpo.train.callbacks import flush_step_metrics

        flush_step_metrics(trainer)  # the steps logged since the last write, when training stopped early
    adapter_dir, merged_dir = save_update(trainer, tokenizer, out, save_merged=cfg.update.save_merged)
    ckpt = _last_whole_checkpoint(out / "checkpoints")
    steps = [h for h in trainer.state.log_history if "abpo/advantages/mean" in h]  # per-step logs, not the summary
    history = [
        {k: float(v) for k, v in h.items() if isinstance(v, (int, float)) and not isinstance(v, bool)} for h in steps
    ]
    return UpdateResult(
        variant=variant,
        output_dir=out,
        adapter_dir=adapter_dir,
        model_dir=merged_dir or adapter_dir,
        checkpoint_dir=Path(ckpt) if ckpt else None,
        init_model_dir=init_dir,
        mlflow_run_id=None,
        global_step=trainer.state.global_step,
        resumed_from=resumed_from,
        metrics=dict(history[-1]) if history else {},
        batching=report.as_params(),
        history=history,
    )


def _log_params(params: dict) -> None:
    """``params`` on the active MLflow run (a list value as its comma-joined items)."""
    with signals.held():
        registry.log_params({k: (",".join(map(str, v)) if isinstance(v, list) else v) for k, v in params.items()})


def _log_outputs(result: UpdateResult) -> None:
    """What the update wrote (tags abpo.adapter_dir, abpo.model_dir, abpo.resumed_from) and its rollout signal's
    summary metrics (summary/*) on the active MLflow run."""
    with signals.held():
        if result.resumed_from:
            registry.set_tag("abpo.resumed_from", result.resumed_from)
        registry.set_tags({"abpo.adapter_dir": str(result.adapter_dir), "abpo.model_dir": str(result.model_dir)})
        if result.history:
            registry.log_metrics({f"summary/{k}": v for k, v in rollout_signal(result.history).items()})
