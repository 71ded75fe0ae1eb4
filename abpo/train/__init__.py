"""The ABPO update (docs/ABPO_SPEC.md "The update") on top of trl.GRPOTrainer.

- ``abpo.train.trainer``: ``ABPOTrainer`` (advantages of variants B-F), its reward functions, ``ABPOSettings``,
  ``MLflowStepCallback``.
- ``abpo.train.dataset``: D_bandit (warehouse strata) -> trainer rows in stratified batch order.
- ``abpo.train.update``: ``run_update(cfg, UpdateRun(...))`` (the `abpo update` job), ``grpo_config`` / ``grpo_kwargs``,
  ``train_update``, ``save_update``.
- ``abpo.train.config``: the `update` config section.
"""
