"""SFT of pi_init on a tiny slice (loss goes down, MLflow run + registered version) and the synthetic D_bandit
(impressions contract, y = 1 iff a_log = x_{t'+1}, stored propensity = e0(a_log), ingestible)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch


@pytest.mark.slow
def test_sft_lowers_loss_logs_and_registers(slice_cfg, movielens):
    import mlflow

    from abpo import registry
    from abpo.policy.sft import PI_INIT_ALIAS, train_sft

    torch.set_num_threads(1)
    res = train_sft(slice_cfg, validation_fraction=slice_cfg.experiment.validation_fraction, dataset=movielens)
    steps = [s for s, _ in res.losses]
    assert steps[0] == 1 and steps[-1] == 12
    first, last = res.losses[0][1], res.losses[-1][1]
    assert last < first - 0.5, res.losses  # the answer NLL goes down
    assert (res.model_dir / "config.json").exists() and (res.model_dir / "tokenizer.json").exists()
    # MLflow: the run holds the loss curve, params and metrics; the model is version 1 with the two aliases
    assert res.model_version == "1"
    run = mlflow.get_run(res.mlflow_run_id)
    assert run.data.params["sft.max_steps"] == "12"
    assert "HR_at_5" in run.data.metrics and "random_HR_at_5" in run.data.metrics
    hist = mlflow.MlflowClient().get_metric_history(res.mlflow_run_id, "train_loss")
    assert len(hist) == len(res.losses)
    assert str(registry.get_version(PI_INIT_ALIAS).version) == "1"
    assert str(registry.get_version(registry.CHAMPION).version) == "1"
    assert res.metrics["random_HR@5"] == pytest.approx(0.5)
    assert 0.0 <= res.metrics["gen_well_formed"] <= 1.0


def test_sft_records_mask_only_the_answer(tiny_tokenizer, small_titles, small_policy_cfg):
    from abpo.data.candidates import Example
    from abpo.policy.prompt import encode_answer, format_answer
    from abpo.policy.sft import sft_records

    ids = list(small_titles)
    ex = Example("1:3", 1, ids[:3], ids[3:8], ids[5])
    (rec,) = sft_records([ex], small_titles, tiny_tokenizer, small_policy_cfg)
    answer = encode_answer(tiny_tokenizer, format_answer(ids[5], small_titles[ids[5]])) + [tiny_tokenizer.eos_token_id]
    n = sum(rec["completion_mask"])
    assert n == len(answer) and rec["input_ids"][-n:] == answer
    assert rec["completion_mask"] == [0] * (len(rec["input_ids"]) - n) + [1] * n


def test_bandit_log_contract_and_ingest(slice_cfg, movielens, tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from abpo.data.candidates import build_bandit_requests
    from abpo.data.schemas import IMPRESSIONS_SCHEMA
    from abpo.data.splits import split_users
    from abpo.policy.bandit import build_bandit_log
    from abpo.policy.prompt import example_prompt
    from abpo.policy.scoring import candidate_answers, candidate_propensities, score_candidates

    torch.set_num_threads(1)
    # the model: the session's tiny model (its tokenizer covers any text: byte-level BPE)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    slice_cfg.policy.tau = 0.05  # sharp e0, so propensities are far from uniform
    slice_cfg.policy.prompt_style = "text"  # the session's model has item tokens for 400 titles only
    table = build_bandit_log(
        slice_cfg, month="2024-02", model=model, tokenizer=tok, dataset=movielens, model_version="7", progress=False
    )
    assert table.schema.equals(IMPRESSIONS_SCHEMA)
    splits, _ = split_users(movielens, slice_cfg.data)
    reqs = build_bandit_requests(splits, movielens, slice_cfg.data)
    assert table.num_rows == len(reqs) == 12 * 2
    rows = table.to_pylist()
    for r, ex in zip(rows, reqs, strict=True):
        assert r["candidates"] == ex.candidates and r["history"] == ex.history
        assert r["item_id"] in r["candidates"] and 0 < r["propensity"] <= 1
        assert r["clicked"] == int(r["item_id"] == ex.positive)  # y = 1 iff a_log = x_{t'+1}
        assert r["arm"] == "abpo" and r["model_version"] == "7" and r["event_time"].strftime("%Y-%m") == "2024-02"
    assert len({r["impression_id"] for r in rows}) == len(rows)
    # the stored propensity is e0(a_log|q) of this model over C
    ex, r = reqs[0], rows[0]
    s = score_candidates(
        model,
        tok,
        example_prompt(ex, movielens.titles(), tok, slice_cfg.policy).text,
        candidate_answers(ex.candidates, movielens.titles()),
        batch_tokens=8192,
    )
    e0 = candidate_propensities(s, 0.05)
    assert r["propensity"] == pytest.approx(float(e0[ex.candidates.index(r["item_id"])]), rel=1e-5)
    assert np.std([r["propensity"] for r in rows]) > 0.01
    # landed once under the month; a rerun replaces the same part (same rows)
    files = sorted((slice_cfg.paths.resolve("landing") / "impressions" / "month=2024-02").glob("part-*.parquet"))
    assert len(files) == 1
    again = build_bandit_log(
        slice_cfg, month="2024-02", model=model, tokenizer=tok, dataset=movielens, model_version="7", progress=False
    )
    assert again.equals(table)
    assert len(list(files[0].parent.glob("part-*.parquet"))) == 1
    assert pq.read_table(files[0]).to_pylist() == rows  # (nullability flags aside) what was landed
    # the warehouse's ingest path reads it without quarantining anything
    from abpo.warehouse import Warehouse

    wh = Warehouse(tmp_path / "wh.duckdb")
    rep = wh.ingest_month(slice_cfg.paths.resolve("landing"), "2024-02", known_arms=["abpo"])
    ctr = wh.ctr_by_arm_month(["2024-02"]).to_pylist()
    assert ctr[0]["impressions"] == 24 and ctr[0]["clicks"] == sum(r["clicked"] for r in rows), rep


def test_completion_loss_equals_full_logits_nll(tiny_model, tiny_tokenizer, small_titles, small_policy_cfg, tmp_path):
    """The SFT loss (only completion positions projected through the LM head) is the answer NLL computed from the
    full logits."""
    from datasets import Dataset
    from trl import SFTConfig

    from abpo.data.candidates import Example
    from abpo.policy.sft import _completion_sft_trainer_class, sft_records

    torch.set_num_threads(1)
    ids = list(small_titles)
    exs = [Example(f"1:{t}", 1, ids[:t], ids[t : t + 6], ids[t + 2]) for t in (3, 5, 9)]
    recs = sft_records(exs, small_titles, tiny_tokenizer, small_policy_cfg)
    args = SFTConfig(
        output_dir=str(tmp_path),
        report_to="none",
        completion_only_loss=True,
        max_length=None,
        bf16=False,
        per_device_train_batch_size=3,
    )
    trainer = _completion_sft_trainer_class()(
        model=tiny_model, args=args, train_dataset=Dataset.from_list(recs), processing_class=tiny_tokenizer
    )
    batch = trainer.data_collator(trainer.train_dataset.to_list())
    loss = trainer.compute_loss(trainer.model, dict(batch))
    with torch.no_grad():
        logits = tiny_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    ref = torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100
    )
    assert float(loss) == pytest.approx(float(ref), abs=1e-5)
    mode = "train" if trainer.model.training else "eval"
    assert trainer._metrics[mode]["mean_token_accuracy"]  # TRL's metrics still logged
