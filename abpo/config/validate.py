"""The rules that relate config keys, checked once by :func:`validate` when :func:`abpo.config.load_config` has
applied the preset, the environment and every override: a combination that cannot run is refused before any step
starts, with one line naming each key involved and the rule (a ConfigError). A rule about one field alone is that
field's metadata (abpo.config.values)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from abpo.config.errors import ConfigError
from abpo.config.report import HOLDBACK_ARM
from abpo.config.sim import ORACLE_COMPONENTS
from abpo.data.storage import is_uri
from abpo.paths import namespaced
from abpo.redact import has_userinfo, redact

if TYPE_CHECKING:
    from abpo.config import Config
    from abpo.config.experiment import ExperimentConfig


# the config's object-store URIs: read through abpo.data.storage with credentials from the environment only
CREDENTIAL_FREE_FIELDS = ("paths.landing", "paths.mlflow_artifacts", "data.dataset_dir")


def check_no_credentials(cfg: Config) -> None:
    """ConfigError for an object-store URI setting (:data:`CREDENTIAL_FREE_FIELDS`) that carries credentials
    (``s3://KEY:SECRET@bucket/x``, ``?secret_key=...``): credentials never come from the config, which is copied,
    committed and printed (`abpo config`); they come from the environment or $ABPO_STORAGE_CONNECTION."""
    for dotted in CREDENTIAL_FREE_FIELDS:
        section, key = dotted.split(".")
        value = str(getattr(getattr(cfg, section), key, "") or "")
        if is_uri(value) and has_userinfo(value):
            raise ConfigError(
                f"config {dotted} = {redact(value)!r}: rule: credentials never come from the config (no "
                "user:password@ or secret query parameter in an object-store URI); set AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the instance role, or $ABPO_STORAGE_CONNECTION "
                "(docs/scaling.md)"
            )


def check_rounds_fit(e: ExperimentConfig, data_update_steps: int) -> None:
    """The experiment's R rounds split each user's update positions into R windows (abpo.experiment.seeds
    .round_positions), so R may not exceed them: ``experiment.update_steps`` when set, else ``data.update_steps``.
    A ConfigError naming both keys and the rule otherwise (:func:`validate` at load, and the experiment's config,
    abpo.experiment.rows.experiment_config, once it applied ``experiment.update_steps``)."""
    steps = e.update_steps or data_update_steps
    if e.rounds > steps:
        applied = f" (experiment.update_steps={e.update_steps} applied)" if e.update_steps else ""
        raise ConfigError(
            f"experiment.rounds={e.rounds} > data.update_steps={steps}{applied}; rule: every round needs at least one "
            "update position per user"
        )


def check_arms_known(cfg: Config) -> None:
    """Every arm served (``arms.names``) is one the warehouse accepts (``data.known_arms``): the ingest quarantines
    the impressions of any other arm as unknown_arm, which refuses the month mid-DAG."""
    unknown = [a for a in cfg.arms.names if a not in cfg.data.known_arms]
    if unknown:
        raise ConfigError(
            f"config arms.names {unknown} not in data.known_arms {list(cfg.data.known_arms)}: rule: every served arm "
            "is one the warehouse accepts (else the ingest quarantines its impressions as unknown_arm)"
        )


def check_report_arms(cfg: Config) -> None:
    """The report's arms are served arms: ``report.candidate_arm`` one of ``arms.names``; ``report.holdback_arm`` one
    of them too, or abpo's holdback arm (:data:`~abpo.config.report.HOLDBACK_ARM`) when the config does not serve it,
    or empty (no holdback table). A misspelt arm would give a report without its comparisons, and the name is printed
    in every report."""
    served = list(cfg.arms.names)
    r = cfg.report
    if r.candidate_arm not in served:
        raise ConfigError(
            f"config report.candidate_arm = {r.candidate_arm!r} not in arms.names {served}: rule: the report compares "
            "a served arm with every other one (for abpo report --csv, arms.names and data.known_arms name the file's "
            "arms)"
        )
    if r.holdback_arm not in (*served, HOLDBACK_ARM, ""):
        raise ConfigError(
            f"config report.holdback_arm = {r.holdback_arm!r} not in arms.names {served}: rule: a served arm, "
            f"{HOLDBACK_ARM!r} (abpo's holdback arm, not served: no holdback table) or empty (none)"
        )


def check_served_keys(cfg: Config, key: str, by_arm: dict, rule: str) -> None:
    """A per-arm mapping ``key`` names only arms of ``arms.names``: an unserved arm's entry would be silently unused."""
    unknown = [a for a in by_arm if a not in cfg.arms.names]
    if unknown:
        raise ConfigError(f"config {key} names {unknown}, not in arms.names {list(cfg.arms.names)}: rule: {rule}")


def check_update_rows_by_arm(cfg: Config) -> None:
    """``arms.update_max_examples_by_arm`` sizes arms that are served (``arms.names``), each with a rows cap >= 0: a
    key of an arm that is not served would be a size silently unused. (That each is an LLM arm is checked by the
    update step, abpo.monthly.update, which knows the arms' kinds.)"""
    by_arm = cfg.arms.update_max_examples_by_arm
    check_served_keys(cfg, "arms.update_max_examples_by_arm", by_arm, "only a served arm's update is sized")
    bad = {a: n for a, n in by_arm.items() if n < 0}  # integers: the loader refuses any other value type
    if bad:
        raise ConfigError(f"config arms.update_max_examples_by_arm {bad}: rule: each value an integer >= 0 (rows)")


def check_update_by_arm(cfg: Config) -> None:
    """``arms.update_by_arm``: each key a served arm, each entry's keys among the budget keys
    (abpo.config.arms.UPDATE_BUDGET_KEYS), each value checked against the update key of that name (type, range,
    choices) as a ``--set update.<key>`` would be: an entry that could not train is refused at load, not in month 2."""
    import dataclasses
    import typing

    from abpo.config.arms import UPDATE_BUDGET_KEYS
    from abpo.config.update import UpdateConfig
    from abpo.config.values import _coerce

    by_arm = cfg.arms.update_by_arm
    check_served_keys(cfg, "arms.update_by_arm", by_arm, "only a served arm's update has a budget")
    fields = {f.name: f for f in dataclasses.fields(UpdateConfig)}
    hints = typing.get_type_hints(UpdateConfig)
    for arm, entry in by_arm.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"config arms.update_by_arm.{arm} = {entry!r}: rule: a mapping of update keys")
        bad = sorted(set(entry) - set(UPDATE_BUDGET_KEYS))
        if bad:
            raise ConfigError(
                f"config arms.update_by_arm.{arm}: key(s) {bad}; rule: one of {list(UPDATE_BUDGET_KEYS)} (rows: "
                "arms.update_max_examples_by_arm)"
            )
        for k, v in entry.items():
            entry[k] = _coerce(
                v,
                hints[k],
                f"arms.update_by_arm.{arm}.{k}",
                fields[k].metadata,
                f"arms.update_by_arm.{arm}.{k}",
                "config",
            )


