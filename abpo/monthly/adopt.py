"""`abpo arms adopt`: an existing Hugging Face model (a ``save_pretrained`` directory, or a registered MLflow model
``models:/NAME/VERSION`` / ``models:/NAME@ALIAS``) becomes an LLM arm's first champion, without SFT: a model that
already serves can enter the loop as it is, and every later month updates it like pi_init.

Before anything is registered the model is checked against the prompt format the loop uses (``policy.*`` of the
config, abpo.policy.prompt): its directory holds ``config.json`` and a tokenizer; the tokenizer has a chat template;
it encodes the answer format ``<item_id>ID</item_id><item>TITLE</item>`` losslessly (no unknown token, decoded back to
the same text), and with ``policy.prompt_style=item_tokens`` has one token ``<item_id>ID</item_id>`` per catalog item;
and the model scores a few held-out requests of the configured data in that format with finite scores and
propensities that are > 0 and sum to 1. A refusal is :class:`ModelRefused`, naming the file or field and the rule."""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abpo import registry
from abpo.arms import history, promotion_lock, versions as arm_versions
from abpo.arms.names import LLM, LLM_ARMS, entry
from abpo.data.candidates import build_eval_examples
from abpo.monthly.common import CHAMPION, StepResult, dataset_and_splits, start_run
from abpo.policy.model import ModelNotAvailableError, load_policy
from abpo.policy.prompt import check_answers_fit, encode_answer, format_answer, item_token, prompt_style

if TYPE_CHECKING:
    from abpo.config import Config

log = logging.getLogger(__name__)
CHECK_REQUESTS = 4  # held-out requests scored by the check


class ModelRefused(ValueError):
    """The model cannot serve the loop's prompt format (the message names the file or field and the rule), or the arm
    cannot adopt one; nothing was registered."""


@dataclasses.dataclass
class AdoptResult(StepResult):
    arm: str
    version: str  # the new champion
    model: str  # what was adopted (the directory or models:/ URI given)
    checked_requests: int
    mean_top_propensity: float


def resolve_model(cfg: Config, model: str) -> Path:
    """The local ``save_pretrained`` directory of ``model``: the directory itself, or a registered MLflow model
    (``models:/...``) downloaded under ``<paths.models>/adopted/``."""
    if model.startswith("models:/"):
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model.removeprefix("models:/"))
        dst = cfg.paths.resolve("models") / "adopted" / safe
        dst.mkdir(parents=True, exist_ok=True)
        try:
            local = registry.download_artifacts(cfg, model, dst)
        except (registry.StateMoved, registry.NamespaceMismatch, registry.RegistryUnavailable):
            raise  # the store's own refusals (abpo.registry.configure) stand as they are
        except Exception as e:  # noqa: BLE001 - no such model or version: a message, not a traceback
            raise ModelRefused(
                f"--model {model}: cannot download it from the MLflow registry "
                f"{registry.redact_uri(cfg.paths.tracking_uri())} ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:300] if str(e) else ''})"
            ) from e
        found = [
            p
            for p in [local, *sorted(local.glob("data/*")), *sorted(local.glob("*"))]
            if p.is_dir() and ((p / "config.json").exists() or (p / "adapter_config.json").exists())
        ]
        if not found:
            raise ModelRefused(
                f"--model {model}: downloaded to {local}, but no directory in it holds config.json; "
                "rule: a registered abpo pyfunc model or a save_pretrained directory"
            )
        return found[0]
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ModelRefused(
            f"--model {model}: no such directory; rule: a Hugging Face save_pretrained directory or "
            "models:/NAME/VERSION | models:/NAME@ALIAS"
        )
    return path.resolve()


def _tokenizer_file(path: Path) -> str:
    return str(path / "tokenizer.json") if (path / "tokenizer.json").exists() else f"{path} (tokenizer files)"


def check_tokenizer(path: Path, tokenizer, cfg: Config, item_ids: list[int], titles: dict[int, str]) -> None:
    """The tokenizer's part of the check (see the module docstring); ModelRefused on the first rule broken."""

    if not getattr(tokenizer, "chat_template", None):
        raise ModelRefused(
            f"{path / 'tokenizer_config.json'}: field chat_template is missing (and there is no "
            "chat_template.jinja); rule: the prompt is one user turn rendered with the tokenizer's chat "
            "template (abpo.policy.prompt.render_chat)"
        )
    unk = getattr(tokenizer, "unk_token_id", None)
    for a in item_ids[:CHECK_REQUESTS]:
        answer = format_answer(a, titles[a])
        ids = encode_answer(tokenizer, answer)
        back = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if (unk is not None and unk in ids) or back != answer:
            raise ModelRefused(
                f"{_tokenizer_file(path)}: the answer format does not survive the tokenizer: {answer!r} decodes as "
                f"{back!r}{' (unknown tokens)' if unk is not None and unk in ids else ''}; rule: the tokenizer encodes "
                "<item_id>ID</item_id><item>TITLE</item> losslessly (no unknown token; decode gives the same text)"
            )
    if prompt_style(cfg.policy) == "item_tokens":
        toks = tokenizer.convert_tokens_to_ids([item_token(i) for i in item_ids])
        missing = [i for i, t in zip(item_ids, toks) if t is None or (unk is not None and t == unk)]
        if missing:
            raise ModelRefused(
                f"{_tokenizer_file(path)}: no item token for {len(missing)} of {len(item_ids)} catalog items (e.g. "
                f"{item_token(missing[0])}); rule: policy.prompt_style=item_tokens needs one vocabulary token "
                "<item_id>ID</item_id> per catalog item (the tiny model's tokenizer, built on this catalog); adopt a "
                "model without them with --set policy.prompt_style=text"
            )
    check_answers_fit(tokenizer, titles, cfg, _tokenizer_file(path))  # every answer fits the update's rollouts


