"""What a LoRA adapter directory must hold (PEFT's format), checked without torch so
that a config naming a bad one fails before anything loads."""

from __future__ import annotations

import json
from pathlib import Path

#: the files of a LoRA adapter directory in PEFT's format (`model.adapter_files`)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def adapter_problem(path: str | Path) -> str | None:
    """What keeps `path` from being a LoRA adapter directory in PEFT's format (a
    phrase), or None; torch-free, so configs fail before anything loads."""
    root = Path(path).expanduser()
    if not root.is_dir():
        return (
            "not a directory (give the one `corps distill --out` or peft's save_pretrained wrote)"
        )
    missing = [f for f in ADAPTER_FILES if not (root / f).is_file()]
    if missing:
        listed = ", ".join(missing)
        return f"has no {listed} (an adapter directory is what peft's save_pretrained writes)"
    try:
        config = json.loads((root / ADAPTER_FILES[0]).read_text())
    except (OSError, ValueError) as exc:
        return f"has an unreadable {ADAPTER_FILES[0]} ({exc})"
    kind = config.get("peft_type") if isinstance(config, dict) else None
    if kind != "LORA":
        return f"holds a {kind!r} adapter; corps serves LoRA adapters"
    return None
