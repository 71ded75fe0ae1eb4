"""The sizes the tests share, each written once: ``key=value`` override lists for ``load_config`` (and ``--set`` or a
DAG run's ``overrides``) that shrink the ``tiny`` preset's month, model and DAG run to what 2 shared CPU cores run in
seconds to minutes. A test composes its config from these and adds what it is about after them, e.g.
``load_config("tiny", [f"paths.root={tmp_path}", *CYCLE_MONTH, *GATE_PASSES])``.

Compose by appending, so that a list's order stays put where it is recorded (the experiment's cells and
``abpo loop-experiment`` keep their overrides); :func:`without` drops a key where a test leaves the preset's value.
"""

from __future__ import annotations


def without(sizes: list[str], *keys: str) -> list[str]:
    """``sizes`` less the overrides of ``keys`` (a test that leaves those keys at the preset's value), in order."""
    return [s for s in sizes if s.split("=", 1)[0] not in keys]


# ------------------------------------------------------------------------------------------------------ months

SIXTY_USERS = ["data.max_users=60", "data.update_steps=6"]
"""60 users of the bundled MovieLens with 6 update positions each: the simulator's tests, and the base of
:data:`MONTH`."""

MONTH = [
    *SIXTY_USERS,
    "sft.max_steps=20",
    "sft.pretrain_epochs=2",  # stage 1 at 2 epochs (preset: up to 20): a bootstrap's largest part
    "sft.eval_max_users=20",
    "data.eval_candidates=20",
    "update.max_steps=2",
    "update.batch_size=8",
    "update.save_steps=100",
    "arms.min_rows_per_stratum=1",
]
"""A month of the whole loop on the ``tiny`` preset, shrunk: 60 users, pi_init by a short SFT, 2 update steps of
8 rows per LLM arm, strata of a single row allowed. The base of the month lists of this section."""

LIKELY_CLICKS = ["sim.click_next=1.0", "sim.base_ctr=0.2"]
"""Clicks likely enough that a 40- to 60-user month gives every LLM arm both strata (with the default click model
an arm serving ~20 rows once got none, and its update group was skipped, not failed)."""

GATE_PASSES = [
    "arms.gate_margin=1.0",
    "arms.gate_ope_margin=1.0",
    "arms.gate_min_ess=0",
    "arms.gate_primary=offline",
    "arms.gate_ope_rows=all",
]
"""A gate every challenger passes (margin 1: any lower bound of the paired difference clears it): the month promotes,
so the next month starts from another champion. Both halves decide and the off-policy one reads every row, so a
shrunken month's few held-out users cannot fail it closed, and no user is held out of the updates. The gate's own
verdicts are tested in tests/arms/test_gate* and tests/monthly/test_gate*."""

CYCLE_MONTH = [*MONTH, *LIKELY_CLICKS, "arms.update_logs=own"]
"""The shrunken month of tests/arms/test_cycle.py: the LLM arms update from their own logs (all traffic and the
holdback: :data:`HOLDBACK_ARMS`)."""

RERUN_MONTH = [
    *without(CYCLE_MONTH, "sft.max_steps"),  # the champion is adopted: no SFT
    "arms.names=abpo,popularity",
    "report.arm_shares={abpo: 0.5, popularity: 0.5}",
    "report.candidate_arm=abpo",
    "arms.gate_max_users=20",
    "arms.gate_ope_bootstrap=200",
    *GATE_PASSES,
]
"""The smallest month that promotes: :data:`CYCLE_MONTH` with two arms and a gate every challenger passes, so that a
rerun of the month would start from another champion than the month did (tests/monthly/test_month_idempotence.py
in one process, tests/dags/test_month_rerun_e2e.py through Airflow)."""

FIVE_ARMS = ["abpo", "grpo", "ml_retrain", "popularity", "holdback"]
"""The two LLM arms, the two rankers and the holdback."""

HOLDBACK_ARMS = [
    f"arms.names=[{', '.join(FIVE_ARMS)}]",
    f"data.known_arms=[{', '.join(FIVE_ARMS)}]",
    "report.arm_shares={abpo: 0.3, grpo: 0.3, holdback: 0.2, ml_retrain: 0.1, popularity: 0.1}",
]
"""Every arm of :data:`FIVE_ARMS` served, the holdback with a fifth of the traffic."""

# ------------------------------------------------------------------------------------------------------ models

TINY_MODEL = [
    "policy.tiny_hidden_size=32",
    "policy.tiny_layers=1",
    "policy.tiny_heads=2",
    "policy.tiny_intermediate_size=64",
    "policy.tiny_vocab_size=600",
    "update.max_completion_length=100",
]
"""A very small ``tiny`` model (1 layer, 32 wide, a 600-token vocabulary; the preset's is 2 layers, 64 wide, 4,096
tokens): for tests that build, adopt, register, serve or gate a model rather than train it to a quality. In its
smaller vocabulary the bundled catalog's longest answer + EOS takes 98 tokens (the preset's 63), so its rollouts
may take 100: pi_init's SFT and `abpo arms adopt` refuse a limit the catalog does not fit (constrained rollouts stop
at EOS, so the cap costs nothing)."""

