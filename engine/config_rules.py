"""Settings that are fine alone but not together: each pair refused with what to do."""

from __future__ import annotations

from typing import Any

from corps.engine.errors import BadConfig


def check_combination(cfg: Any) -> None:
    """BadConfig naming the fields of the first combination `cfg` (an `EngineConfig`,
    which calls this as it is made: hence not imported here) may not hold."""
    if cfg.compile and (cfg.mode == "hf" or not cfg.device.startswith("cpu")):
        raise BadConfig(
            f"compile=True captures our CPU decode step: not for mode={cfg.mode!r} on "
            f"device={cfg.device!r} (use mode choreographed or baseline on cpu)",
            ("compile",),
        )
    if cfg.compile_gemms != "library" and not cfg.compile:
        raise BadConfig(
            f"compile_gemms={cfg.compile_gemms!r} chooses the products of the captured "
            "decode step: set compile=True too (--compile)",
            ("compile_gemms",),
        )
    if cfg.weights == "int8" and not cfg.device.startswith("cpu"):
        raise BadConfig(
            f"weights='int8' runs torch's int8 CPU kernel: not on device={cfg.device!r} "
            "(use weights='int4' on CUDA)",
            ("weights",),
        )
    if cfg.weights == "gguf" and cfg.adapter is not None:
        raise BadConfig(
            "weights='gguf' runs the file's blocks as they are, and an adapter changes "
            "them: use weights='dense' (or 'int4' to quantize the adapted weights)",
            ("weights", "adapter"),
        )
    if cfg.weights in ("gguf", "int8", "int4") and cfg.mode == "hf":
        raise BadConfig(
            f"weights={cfg.weights!r} runs our forward: not for mode='hf', which runs "
            "transformers on dense weights",
            ("weights",),
        )
    if cfg.store is not None and cfg.mode == "hf":
        raise BadConfig(
            "store= keeps messages and their encodings in our KV store: not for "
            "mode='hf', which re-encodes every prompt (use choreographed or baseline)",
            ("store",),
        )
    if cfg.store is not None and cfg.store.exists() and not cfg.store.is_dir():
        raise BadConfig(f"store={str(cfg.store)!r} is a file: name a directory", ("store",))
    if cfg.graphs == "capture" and not cfg.device.startswith("cuda"):
        raise BadConfig(
            f"graphs='capture' records CUDA graphs: not on device={cfg.device!r} "
            "(use graphs='static' to run the same static buffers without capture)",
            ("graphs",),
        )
    if cfg.graphs in ("capture", "static") and cfg.mode == "hf":
        raise BadConfig(
            f"graphs={cfg.graphs!r} runs our decode step: not for mode='hf'", ("graphs",)
        )
    if cfg.contexts == "store" and cfg.attention not in (None, "torch"):
        raise BadConfig(
            f'contexts="store" needs the torch attention backend, not {cfg.attention!r} '
            f"(set attention='torch' or CORPS_ATTENTION=torch)",
            ("contexts", "attention"),
        )
