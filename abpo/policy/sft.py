"""pi_init: the initial deployed policy, trained by supervised fine-tuning on D_sup (docs/ABPO_SPEC.md "Data objects")
with TRL's ``SFTTrainer``; for item-token models (``sft.pretrain_epochs > 0``) after a next-item pre-training stage
over every position of each user's x_{1:T} (``pretrain_stage``, abpo.policy.pretrain), whose item tokens' rows may
first be set from ALS factors of the same x_{1:T} (``sft.item_init``, ``item_init_stage``). Each stage's wall time is
logged (this module's logger, shown by abpo.logs.console) and recorded in MLflow (``stage_seconds_*``).

Each D_sup example (x_{1:t}, C, x_{t+1}) becomes prompt q = the fitted, chat-rendered prompt and completion
r(x_{t+1}) + EOS. The dataset is handed to TRL pre-tokenized (``input_ids`` + ``completion_mask``), with the
same tokenization scoring uses (prompt ids, then the answer's own ids), and ``completion_only_loss=True``: the
loss is the answer's negative log-likelihood only.

The run is an MLflow run (params, the loss curve as metric + PNG, evaluation metrics, the model) and the model
is registered as a version of ``abpo.registry.MODEL_NAME`` (aliases ``champion`` and ``pi_init``: it is the
policy deployed before any update).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from abpo import registry
from abpo.config.policy import LOSS_TOKENS
from abpo.data.candidates import build_eval_examples, build_sup_examples, training_popularity
from abpo.data.splits import split_of_user, split_users
from abpo.policy.model import load_policy, lora_config, save_policy
from abpo.policy.prompt import check_answers_fit, check_item_tokens, example_prompt, format_answer, prompt_style

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)

PI_INIT_ALIAS = "pi_init"


@dataclass
class SFTResult:
    model_dir: Path
    mlflow_run_id: str | None
    model_version: str | None
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, training loss)
    metrics: dict[str, float] = field(default_factory=dict)  # evaluation of pi_init (HR@K, random_HR@K, ...)
    n_train: int = 0
    seconds: float = 0.0
    stage_seconds: dict[str, float] = field(default_factory=dict)  # pretrain (stage 1), sft (stage 2)


def sft_records(examples, titles, tokenizer, policy_cfg, loss_tokens: str = "answer") -> list[dict[str, list[int]]]:
    """Pre-tokenized D_sup: ``input_ids`` = prompt ids + answer ids + EOS, ``completion_mask`` = 1 on the tokens
    with loss: the answer and EOS (``loss_tokens="answer"``), or the answer's item token only (``"choice"``, for
    item-token models: the only answer token that chooses; the rest is forced by the item)."""

    if loss_tokens not in LOSS_TOKENS:
        raise ValueError(f"sft.loss_tokens={loss_tokens!r}; rule: one of {list(LOSS_TOKENS)}")
    if loss_tokens == "choice" and prompt_style(policy_cfg) != "item_tokens":
        raise ValueError(
            "sft.loss_tokens=choice needs policy.prompt_style=item_tokens (one token per item: the item token is the "
            "choice); a text model's answer is learnt whole (sft.loss_tokens=answer)"
        )

    if tokenizer.eos_token_id is None:
        raise ValueError(f"{getattr(tokenizer, 'name_or_path', 'tokenizer')}: no EOS token; the answer needs an end")
    prompts = [example_prompt(ex, titles, tokenizer, policy_cfg).text for ex in examples]
    answers = [format_answer(ex.positive, titles[ex.positive]) for ex in examples]
    out = []
    for i in range(0, len(examples), 256):  # batched encoding (the same ids as encode_prompt / encode_answer)
        ps = tokenizer(prompts[i : i + 256], add_special_tokens=False)["input_ids"]
        ans = tokenizer(answers[i : i + 256], add_special_tokens=False)["input_ids"]
        if loss_tokens == "choice":  # the positives' item tokens, one lookup per chunk
            firsts = check_item_tokens(tokenizer, [ex.positive for ex in examples[i : i + 256]])
        for j, (p, a) in enumerate(zip(ps, ans, strict=True)):
            a = list(a) + [tokenizer.eos_token_id]
            if loss_tokens == "choice":
                if a[0] != firsts[j]:
                    raise ValueError(
                        f"request {examples[i + j].request_id}: the answer does not start with its item token"
                    )
                mask = [1] + [0] * (len(a) - 1)
            else:
                mask = [1] * len(a)
            out.append({"input_ids": list(p) + a, "completion_mask": [0] * len(p) + mask})
    return out


def training_sequences(splits) -> dict[int, list[int]]:
    """user -> x_{1:T} (the history of the split): what pi_init's stage 1 trains on and ``sft.item_init``'s
    factorisation reads; never the update range or the held-out target."""
    return {sp.user_id: sp.history for sp in splits}


def item_init_stage(model, tokenizer, dataset, splits, cfg: Config):
    """``sft.item_init`` (abpo.policy.item_init, Eq. item-init): the item tokens' rows of ``model`` set in place from
    factors fitted on :func:`training_sequences`, before stage 1. ``random`` changes nothing."""
    from abpo.policy.item_init import init_item_embeddings

    return init_item_embeddings(
        model,
        tokenizer,
        training_sequences(splits),
        list(dataset.titles()),
        method=cfg.sft.item_init,
        seed=cfg.seed,
    )


def pretrain_stage(
    model, tokenizer, dataset, splits, cfg: Config, *, validation_fraction: float, log_mlflow: bool = False
):
    """pi_init stage 1 (abpo.policy.pretrain): next-item pre-training of ``model`` in place on every user's
    x_{1:T}, early-stopped on the validation users' next items x_{T+1..T+N-1} (the ``validation_fraction`` of
    users, the caller's ``experiment.validation_fraction``; the test users' targets are never read). Metrics go to
    the active MLflow run when ``log_mlflow``."""
    from abpo.policy.pretrain import pretrain_next_item

    s = cfg.sft
    train = training_sequences(splits)
    val = {
        sp.user_id: (sp.history, sp.update)
        for sp in splits
        if split_of_user(sp.user_id, validation_fraction) == "validation"
    }
    return pretrain_next_item(
        model,
        tokenizer,
        train,
        val,
        item_ids=list(dataset.titles()),
        epochs=s.pretrain_epochs,
        learning_rate=s.pretrain_learning_rate,
        batch_size=s.pretrain_batch_size,
        max_length=s.pretrain_max_length,
        patience=s.pretrain_patience,
        weight_decay=0.0,
        seed=cfg.seed,
        log_metric=registry.log_metric if log_mlflow else None,
    )


def register_pi_init(cfg: Config, model_uri: str, tags: dict):
    """Register pi_init as a new version of abpo-recommender (in the config's namespace) with alias ``pi_init``; alias ``champion`` only when
    no champion exists (a retrained pi_init never displaces a gated champion). Returns (version, became champion).
    A registry that cannot answer raises (abpo.registry.RegistryUnavailable) instead of reading as "no champion"."""

    name = registry.model_name(cfg)
    first = registry.get_version(registry.CHAMPION, name=name, cfg=cfg) is None
    mv = registry.register(model_uri, alias=registry.CHAMPION if first else None, tags=tags, name=name)
    registry.set_alias(PI_INIT_ALIAS, mv.version, name=name)
    return mv, first


def seeded_subsample(items: list, n: int, seed: int) -> list:
    """``n`` of ``items`` drawn without replacement by ``seed``, in their original order (all when n <= 0)."""
    if n <= 0 or n >= len(items):
        return list(items)
    idx = np.sort(np.random.default_rng(seed).choice(len(items), size=n, replace=False))
    return [items[i] for i in idx]


def _accepts_logits_to_keep(model) -> bool:
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(type(base).forward).parameters
    except (TypeError, ValueError):
        return False


def _completion_sft_trainer_class():
    """TRL's ``SFTTrainer`` with a completion-only loss that projects ONLY the completion positions through the LM
    head (``logits_to_keep`` as a boolean mask).

    TRL's own loss (its fused LM head) projects every position of the batch through the head on devices without
    Triton (CPU): with answers of ~15 tokens after prompts of hundreds, almost all of that work (and its entropy /
    accuracy metrics over the full vocabulary) is for positions whose loss is masked out. The loss here is the same
    quantity, sum over completion tokens of -log p(token | prefix) / number of completion tokens (or TRL's
    ``num_items_in_batch`` under gradient accumulation); entropy and token accuracy are logged on the completion
    tokens as TRL does. Models whose forward has no ``logits_to_keep`` use TRL's loss unchanged.
    """
    import torch
    import torch.nn.functional as F
    from trl import SFTTrainer

    class CompletionSFTTrainer(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if (
                return_outputs
                or "labels" not in inputs
                or "attention_mask" not in inputs
                or not _accepts_logits_to_keep(self.accelerator.unwrap_model(model))
            ):
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            mode = "train" if self.model.training else "eval"
            labels = inputs["labels"]
            # position t predicts token t+1: keep t where labels[t+1] is a completion token
            keep = torch.zeros_like(labels, dtype=torch.bool)
            keep[:, :-1] = labels[:, 1:] != -100
            targets = labels[:, 1:][keep[:, :-1]]
            fwd = {k: v for k, v in inputs.items() if k not in ("labels", "completion_mask", "assistant_masks")}
            logits = model(**fwd, use_cache=False, logits_to_keep=keep).logits.float()  # [N, V]
            logits = logits.reshape(-1, logits.shape[-1])
            n = targets.numel() if num_items_in_batch is None else num_items_in_batch
            loss = F.cross_entropy(logits, targets, reduction="sum") / torch.as_tensor(n).clamp(min=1)
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes
            # entropy and token accuracy (two more passes over [answer tokens, vocabulary]) only on the steps
            # whose metrics are logged: TRL averages what it collected since the last log
            log_step = (
                mode != "train"
                or (self.state.global_step + 1) % max(1, int(self.args.logging_steps)) == 0
                or self.state.global_step == 0
            )
            if log_step:
                with torch.no_grad():
                    logp = torch.log_softmax(logits.detach(), dim=-1)
                    entropy = -(logp.exp() * logp).sum(-1)
                    valid = max(targets.numel(), 1)
                    self._metrics[mode]["entropy"].append(entropy.sum().item() / valid)
                    self._metrics[mode]["mean_token_accuracy"].append(
                        (logits.argmax(-1) == targets).sum().item() / valid
                    )
            if mode == "train":
                self._total_train_tokens += int(inputs["attention_mask"].sum().item())
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
            return loss

    return CompletionSFTTrainer


def run_sft(
    model, tokenizer, records: list[dict], cfg: Config, output_dir: str | Path, *, callbacks=(), peft_config=None
):
    """Train ``model`` on pre-tokenized ``records`` with TRL's SFTTrainer (completion-only loss); returns the
    trained model (LoRA merged) and the trainer's log history."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig

    s = cfg.sft
    bf16 = cfg.policy.dtype == "bfloat16"
    args = SFTConfig(
        output_dir=str(output_dir),
        num_train_epochs=s.epochs,
        max_steps=s.max_steps,
        learning_rate=s.learning_rate,
        per_device_train_batch_size=s.batch_size,
        gradient_accumulation_steps=s.grad_accum,
        warmup_steps=s.warmup_ratio,  # a float in [0, 1) is a ratio of the total steps
        weight_decay=s.weight_decay,
        max_grad_norm=s.max_grad_norm,
        lr_scheduler_type="linear",
        logging_steps=s.logging_steps,
        logging_first_step=True,
        save_strategy="no",
        report_to="none",
        seed=cfg.seed,
        data_seed=cfg.seed,
        bf16=bf16,
        fp16=False,
        # transformers 5's name for it (gradient_checkpointing, its deprecated alias, printed a FutureWarning)
        activation_checkpointing=s.gradient_checkpointing,
        # pinned memory only serves a copy to an accelerator (on the CPU torch warned that it is not used)
        dataloader_pin_memory=torch.accelerator.is_available(),
        completion_only_loss=True,
        max_length=None,  # prompts are already fitted to policy.max_prompt_tokens; nothing is truncated
        dataset_num_proc=None,
        dataloader_num_workers=0,
    )
    trainer = _completion_sft_trainer_class()(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(records),
        processing_class=tokenizer,
        callbacks=list(callbacks),
        peft_config=peft_config,
    )
    trainer.train()
    trained = trainer.model
    if hasattr(trained, "merge_and_unload"):
        trained = trained.merge_and_unload()
    trained.eval()
    return trained, list(trainer.state.log_history)


def _loss_png(losses: list[tuple[int, float]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([s for s, _ in losses], [v for _, v in losses], marker=".")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("answer NLL (completion-only loss)")
    ax.set_title("SFT of pi_init on D_sup")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def train_sft(
    cfg: Config,
    *,
    validation_fraction: float,
    dataset: Any = None,
    log_mlflow: bool = True,
    register: bool = True,
    evaluate: bool = True,
    run_tags: dict[str, str] | None = None,
) -> SFTResult:
    """Train pi_init on D_sup (``cfg.data`` -> splits -> ``build_sup_examples``) starting from ``policy.model``;
    save it to ``<paths.models>/<sft.output>``; log and register it in MLflow (``run_tags`` added to the run's
    tags); evaluate it on the held-out targets (``build_eval_examples``: HR@K vs the random K/M).
    ``validation_fraction`` (the caller's ``experiment.validation_fraction``): the users whose next items early-stop
    stage 1 (:func:`pretrain_stage`)."""
    import torch
    from transformers import TrainerCallback

    from abpo.data.loaders import load_dataset

    t0 = time.time()
    torch.manual_seed(cfg.seed)
    ds = dataset if dataset is not None else load_dataset(cfg.data)
    splits, report = split_users(ds, cfg.data)
    titles = ds.titles()
    sup = seeded_subsample(build_sup_examples(splits, ds, cfg.data), cfg.sft.max_examples, cfg.seed)
    if not sup:
        raise ValueError(f"D_sup is empty for {ds.name} (split report: {report})")
    model, tok = load_policy(cfg.policy, cfg.paths, dataset=ds, seed=cfg.seed)
    check_answers_fit(tok, titles, cfg, "pi_init's SFT")  # every answer fits the update's rollouts, or nothing trains
    records = sft_records(sup, titles, tok, cfg.policy, cfg.sft.loss_tokens)
    n_tok = sum(len(r["input_ids"]) for r in records)
    log.info(
        f"sft: D_sup {len(records)} examples ({n_tok / len(records):.0f} tokens each on average), "
        f"model {cfg.policy.model} ({model.num_parameters() / 1e6:.2f}M parameters)"
    )
    models_dir = cfg.paths.resolve("models")
    out_dir = models_dir / cfg.sft.output
    work = models_dir / f".{cfg.sft.output}.trainer"
    losses: list[tuple[int, float]] = []

    class _Losses(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append((int(state.global_step), float(logs["loss"])))
                if log_mlflow:
                    registry.log_metric("train_loss", float(logs["loss"]), step=int(state.global_step))

    params = _run_params(cfg, n_train=len(records), n_users=len(splits))
    result = SFTResult(model_dir=out_dir, mlflow_run_id=None, model_version=None, n_train=len(records))

    def body(run=None):
        trained = _train_stages(
            model, tok, ds, splits, records, cfg, work, result, [_Losses()], validation_fraction, run is not None
        )
        _save_pi_init(trained, tok, cfg, out_dir, work, n_train=len(records), losses=losses)
        result.losses = losses
        loss = f"; loss {losses[0][1]:.3f} -> {losses[-1][1]:.3f}" if losses else ""
        log.info(f"sft: saved pi_init to {out_dir}{loss}")
        if evaluate:
            _evaluate_pi_init(trained, tok, ds, splits, titles, cfg, result)
        if run is not None:
            _log_and_register(run, cfg, params, result, losses, work, out_dir, register=register)

    if log_mlflow:
        with registry.start_run(
            cfg, cfg.sft.experiment, "sft-pi_init", tags={"abpo.step": "sft", **(run_tags or {})}
        ) as run:
            body(run)
    else:
        body()
    result.seconds = time.time() - t0
    return result


def _run_params(cfg: Config, *, n_train: int, n_users: int) -> dict[str, Any]:
    """The SFT run's MLflow parameters: the sft and policy sections, the data keys that shape D_sup, the seed, the
    number of training examples and of users."""
    return {
        **{f"sft.{k}": v for k, v in asdict(cfg.sft).items()},
        **{f"policy.{k}": v for k, v in asdict(cfg.policy).items()},
        "data.dataset_dir": cfg.data.dataset_dir,
        "data.train_candidates": cfg.data.train_candidates,
        "data.eval_candidates": cfg.data.eval_candidates,
        "seed": cfg.seed,
        "n_train_examples": n_train,
        "n_users": n_users,
    }


def _train_stages(
    model,
    tok,
    ds,
    splits,
    records: list[dict],
    cfg: Config,
    work: Path,
    result: SFTResult,
    callbacks: list,
    validation_fraction: float,
    log_mlflow: bool,
):
    """pi_init's two stages: next-item pre-training (when sft.pretrain_epochs > 0) and the answer-format SFT on
    D_sup, after the item tokens' rows of ``sft.item_init`` (when not random); their seconds (and stage 1's epochs)
    go into ``result``; returns the trained model."""
    if cfg.sft.item_init != "random":
        ii = item_init_stage(model, tok, ds, splits, cfg)
        result.stage_seconds["item_init"] = ii.seconds
    if cfg.sft.pretrain_epochs > 0:
        pre = pretrain_stage(
            model, tok, ds, splits, cfg, validation_fraction=validation_fraction, log_mlflow=log_mlflow
        )
        result.stage_seconds["pretrain"] = pre.seconds
        result.metrics.update(
            {
                "pretrain_epochs_run": float(pre.epochs_run),
                "pretrain_best_epoch": float(pre.best_epoch),
            }
        )
        log.info(
            f"pi_init stage 1 (next-item pre-training): {pre.seconds:.1f}s, {pre.epochs_run} epochs, "
            f"best epoch {pre.best_epoch}, {pre.n_train_positions} training positions"
        )
    t_sft = time.time()
    trained, _ = run_sft(
        model,
        tok,
        records,
        cfg,
        work,
        callbacks=callbacks,
        peft_config=lora_config(cfg.policy) if cfg.sft.use_lora else None,
    )
    result.stage_seconds["sft"] = time.time() - t_sft
    log.info(f"pi_init stage 2 (answer-format SFT): {result.stage_seconds['sft']:.1f}s, {len(records)} D_sup pairs")
    return trained


def _save_pi_init(
    trained, tok, cfg: Config, out_dir: Path, work: Path, *, n_train: int, losses: list[tuple[int, float]]
) -> None:
    """Save pi_init to ``out_dir`` whole or not at all (written beside it, then moved in), with abpo_sft.json; the
    trainer's work directory is removed first."""
    shutil.rmtree(work, ignore_errors=True)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_policy(trained, tok, tmp)
    (tmp / "abpo_sft.json").write_text(
        json.dumps({"config": cfg.name, "seed": cfg.seed, "n_train": n_train, "losses": losses}, indent=1)
    )
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.replace(out_dir)


def _evaluate_pi_init(trained, tok, ds, splits, titles, cfg: Config, result: SFTResult) -> None:
    """pi_init on the held-out targets (HR@K with the one-sided binomial test against the random K/M); the metrics
    replace ``result.metrics``."""
    from abpo.policy.evaluate import evaluate_policy

    ev = seeded_subsample(build_eval_examples(splits, ds, cfg.data), cfg.sft.eval_max_users, cfg.seed)
    res = evaluate_policy(
        trained,
        tok,
        ev,
        titles,
        cfg.policy,
        popularity=training_popularity(splits, ds),
        generation=cfg.sft.eval_generation,
        progress="evaluate pi_init",
    )
    result.metrics = dict(res.metrics)
    result.metrics["n_users"] = float(res.n_users)
    for k in (1, 5):
        if f"HR@{k}" in res.metrics:  # one-sided binomial test of HR@k > K/M
            result.metrics[f"HR@{k}_p_value"] = res.p_value(k)
    for line in res.lines():
        log.info(f"pi_init held-out: {line}")


def _log_and_register(
    run,
    cfg: Config,
    params: dict[str, Any],
    result: SFTResult,
    losses: list[tuple[int, float]],
    work: Path,
    out_dir: Path,
    *,
    register: bool,
) -> None:
    """Log the run's parameters, metrics, stage seconds, loss curve and model to MLflow; with ``register``, register
    the model as pi_init (:func:`register_pi_init`). ``result`` gets the run id and the model version."""
    registry.log_params({k: str(v)[:500] for k, v in params.items()})
    if result.metrics:
        registry.log_metrics({k.replace("@", "_at_"): v for k, v in result.metrics.items()})
    registry.log_metrics({f"stage_seconds_{k}": v for k, v in result.stage_seconds.items()})
    if losses:
        png = _loss_png(losses, Path(work.parent / "sft_loss.png"))
        registry.log_artifact(png)
        png.unlink()
    uri = registry.log_model_dir(out_dir, policy_cfg=cfg.policy)
    result.mlflow_run_id = run.info.run_id
    if register:
        mv, first = register_pi_init(
            cfg, uri, {"role": "pi_init", "config": cfg.name, "seed": cfg.seed, "run_id": run.info.run_id}
        )
        result.model_version = str(mv.version)
        aliases = f"{registry.CHAMPION}, {PI_INIT_ALIAS}" if first else PI_INIT_ALIAS
        log.info(
            f"sft: registered {registry.model_name(cfg)} version {mv.version} "
            f"(aliases {aliases}); MLflow run {run.info.run_id}"
        )