TRAINER_MODEL = {
    "model": "tiny",
    "tiny_hidden_size": 32,
    "tiny_layers": 2,
    "tiny_heads": 2,
    "tiny_intermediate_size": 64,
    "scoring_batch_tokens": 4096,
}
"""PolicyConfig keywords of the 2-layer tiny model the policy and trainer tests build once per session
(tests/policy/conftest.py, tests/train/conftest.py, through tests/conftest.py's build_tiny_model); each adds its
vocabulary, prompt budget and LoRA setting."""

ADOPTED_MONTH = ["data.max_users=40", "data.eval_candidates=20", *TINY_MODEL]
"""40 users and :data:`TINY_MODEL`: the tests that adopt a model as an arm's champion and serve it through MLflow."""

# ------------------------------------------------------------------------------------------------------ experiments

EXPERIMENT_MODEL = without(TINY_MODEL, "policy.tiny_layers", "policy.tiny_heads")
"""The experiment tests' model: :data:`TINY_MODEL` with the preset's 2 layers and 4 heads."""

EXPERIMENT_TWO_ROUNDS = [
    "data.eval_candidates=20",
    "experiment.eval_candidates=0",
    "experiment.update_steps=4",
    "experiment.rounds=2",
    *EXPERIMENT_MODEL,
]
"""An experiment (abpo.experiment) of two rounds on 4 update positions per user, evaluated on the month's own
candidates, with :data:`EXPERIMENT_MODEL`: tests/experiment/test_regimes.py and test_runner.py."""

EXPERIMENT_TRAINING = [
    "sft.max_steps=6",
    "update.max_steps=2",
    "update.batch_size=4",
    "update.save_steps=100",
    "update.max_completion_length=128",
]
"""An experiment cell's training, shrunk: 6 SFT steps for pi_init, 2 update steps of 4 rows."""

# ------------------------------------------------------------------------------------------------------ updates

TINY_UPDATE = [
    "update.max_steps=2",
    "update.batch_size=2",
    "update.group_size=3",
    "update.max_completion_length=64",
    "update.save_steps=1",
    "update.max_examples=12",
    "policy.lora_r=4",
]
"""`abpo update` on the trainer tests' tiny model (tests/train/conftest.py): 2 steps of 2 prompts x 3 completions of
at most 64 tokens, at most 12 logged rows, a LoRA adapter of rank 4, a checkpoint every step."""

SASREC_RANKER_MONTH = [
    *SIXTY_USERS,
    "data.eval_candidates=20",
    "arms.names=ml_retrain,popularity",
    "report.arm_shares={ml_retrain: 0.5, popularity: 0.5}",
    "report.candidate_arm=ml_retrain",  # a served arm (abpo is not)
    "arms.ml_retrain.kind=sasrec",
    "sasrec.hidden_size=16",
    "sasrec.max_length=16",
    "sasrec.epochs=3",
    "sasrec.refit_epochs=1",
]
"""A month of the ranker arms only (no LLM: no SFT, no update) with the ML-retrain arm's SASRec-CE shrunk: a bootstrap
fit of at most 3 epochs, a warm-started refit of 1 (tests/arms/test_ml_retrain_sasrec.py in process,
tests/dags/test_ml_retrain_sasrec_dag.py through the DAG)."""

# ------------------------------------------------------------------------------------------------------ DAG runs

DAG_MONTH = [
    "data.max_users=40",
    "sft.max_steps=10",
    "sft.pretrain_epochs=2",  # stage 1 at 2 epochs (preset: up to 20): a bootstrap's largest part
    "policy.num_threads=1",  # the demo preset's 2 threads are several times slower beside another test process
    "sft.eval_max_users=15",
    "data.eval_candidates=20",
    "update.max_steps=2",
    "update.batch_size=8",
    "update.save_steps=100",
    "arms.min_rows_per_stratum=1",
]
"""A month run by the real Airflow services (tests/dags/airflow_services.py), smaller than :data:`MONTH`; every key is
one a triggered run may override (abpo.monthly.overrides). tests/dags/test_abpo_monthly_e2e.py runs the demo at these
sizes with the demo's own clicks."""

DAG_MONTH_CLICKS = [*DAG_MONTH, "arms.gate_ope_bootstrap=200", *LIKELY_CLICKS]
""":data:`DAG_MONTH` with :data:`LIKELY_CLICKS` (a 40-user month; the grpo arm serves ~20 rows) and a smaller
off-policy bootstrap: the scheduler, Celery and fault tests' DAG runs."""
