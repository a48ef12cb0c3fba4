"""`AttentionBackend`: the interface every backend implements, and choosing one."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from corps.cache.errors import InvalidRequest
from corps.engine.attention.plan import DecodePlan
from corps.engine.kernels import interpreting, triton_available

BACKENDS = ("torch", "triton", "flex", "triton+flex")


class AttentionBackend(Protocol):
    name: str
    decode_min_calls: int  # decode steps of at least this many calls use attend_decode
    short_span_rows: int  # prefill spans this short may go to attend_decode too (1: none)
    # decodes split into plans by length while that saves this many padded keys (None:
    # one plan for all; a decode kernel that reads ragged views pads nothing)
    plan_keys: int | None

    def gather(
        self,
        store_k: Tensor,
        store_v: Tensor,
        slots: Tensor,
        positions: Tensor,
        cos: Tensor,
        sin: Tensor,
        out_k: Tensor,
        out_v: Tensor,
    ) -> None:
        """Build a view: `corps.engine.kernels.gather_rotate` states the contract."""
        ...

    def plan_prefill(self, spans: tuple[Any, ...]) -> Any:
        """Per-step state shared by every layer's `attend_spans` (None if unused)."""
        ...

    def attend_spans(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, spans, plan: Any, scale: float
    ) -> Tensor:
        """Rows of a flat batch, grouped in spans (`SeqSpan`), one span per call:
        append each span's rotated k, v (t, Hkv, D) to its view, then attend its
        queries q (t, Hq, D). Query i of a span sits at view index `view.length + i`
        and sees view[: view.length + i + 1]: its context and its own earlier tokens.
        Returns (T, Hq, D) in row order.
        """
        ...

    def attend_decode(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, plan: DecodePlan, scale: float
    ) -> Tensor:
        """A step of B calls whose views share an arena, `plan.t` or fewer rows each
        (1 for decodes): append k, v (T, Hkv, D) and attend q (T, Hq, D) over each
        call's view, causally within its rows. Returns (T, Hq, D)."""
        ...


def select_backend(device: torch.device | str, name: str | None = None) -> AttentionBackend:
    """The backend `name` (`EngineConfig.attention`, default from `CORPS_ATTENTION`), or
    with None the one that suits `device`.

    Raises InvalidRequest for an unknown name, and for Triton when it is not
    installed or has neither a CUDA device nor its interpreter (TRITON_INTERPRET=1).
    """
    dev = torch.device(device)
    name = (name or "").strip().lower()
    if not name:
        name = "triton+flex" if dev.type == "cuda" and triton_available() else "torch"
    if name not in BACKENDS:
        raise InvalidRequest(f"attention must be one of {', '.join(BACKENDS)}, got {name!r}")
    if "triton" in name:
        if not triton_available():
            raise InvalidRequest(f"attention {name!r} needs Triton: pip install 'corps[cuda]'")
        if dev.type != "cuda" and not interpreting():
            raise InvalidRequest(
                f"attention {name!r} on {dev.type} needs TRITON_INTERPRET=1 "
                "(Triton's interpreter: exact but slow, for testing); or use torch"
            )
    from corps.engine.attention.cuda import FlexAttention, TritonAttention, TritonFlexAttention
    from corps.engine.attention.sdpa import SdpaAttention

    classes = {
        "torch": SdpaAttention,
        "triton": TritonAttention,
        "flex": FlexAttention,
        "triton+flex": TritonFlexAttention,
    }
    return classes[name]()
