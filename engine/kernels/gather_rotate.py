"""gather_rotate: build a call's view from the store in one launch.

Contract: for context index c (0 <= c < C), layer l and KV head h,

    out_k[l, h, c] = rope(store_k[l, slots[c], h], positions[c])
    out_v[l, h, c] = store_v[l, slots[c], h]

with rope the rotate_half convention of HF (`RopeTables.rotate`). Shapes:
store_k, store_v (L, S, Hkv, D); slots, positions (C,) long; cos, sin (P, D);
out_k, out_v (L, Hkv, >= C, D), any strides (arena slices are fine). Slots may
repeat and come in any order; C may be 0. One program per (c, l); each loops
over the KV heads, so the launch covers all layers and heads at once.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor

from corps.cache.rope import RopeTables


def gather_rotate_ref(
    store_k: Tensor,
    store_v: Tensor,
    slots: Tensor,
    positions: Tensor,
    cos: Tensor,
    sin: Tensor,
    out_k: Tensor,
    out_v: Tensor,
) -> None:
    """The torch reference (the CPU path of `open_view`)."""
    if slots.numel():
        rope = RopeTables(cos=cos, sin=sin)
        gather_rotated(store_k, store_v, slots, positions, rope, out_k, out_v)


def gather_rotated(store_k, store_v, slots, positions, rope, out_k, out_v) -> None:
    """The plain-torch gather: out_k[l, h, c] = rope(store_k[l, slots[c], h], positions[c])
    and out_v[l, h, c] = store_v[l, slots[c], h]; store (L, S, Hkv, D), out (L, Hkv, >= C, D).

    Both gathers pick (L x Hkv x C) rows of D values out of the store seen as one 2-D
    table, in the view's head-major order: one `index_select` on dim 0, the fast path
    for row lookups (10x an `index_select` on the store's slot dim here, which made
    a 370-token view of 30 layers cost 10 ms of a call's admission).
    """
    layers, size, heads, dim = store_k.shape
    c = slots.numel()
    rows = _head_major_rows(layers, size, heads, slots)  # (L Hkv C,)
    x = _rows(store_k).index_select(0, rows).view(layers, heads, c, dim)  # (L, Hkv, C, D)
    rope.rotate_into(x, positions, out_k[:, :, :c], token_dim=-2)
    out_v[:, :, :c] = _rows(store_v).index_select(0, rows).view(layers, heads, c, dim)


def _head_major_rows(layers: int, size: int, heads: int, slots: Tensor) -> Tensor:
    """Row (l, s, h) of a (L, S, Hkv, D) store seen as (L S Hkv, D), for every layer l,
    head h and slot s in `slots` (C,), ordered (l, h, c). Returns (L Hkv C,) long."""
    dev = slots.device
    layer = torch.arange(layers, device=dev) * (size * heads)  # (L,)
    head = torch.arange(heads, device=dev)  # (Hkv,)
    return (layer[:, None, None] + head[None, :, None] + slots[None, None, :] * heads).flatten()


def _rows(store: Tensor) -> Tensor:
    """A (L, S, Hkv, D) store as (L S Hkv, D) rows, without a copy (the store is one block)."""
    if not store.is_contiguous():
        raise ValueError("the KV store must be contiguous to be gathered from")
    return store.view(-1, store.shape[-1])


@cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def gather_rotate_kernel(
        sk, sv, slots, positions, cos, sin, ok, ov,
        s_l, s_s, s_h,  # store strides (layer, slot, head); head dim contiguous
        o_l, o_h, o_c,  # out strides (layer, head, context); head dim contiguous
        t_p,  # cos/sin row stride
        HKV: tl.constexpr, HALF: tl.constexpr,
    ):  # fmt: skip
        c = tl.program_id(0)
        layer = tl.program_id(1)
        slot = tl.load(slots + c)
        pos = tl.load(positions + c)
        d = tl.arange(0, HALF)
        cos1 = tl.load(cos + pos * t_p + d).to(tl.float32)
        cos2 = tl.load(cos + pos * t_p + HALF + d).to(tl.float32)
        sin1 = tl.load(sin + pos * t_p + d).to(tl.float32)
        sin2 = tl.load(sin + pos * t_p + HALF + d).to(tl.float32)
        for h in range(HKV):
            src = layer * s_l + slot * s_s + h * s_h
            dst = layer * o_l + h * o_h + c * o_c
            x1 = tl.load(sk + src + d).to(tl.float32)
            x2 = tl.load(sk + src + HALF + d).to(tl.float32)
            tl.store(ok + dst + d, (x1 * cos1 - x2 * sin1).to(ok.dtype.element_ty))
            tl.store(ok + dst + HALF + d, (x2 * cos2 + x1 * sin2).to(ok.dtype.element_ty))
            tl.store(ov + dst + d, tl.load(sv + src + d))
            tl.store(ov + dst + HALF + d, tl.load(sv + src + HALF + d))

    return gather_rotate_kernel


def gather_rotate(
    store_k: Tensor,
    store_v: Tensor,
    slots: Tensor,
    positions: Tensor,
    cos: Tensor,
    sin: Tensor,
    out_k: Tensor,
    out_v: Tensor,
) -> None:
    """The Triton kernel (same contract as `gather_rotate_ref`)."""
    c = slots.numel()
    if c == 0:
        return
    layers, _, heads, dim = store_k.shape
    if dim % 2 or dim & (dim - 1):
        raise ValueError(f"gather_rotate needs a power-of-two head dim, got {dim}")
    for t in (store_k, store_v, out_k, out_v, cos, sin):
        if t.stride(-1) != 1:
            raise ValueError("gather_rotate needs the head dim contiguous")
    _kernel()[(c, layers)](
        store_k, store_v, slots, positions, cos, sin, out_k, out_v,
        store_k.stride(0), store_k.stride(1), store_k.stride(2),
        out_k.stride(0), out_k.stride(1), out_k.stride(2),
        cos.stride(0),
        HKV=heads, HALF=dim // 2,
    )  # fmt: skip
