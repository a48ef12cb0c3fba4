"""matplotlib for the benchmarks' `--plot` (the `plot` extra), headless."""

from __future__ import annotations

from typing import Any

INSTALL = "--plot needs matplotlib: pip install 'corps[plot]' (or pip install matplotlib)"


def pyplot() -> Any:
    """`matplotlib.pyplot` on the Agg backend; RuntimeError saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError(INSTALL) from exc
    return plt
