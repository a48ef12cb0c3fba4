"""Kernels for the CUDA path, each beside the plain-torch reference it must match.

Every kernel here is a Triton kernel with a `*_ref` twin in torch. On a GPU the
Triton version runs; without one the tests run it under `TRITON_INTERPRET=1` on
CPU tensors and compare it with the reference. Importing this package never
imports Triton: `triton_available()` says whether the kernels can run.
"""

from __future__ import annotations

import os
from functools import cache


@cache
def triton_available() -> bool:
    """Triton is installed (the `cuda` or `dev` extra) and importable."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def interpreting() -> bool:
    """Triton kernels run on CPU tensors through its interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"
