"""The logging-policy contract is as strict at ingest as at the update (issue 48, item 6): a row an LLM arm logged
with softmax(tau=X), X other than policy.tau, was clean at ingest and GX, then failed the arm's whole update
(UpdateDataError, no retry) when the sample picked it; it is now quarantined at ingest (logging_tau_mismatch), and the
rows the update accepts (policy.tau itself, a ranker's softmax(score/T, T=X) <ranker>) stay clean."""

from __future__ import annotations

from tests.landed_impressions import MONTH, clean_table, land, with_row


def test_an_llm_row_logged_with_another_tau_is_quarantined_at_ingest(abpo, state):
    t = clean_table(50)
    t = with_row(t, 3, logging_policy="softmax(tau=7.5)")
    t = with_row(t, 4, logging_policy="softmax(tau=1.0000000001)")  # the update's own tolerance: the same tau
    t = with_row(t, 5, logging_policy="softmax(score/T, T=7.5) popularity")  # a ranker's rule: any T
    t = with_row(t, 6, logging_policy="softmax(tau=1e0)")
    land(state, t)
    rc, out, err = abpo("ingest", "--month", MONTH, "--no-validate")
    assert rc == 0, err
    import duckdb

    with duckdb.connect(str(state / "warehouse.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT impression_id, rule, detail FROM quarantine").fetchall()
        clean = {r[0] for r in con.execute("SELECT impression_id FROM impressions").fetchall()}
    ids = t.column("impression_id").to_pylist()
    assert [(r[0], r[1]) for r in rows] == [(ids[3], "logging_tau_mismatch")], rows
    assert "logging_policy softmax(tau=7.5) but policy.tau = 1.0" in rows[0][2], rows
    assert {ids[4], ids[5], ids[6]} <= clean


def test_the_rule_follows_policy_tau(abpo, state):
    t = with_row(clean_table(20), 0, logging_policy="softmax(tau=7.5)")
    land(state, t)
    rc, out, err = abpo("ingest", "--month", MONTH, "--no-validate", "--set", "policy.tau=7.5")
    assert rc == 1 and "19 of 20 landed rows (95.0%) broke the contract (rules fired: logging_tau_mismatch 19)" in err
    assert not (state / "warehouse.duckdb").exists() or "nothing was published" in err