def check_model(cfg: Config, path: Path) -> dict[str, Any]:
    """Check that the model in ``path`` serves the loop's prompt format (module docstring); returns what was
    measured. ModelRefused names the file or field and the rule when it does not."""
    import torch

    from abpo.policy.scoring import candidate_propensities, score_examples

    if not (path / "config.json").exists() and not (path / "adapter_config.json").exists():
        raise ModelRefused(
            f"{path / 'config.json'}: missing; rule: a Hugging Face save_pretrained directory "
            "(config.json, the weights, the tokenizer files)"
        )
    try:
        registry.check_weights(path)  # a truncated *.safetensors: one line naming it (not SafetensorError's)
    except registry.ModelFilesDamaged as e:
        raise ModelRefused(str(e)) from e
    ds, splits = dataset_and_splits(cfg)
    titles = ds.titles()
    examples = build_eval_examples(splits, ds, cfg.data)[:CHECK_REQUESTS]
    try:
        model, tok = load_policy(dataclasses.replace(cfg.policy, model=str(path)), cfg.paths, dataset=ds)
    except (ModelNotAvailableError, OSError, ValueError) as e:
        if "chat template" in str(e):
            raise ModelRefused(
                f"{path / 'tokenizer_config.json'}: field chat_template is missing (and there is no "
                "chat_template.jinja); rule: the prompt is one user turn rendered with the tokenizer's "
                "chat template (abpo.policy.prompt.render_chat)"
            ) from e
        raise ModelRefused(
            f"{path}: not loadable as a causal LM with its tokenizer ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:300] if str(e) else ''}); rule: a Hugging Face save_pretrained "
            "directory (config.json, the weights, the tokenizer files)"
        ) from e
    check_tokenizer(path, tok, cfg, sorted(titles), titles)
    scored = score_examples(model, tok, examples, titles, cfg.policy)
    tops = []
    for s in scored:
        props = candidate_propensities(s.scores, cfg.policy.tau)
        if (
            not bool(torch.isfinite(s.scores).all())
            or not bool((props > 0).all())
            or abs(float(props.sum()) - 1) > 1e-4
        ):
            raise ModelRefused(
                f"{path}: request {s.example.request_id} in the prompt format of policy.prompt_style="
                f"{cfg.policy.prompt_style} scores {s.scores.tolist()[:5]}... (propensities sum {float(props.sum()):.6f});"
                " rule: every candidate's score is finite and e_p = softmax(s_p / tau) is > 0 and sums to 1"
            )
        tops.append(float(props.max()))
    return {"checked_requests": len(scored), "mean_top_propensity": sum(tops) / len(tops) if tops else math.nan}


def adopt_model(cfg: Config, arm: str, model: str | Path) -> AdoptResult:
    """Register ``model`` (a directory or ``models:/...``) as LLM arm ``arm``'s first champion, after
    :func:`check_model`. Refused when the arm is a ranker or already has a champion; nothing is registered then."""
    model = str(model)
    name = arm_versions.model_name(arm, cfg)  # an unknown arm: NotInRegistry naming the known ones
    if entry(arm).kind != LLM:
        raise ModelRefused(
            f"arm {arm!r} is a {entry(arm).kind} arm; rule: adopt takes an LLM arm, one of {list(LLM_ARMS)}"
        )
    champ = arm_versions.get_version(cfg, arm, CHAMPION)
    if champ is not None:
        raise ModelRefused(
            f"{name}: champion is v{champ.version} already; rule: adopt gives an arm its first champion "
            "(move an existing one with `abpo arms promote`); nothing registered"
        )
    path = resolve_model(cfg, model)
    checked = check_model(cfg, path)
    log.info(
        f"adopt {arm}: {path} scores {checked['checked_requests']} held-out requests in the "
        f"{cfg.policy.prompt_style} prompt format (mean top propensity {checked['mean_top_propensity']:.3f})"
    )
    tags = arm_versions.lineage_tags(
        cfg,
        kind="llm",
        source="adopt",
        parent_version=None,
        months=[],
        data_hash="",
        variant=entry(arm).refreshed_by,
        adopted_from=model,
    )
    with start_run(cfg, f"adopt-{arm}", {"abpo.arm": arm, "abpo.adopted_from": model}) as run:
        uri = arm_versions.log_arm_model(cfg, arm, path)
    mv = arm_versions.register_version(cfg, arm, uri, run.info.run_id, tags, alias=None)
    with promotion_lock.promotion_lock(cfg, arm):  # "no champion yet" checked again where the alias moves
        champ = arm_versions.get_version(cfg, arm, CHAMPION)
        if champ is not None:
            raise ModelRefused(
                f"{name}: champion v{champ.version} appeared while v{mv.version} was being registered; "
                f"rule: adopt gives an arm its first champion; v{mv.version} stays without an alias"
            )
        # recorded in the promotion history (abpo.arms.history) as one step: pending entry, alias, finished entry
        pending = history.begin(
            cfg,
            arm,
            action="adopt",
            actor=history.os_actor(),
            from_version="",
            to_version=str(mv.version),
            reason=f"adopted {model}",
        )
        arm_versions.set_alias(cfg, arm, CHAMPION, mv.version)
        history.finish(cfg, pending)
    log.info(f"adopt {arm}: {name} v{mv.version} ({model}, no SFT) is champion")
    return AdoptResult(arm=arm, version=str(mv.version), model=model, **checked)