def check_sim_windows(cfg: Config) -> None:
    """The simulator's months (abpo.sim.simulator): a month is one window of each user's update positions, so
    ``sim.window`` fits in ``data.update_steps``; the offline candidate construction has one candidate set per position,
    so ``sim.candidates = offline`` serves ``sim.window`` requests per user and month."""
    w, k = cfg.sim.window, cfg.sim.requests_per_user
    if cfg.data.update_steps // w < 1:
        raise ConfigError(
            f"config data.update_steps = {cfg.data.update_steps}, sim.window = {w}: rule: "
            "data.update_steps // sim.window >= 1 (a month needs one window of update positions)"
        )
    if cfg.sim.candidates == "offline" and k != w:
        raise ConfigError(
            f"config sim.requests_per_user = {k} with sim.candidates = offline: rule: equal to "
            f"sim.window = {w} (the offline construction has one candidate set per position)"
        )


def check_sim_draws(cfg: Config) -> None:
    """The retrieval stage's candidate mix (abpo.sim.retrieval.mix_counts) and the mixture oracle's weights
    (abpo.sim.preference.oracle_weights)."""
    s = cfg.sim
    if s.retrieval_fraction + s.popular_fraction > 1 + 1e-9:
        raise ConfigError(
            f"config sim.retrieval_fraction = {s.retrieval_fraction}, sim.popular_fraction = {s.popular_fraction}: "
            "rule: their sum <= 1 (the rest of the candidates are uniform draws)"
        )
    if s.oracle == "mixture":
        unknown = sorted(set(s.oracle_weights) - set(ORACLE_COMPONENTS))
        if unknown:
            raise ConfigError(
                f"config sim.oracle_weights.{unknown[0]} with sim.oracle = mixture: rule: the weights' keys are the "
                f"mixture's components {list(ORACLE_COMPONENTS)}"
            )
        if not sum(s.oracle_weights.values()) > 0:
            raise ConfigError(
                f"config sim.oracle_weights = {dict(s.oracle_weights)} with sim.oracle = mixture: rule: the weights "
                "sum to > 0"
            )


