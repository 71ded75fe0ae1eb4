"""Whole weights: a safetensors file checked against its own header, a torch weights file (``torch.save``'s zip
format, SASRec's ``sasrec.pt``) against its own central directory, and the files a model directory needs."""

from __future__ import annotations

from pathlib import Path

from abpo.registry.errors import ModelFilesDamaged


def safetensors_problem(path: str | Path) -> str | None:
    """Why the file at ``path`` is not a whole safetensors file, or None when it is. The format: an 8-byte little-endian
    header length N, N bytes of JSON naming each tensor's ``data_offsets`` [begin, end) in the data that follows; a
    whole file is exactly 8 + N + the largest end long (a truncated copy is shorter, an appended one longer)."""
    import json
    import struct

    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{size} bytes, shorter than the 8-byte header length"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"header of {n} bytes but the file holds {size} bytes"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return f"unreadable header ({type(e).__name__}: {str(e)[:120]})"
    ends = [
        int(v["data_offsets"][1])
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v
    ]
    want = 8 + n + max(ends, default=0)
    if size != want:
        return f"{size} bytes where its header needs {want} (truncated or damaged)"
    return None


def torch_weights_problem(path: str | Path) -> str | None:
    """Why the file at ``path`` is not a whole ``torch.save`` file (its zip format, the default since torch 1.6), or
    None when it is. A zip archive ends with its central directory, which gives every member's offset and size: a
    truncated copy has none (or one past the end of the file), an appended one is not where its directory says.
    Structure only, as :func:`safetensors_problem` (no CRC pass: a cached copy's bytes are checked by its sha256)."""
    import zipfile

    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        return f"unreadable ({type(e).__name__}: {str(e)[:120]})"
    try:
        with zipfile.ZipFile(p) as z:
            members = z.infolist()
            end = getattr(z, "start_dir", size)  # where the central directory starts
    except (OSError, zipfile.BadZipFile, ValueError) as e:
        return f"{size} bytes, no zip central directory ({type(e).__name__}: {str(e)[:120]})"
    if not members:
        return "an empty archive (no tensors)"
    for m in members:
        # a member's local header (30 bytes + its name and extra field) and its data lie before the directory
        if m.header_offset + 30 + len(m.filename) + m.compress_size > end:
            return f"{size} bytes, but member {m.filename!r} ends past {end} (truncated or damaged)"
    return None


WEIGHTS = {".safetensors": ("safetensors", safetensors_problem), ".pt": ("torch weights", torch_weights_problem)}
"""Weights files by suffix: what a refusal calls them, and their check."""


def weights_problem(path: str | Path) -> str | None:
    """Why the weights file at ``path`` (``*.safetensors`` or ``*.pt``: :data:`WEIGHTS`) is not whole, as the clause
    a refusal prints (``not a whole safetensors file (...)``), or None when it is (or is no weights file)."""
    kind = WEIGHTS.get(Path(path).suffix)
    if kind is None:
        return None
    why = kind[1](path)
    return None if why is None else f"not a whole {kind[0]} file ({why})"


def weights_files(directory: str | Path) -> list[Path]:
    """Every weights file (:data:`WEIGHTS`) under ``directory``, sorted."""
    return sorted(f for suffix in WEIGHTS for f in Path(directory).rglob(f"*{suffix}"))


def check_weights(directory: str | Path) -> None:
    """ModelFilesDamaged naming the first weights file under ``directory`` (``*.safetensors``, ``*.pt``) that is not
    whole (:func:`weights_problem`)."""
    for f in weights_files(directory):
        why = weights_problem(f)
        if why is not None:
            raise ModelFilesDamaged(f"{f}: {why}; rule: model weights are loaded only when whole")


PRETRAINED_WEIGHTS = ("model.safetensors", "adapter_model.safetensors", "pytorch_model.bin", "adapter_model.bin")


def missing_pretrained_files(directory: str | Path) -> list[str]:
    """The files a ``save_pretrained`` directory (an LLM arm's version) needs that ``directory`` lacks: its
    ``config.json`` (``adapter_config.json`` for a LoRA adapter) and its weights (one of :data:`PRETRAINED_WEIGHTS`,
    or every shard a ``*.index.json`` names)."""
    d = Path(directory)
    missing = [] if (d / "config.json").exists() or (d / "adapter_config.json").exists() else ["config.json"]
    indexes = sorted(d.glob("*.index.json"))
    if indexes:
        import json

        try:
            shards = sorted({str(v) for i in indexes for v in json.loads(i.read_text())["weight_map"].values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return [*missing, f"{indexes[0].name} (unreadable)"]
        missing += [s for s in shards if not (d / s).exists()]
    elif not any((d / w).exists() for w in PRETRAINED_WEIGHTS):
        missing.append(" or ".join(PRETRAINED_WEIGHTS))
    return missing
