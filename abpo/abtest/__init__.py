"""The online A/B report (docs/ABPO_SPEC.md "Metrics / Online").

- :mod:`abpo.abtest.stats`: the tests on counts (pooled two-proportion z-test, Wilson and Wald
  intervals, delta-method user-clustered z-test, Holm, sample-ratio-mismatch chi-square).
- :mod:`abpo.abtest.analysis`: counts per arm and month -> :class:`~abpo.abtest.analysis.Report`.
- :mod:`abpo.abtest.inputs`: counts from the warehouse (sql/report_user_moments.sql over the per-user
  aggregate user_month_stats kept at ingest)
  or from a CSV; the ``--months`` spec.
- :mod:`abpo.abtest.render`: Markdown, self-contained HTML, PNG, JSON.
- :mod:`abpo.abtest.report`: the step itself (``report_from_warehouse``, ``report_from_csv``) and its
  MLflow logging; :mod:`abpo.commands.report`: ``abpo report``.
"""