def check_model_shape(cfg: Config) -> None:
    """The tiny model's attention heads split its hidden size (abpo.policy.model builds it with policy.tiny_*); so do
    SASRec's (abpo.baselines.sasrec, section ``sasrec``)."""
    p = cfg.policy
    if p.model == "tiny" and p.tiny_hidden_size % p.tiny_heads:
        raise ConfigError(
            f"config policy.tiny_hidden_size = {p.tiny_hidden_size}, policy.tiny_heads = {p.tiny_heads} "
            "(policy.model = tiny): rule: the hidden size is divisible by the heads"
        )
    if cfg.sasrec.hidden_size % cfg.sasrec.heads:
        raise ConfigError(
            f"config sasrec.hidden_size = {cfg.sasrec.hidden_size}, sasrec.heads = {cfg.sasrec.heads}: rule: the "
            "hidden size is divisible by the heads (abpo.baselines.sasrec)"
        )


def check_update_launch(cfg: Config) -> None:
    """The update's rollouts and processes: constrained rollouts run through HF generate, not vLLM
    (abpo.train.trainer); the batch is split over ``update.processes`` (abpo.train.distributed.check_launch)."""
    u = cfg.update
    if cfg.policy.constrained_rollouts and u.use_vllm:
        raise ConfigError(
            "config policy.constrained_rollouts = true with update.use_vllm = true: rule: constrained rollouts run "
            "through HF generate (the vLLM path samples freely, as the paper does); turn one of them off"
        )
    if u.batch_size % u.processes:
        raise ConfigError(
            f"config update.batch_size = {u.batch_size}, update.processes = {u.processes}: rule: the batch (logged "
            "examples per micro-batch over all processes) is divisible by the process count"
        )


def validate(cfg: Config) -> None:
    """Every rule that relates config keys, checked once, when :func:`abpo.config.load_config` has applied the preset,
    the environment and every override: a combination that cannot run is refused before any step starts, with one
    line naming each key involved and the rule (a ConfigError). The rules, in the order checked:

    - ``paths.namespace`` a name MLflow and Airflow names can carry (abpo.paths.namespaced);
    - no credentials in an object-store URI setting (:func:`check_no_credentials`);
    - ``experiment.rounds`` at most the update positions per user (``experiment.update_steps`` when set, else
      ``data.update_steps``): :func:`check_rounds_fit`;
    - every arm of ``arms.names`` in ``data.known_arms`` (:func:`check_arms_known`);
    - ``report.candidate_arm`` in ``arms.names``; ``report.holdback_arm`` in them, the unserved holdback arm or empty
      (:func:`check_report_arms`);
    - ``arms.update_max_examples_by_arm`` keyed by arms of ``arms.names``, values >= 0 (:func:`check_update_rows_by_arm`);
    - ``arms.update_by_arm`` keyed by arms of ``arms.names``, budget keys checked as the update's (:func:`check_update_by_arm`);
    - ``sim.window`` fits in ``data.update_steps``; ``sim.candidates = offline`` needs ``sim.requests_per_user``
      equal to ``sim.window`` (:func:`check_sim_windows`);
    - ``sim.retrieval_fraction + sim.popular_fraction <= 1``; with ``sim.oracle = mixture``, ``sim.oracle_weights``
      over the mixture's components, summing to > 0 (:func:`check_sim_draws`);
    - with ``policy.model = tiny``, ``policy.tiny_hidden_size`` divisible by ``policy.tiny_heads``
      (:func:`check_model_shape`); ``sasrec.hidden_size`` divisible by ``sasrec.heads``;
    - not ``policy.constrained_rollouts`` with ``update.use_vllm``; ``update.batch_size`` divisible by
      ``update.processes`` (:func:`check_update_launch`).

    The rules that need more than the config stay where that is known: the shares of the arms the simulator routes
    (abpo.monthly.month.run_month: only when it serves), the keys a variant fixes (abpo.train.grpo_args
    .variant_update_config), sft.loss_tokens = choice with a text prompt (abpo.policy.sft: only when pi_init is
    trained; a model adopted with --set policy.prompt_style=text trains none), the process count a launch really has
    (abpo.train.distributed.check_launch) and the experiment's rows (abpo.experiment)."""
    try:
        namespaced("", cfg.paths.namespace)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_no_credentials(cfg)
    check_rounds_fit(cfg.experiment, cfg.data.update_steps)
    check_arms_known(cfg)
    check_report_arms(cfg)
    check_update_rows_by_arm(cfg)
    check_update_by_arm(cfg)
    check_sim_windows(cfg)
    check_sim_draws(cfg)
    check_model_shape(cfg)
    check_update_launch(cfg)
