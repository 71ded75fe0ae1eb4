"""The arms of the production loop: what serves each user group, refreshed every month.

    names.py     the registry from an arm's name to its class and kind (dependency-free: the DAG and the UI plugin
                 import it)
    base.py      the interface (Arm: propensities, expose, refresh, save / load, log_model, temperature)
    llm.py       LLMArm(variant): ``abpo`` (variant F) and ``grpo`` (variant B), updated monthly on every arm's logs
                 (arms.update_logs = all) or their own (own); exposure softmax(s_p / tau) over C (docs/ABPO_SPEC.md
                 Eq. e_p); HoldbackArm: ``holdback``, pi_init served the same way, never updated or promoted
    rankers.py   RankerArm(ranker): ``ml_retrain`` (implicit's ALS) and ``popularity`` (log(1 + count) over a rolling
                 window), refitted monthly on the interactions and clicks to date; exposure softmax(score / T)
    versions.py  one registered MLflow model per arm, champion / challenger aliases, lineage, promotion lock
    status.py    where each arm stands (``abpo arms status``): its aliases' versions, a champion gone missing
    serving.py   the MLflow pyfunc loader of a registered ranker version

LLM arms expose by sampling e_p(.|q) with the same shared-prefix scorer and tau the update uses for e_old, so the
logged propensity of month m is exactly e_old of month m+1's update. How each month refreshes an arm: abpo.monthly.

This package's own module imports nothing heavy: ``abpo.arms.names`` is cheap to import.
"""

from abpo.arms.names import HOLDBACK_ARMS, LLM_ARMS, RANKER_ARMS, check_arm

__all__ = ["HOLDBACK_ARMS", "LLM_ARMS", "RANKER_ARMS", "check_arm"]
