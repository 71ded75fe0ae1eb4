"""Whole weights: a safetensors file checked against its own header."""

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


def check_weights(directory: str | Path) -> None:
    """ModelFilesDamaged naming the first ``*.safetensors`` under ``directory`` that is not whole
    (:func:`safetensors_problem`)."""
    for f in sorted(Path(directory).rglob("*.safetensors")):
        why = safetensors_problem(f)
        if why is not None:
            raise ModelFilesDamaged(
                f"{f}: not a whole safetensors file ({why}); rule: model weights are loaded only when whole"
            )
