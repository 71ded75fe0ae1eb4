"""`abpo arms adopt`: an existing Hugging Face model becomes an LLM arm's first champion without SFT, after a check
that it scores the loop's prompt format; a tokenizer without the answer format, without item tokens (item_tokens
style) or without a chat template is refused naming the file or field and the rule. Real MLflow, real tiny models
(built locally, tests/conftest.py build_tiny_model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests.sizes import ADOPTED_MONTH


def _cfg_and_model(make_cfg, build_tiny_model, *extra):
    from abpo.monthly.common import dataset_and_splits

    cfg = make_cfg(*ADOPTED_MONTH, *extra)
    ds, _ = dataset_and_splits(cfg)
    return cfg, ds, Path(build_tiny_model(cfg.policy, ds.titles()))


def _request(ds, n: int = 6):
    ids = sorted(ds.titles())[:n]
    hist = sorted(ds.titles())[100:110]
    titles = ds.titles()
    return pd.DataFrame(
        {
            "history_titles": [[titles[i] for i in hist]],
            "candidate_ids": [ids],
            "candidate_titles": [[titles[i] for i in ids]],
            "history_item_ids": [hist],
        }
    )


def test_adopt_makes_a_model_the_first_champion_without_sft(make_cfg, build_tiny_model, tmp_path, capsys):
    import mlflow
    from mlflow import MlflowClient

    from abpo.arms import versions as arm_versions
    from abpo.cli import main
    from abpo.monthly.adopt import ModelRefused, adopt_model

    cfg, ds, model = _cfg_and_model(make_cfg, build_tiny_model)
    sets = [x for s in [f"paths.root={tmp_path}", *ADOPTED_MONTH] for x in ("--set", s)]
    assert main(["arms", "adopt", "--arm", "abpo", "--model", str(model), *sets]) == 0
    assert f"abpo: {model} is champion v1 (checked on 4 held-out requests; no SFT)" in capsys.readouterr().out
    champ = arm_versions.get_version(cfg, "abpo", "champion")
    assert str(champ.version) == "1" and champ.tags["source"] == "adopt" and champ.tags["adopted_from"] == str(model)
    from abpo.arms import history  # the adoption is the first entry of the arm's promotion history

    assert [(e.action, e.from_version, e.to_version) for e in history.entries(cfg, "abpo")] == [("adopt", "", "1")]
    client = MlflowClient()
    assert client.search_registered_models("name='abpo-recommender'") == []  # no pi_init: nothing was trained
    assert client.get_experiment_by_name(cfg.sft.experiment) is None

    # the registered version serves on its own, and its signature lets tau through to the model
    served = mlflow.pyfunc.load_model("models:/abpo-arm-abpo@champion")
    sharp = served.predict(_request(ds), params={"tau": 0.1})
    flat = served.predict(_request(ds), params={"tau": 10.0})
    assert sharp["ranked_item_ids"][0] == flat["ranked_item_ids"][0]  # tau changes e_p, not the order
    assert max(sharp["propensities"][0]) > max(flat["propensities"][0])
    assert abs(sum(sharp["propensities"][0]) - 1) < 1e-6

    with pytest.raises(ModelRefused, match=r"champion is v1 already; rule: adopt gives an arm its first champion"):
        adopt_model(cfg, "abpo", str(model))
    with pytest.raises(ModelRefused, match=r"'popularity' is a ranker arm; rule: adopt takes an LLM arm"):
        adopt_model(cfg, "popularity", str(model))
    # a registered model is adopted by its models:/ URI (downloaded from the registry)
    out = adopt_model(cfg, "grpo", "models:/abpo-arm-abpo/1")
    assert out.version == "1" and str(arm_versions.get_version(cfg, "grpo", "champion").version) == "1"
    rc = main(["arms", "adopt", "--arm", "grpo", "--model", str(tmp_path / "nowhere"), *sets])
    assert rc == 2 and "champion is v1 already" in capsys.readouterr().err


def test_a_tokenizer_without_item_tokens_for_the_catalog_is_refused(make_cfg, build_tiny_model):
    from abpo.arms import versions as arm_versions
    from abpo.monthly.adopt import ModelRefused, adopt_model

    cfg = make_cfg(*ADOPTED_MONTH)
    other = build_tiny_model(cfg.policy, {i: f"Other film {i}" for i in range(1, 60)})  # another catalog's tokens
    with pytest.raises(
        ModelRefused,
        match=r"tokenizer.json: no item token for \d+ of \d+ catalog items .*rule: "
        r"policy.prompt_style=item_tokens needs one vocabulary token",
    ):
        adopt_model(cfg, "abpo", str(other))
    assert arm_versions.get_version(cfg, "abpo", "champion") is None  # nothing registered


def test_a_tokenizer_without_the_answer_format_is_refused(make_cfg, build_tiny_model, tmp_path):
    """A word-level tokenizer that knows the titles' words but not the answer markup (<item_id>... become [UNK])."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from abpo.monthly.adopt import ModelRefused, adopt_model
    from abpo.policy.tokenizer import CHAT_TEMPLATE

    cfg, ds, model = _cfg_and_model(make_cfg, build_tiny_model, "policy.prompt_style=text")
    words = sorted({w for t in ds.titles().values() for w in t.split()})
    vocab = {w: i for i, w in enumerate(["[UNK]", "<|pad|>", "<|bos|>", "<|end|>", *words])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="<|pad|>", bos_token="<|bos|>", eos_token="<|end|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    bad = tmp_path / "wordlevel"
    shutil.copytree(model, bad)
    for f in bad.glob("*token*"):
        f.unlink()
    fast.save_pretrained(bad)
    with pytest.raises(
        ModelRefused,
        match=r"wordlevel/tokenizer.json: the answer format does not survive the "
        r"tokenizer: .*\(unknown tokens\); rule: the tokenizer encodes "
        r"<item_id>ID</item_id><item>TITLE</item> losslessly",
    ):
        adopt_model(cfg, "abpo", str(bad))


def test_a_tokenizer_without_a_chat_template_is_refused(make_cfg, build_tiny_model, tmp_path):
    from abpo.monthly.adopt import ModelRefused, adopt_model

    cfg, _, model = _cfg_and_model(make_cfg, build_tiny_model)
    bare = tmp_path / "bare"
    shutil.copytree(model, bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    conf = json.loads((bare / "tokenizer_config.json").read_text())
    conf.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(conf))
    with pytest.raises(ModelRefused, match=r"bare/tokenizer_config.json: field chat_template is missing"):
        adopt_model(cfg, "abpo", str(bare))
    with pytest.raises(ModelRefused, match=r"nothing/config.json: missing; rule: a Hugging Face save_pretrained"):
        (tmp_path / "nothing").mkdir()
        adopt_model(cfg, "abpo", str(tmp_path / "nothing"))
