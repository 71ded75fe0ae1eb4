"""The ABPO update (docs/ABPO_SPEC.md "The update") on top of trl.GRPOTrainer.

- ``abpo.train.trainer``: ``ABPOTrainer`` (advantages of variants B-F); its parts: ``abpo.train.records``
  (``ABPOSettings``, the gathered ``RolloutRecord``), ``abpo.train.rewards`` (the TRL reward functions),
  ``abpo.train.rollouts`` (generation, constrained rollouts), ``abpo.train.advantages`` (e_old, r_sc, the
  advantages), ``abpo.train.diagnostics`` (the per-step diagnostics), ``abpo.train.callbacks``
  (``MLflowStepCallback``, ``StopAfterStepCallback``).
- ``abpo.train.dataset``: D_bandit (warehouse strata) -> trainer rows in stratified batch order.
- ``abpo.train.update``: ``run_update(cfg, UpdateRun(...))`` (the `abpo update` job), ``train_update``,
  ``save_update``; its parts: ``abpo.train.runs`` (``UpdateRun``, ``UpdateResult``), ``abpo.train.grpo_args``
  (``grpo_config`` / ``grpo_kwargs`` / ``settings_for``), ``abpo.train.strata`` (D_bandit from the warehouse).
- the `update` config section is ``abpo.config.update``.
"""
