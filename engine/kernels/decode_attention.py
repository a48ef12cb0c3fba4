"""decode_attention: one decode token for each of B calls whose contexts live in one arena.

Contract: for call b, query head h (KV head h // G, G = Hq / Hkv),

    out[b, h] = softmax(scale * q[b, h] . K_b^T) V_b,
    K_b = arena_k[h // G, idx_b]   (V_b likewise),
    idx_b = [base[b], base[b] + c[b]) then [own[b], own[b] + n[b] - c[b])

A call's view is two ranges of the arena: its context (c[b] keys, maybe shared
with other calls) and its own tokens. By default c = n (one range).

Shapes: q (B, Hq, D); arena_k, arena_v (Hkv, A, D) (one layer of the view
arena, rotated keys); base, n, c, own (B,) long, n[b] >= 1 (the context plus
the new token, already written); out (B, Hq, D). Lengths are ragged.

Flash-decoding: the context of every call is cut into splits of SPLIT keys;
one program per (call, query head, split) computes a partial softmax (running
max m, normaliser l, weighted sum acc) over its split in blocks of BLOCK keys;
a second launch merges the splits of each (call, head). Long contexts thus use
many programs even when B is 1.

With `splits` given, the launch does not depend on the lengths at all (a CUDA
graph can replay it whatever the views hold): every call's view is cut into
that many splits, each of ceil(n / splits) keys rounded up to BLOCK, computed
in the kernel from n; splits past a short view's end find no keys and weigh
nothing in the merge.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor

BLOCK = 32  # keys per inner step
SPLIT = 256  # keys per program


def decode_attention_ref(
    q: Tensor, arena_k: Tensor, arena_v: Tensor, base: Tensor, n: Tensor, scale: float,
    ctx_len: Tensor | None = None, own_base: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """Brute force, one call at a time, in float32. Returns (B, Hq, D) in q's dtype."""
    b, hq, _ = q.shape
    g = hq // arena_k.shape[0]
    out = torch.empty_like(q)
    c = n if ctx_len is None else ctx_len
    own = base + n if own_base is None else own_base
    for i in range(b):
        lo, hi = int(base[i]), int(base[i]) + int(c[i])
        olo, ohi = int(own[i]), int(own[i]) + int(n[i]) - int(c[i])
        k = torch.cat([arena_k[:, lo:hi], arena_k[:, olo:ohi]], 1)  # (Hkv, n, D)
        v = torch.cat([arena_v[:, lo:hi], arena_v[:, olo:ohi]], 1)
        k = k.float().repeat_interleave(g, dim=0)  # (Hq, n, D)
        v = v.float().repeat_interleave(g, dim=0)  # (Hq, n, D)
        scores = torch.einsum("hd,hnd->hn", q[i].float() * scale, k)  # (Hq, n)
        out[i] = torch.einsum("hn,hnd->hd", torch.softmax(scores, dim=-1), v).to(q.dtype)
    return out


@cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def partial_kernel(
        q, ak, av, base, n, clen, own, pm, pl, pacc, scale,
        s_qb, s_qh, s_kh, s_kp,  # q strides (call, head); arena strides (head, position)
        G: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr, NSPLIT,
        FIXED: tl.constexpr,  # NSPLIT splits per view, sized from its length
    ):  # fmt: skip
        b = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.program_id(2)
        d = tl.arange(0, D)
        length = tl.load(n + b)
        start = tl.load(base + b)
        ctx = tl.load(clen + b)  # keys [0, ctx) from the context, the rest from own
        own_start = tl.load(own + b) - ctx
        qv = tl.load(q + b * s_qb + h * s_qh + d).to(tl.float32) * scale  # (D,)
        kv_off = (h // G) * s_kh
        m = -1e30
        norm = 0.0
        acc = tl.zeros([D], dtype=tl.float32)
        if FIXED:
            per = tl.cdiv(tl.cdiv(length, NSPLIT), BLOCK) * BLOCK
        else:
            per = SPLIT
        lo = s * per
        hi = tl.minimum(lo + per, length)
        for j in range(lo, hi, BLOCK):
            p = j + tl.arange(0, BLOCK)  # (BLOCK,) positions in the context
            live = p < hi
            at = tl.where(p < ctx, start + p, own_start + p)  # (BLOCK,) arena index
            rows = kv_off + at[:, None] * s_kp + d[None, :]  # (BLOCK, D)
            k = tl.load(ak + rows, mask=live[:, None], other=0.0).to(tl.float32)
            scores = tl.sum(k * qv[None, :], axis=1)  # (BLOCK,)
            scores = tl.where(live, scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=0))
            w = tl.exp(scores - m_new)  # (BLOCK,), 0 where masked
            alpha = tl.exp(m - m_new)
            v = tl.load(av + rows, mask=live[:, None], other=0.0).to(tl.float32)
            acc = acc * alpha + tl.sum(w[:, None] * v, axis=0)
            norm = norm * alpha + tl.sum(w, axis=0)
            m = m_new
        slot = (b * tl.num_programs(1) + h) * NSPLIT + s
        tl.store(pm + slot, m)
        tl.store(pl + slot, norm)
        tl.store(pacc + slot * D + d, acc)

    @triton.jit
    def merge_kernel(
        pm, pl, pacc, out, s_ob, s_oh, NSPLIT, D: tl.constexpr
    ):  # fmt: skip
        b = tl.program_id(0)
        h = tl.program_id(1)
        d = tl.arange(0, D)
        first = (b * tl.num_programs(1) + h) * NSPLIT
        top = -1e30
        for s in range(NSPLIT):
            top = tl.maximum(top, tl.load(pm + first + s))
        norm = 0.0
        acc = tl.zeros([D], dtype=tl.float32)
        for s in range(NSPLIT):
            w = tl.exp(tl.load(pm + first + s) - top)  # 0 for a split with no keys
            norm += w * tl.load(pl + first + s)
            acc += w * tl.load(pacc + (first + s) * D + d)
        tl.store(out + b * s_ob + h * s_oh + d, (acc / norm).to(out.dtype.element_ty))

    return partial_kernel, merge_kernel


def decode_attention(
    q: Tensor, arena_k: Tensor, arena_v: Tensor, base: Tensor, n: Tensor, scale: float,
    max_n: int | None = None, ctx_len: Tensor | None = None, own_base: Tensor | None = None,
    splits: int | None = None,
) -> Tensor:  # fmt: skip
    """The Triton kernels (same contract as `decode_attention_ref`). `max_n` is
    max(n) if the caller knows it (saves a device sync); `splits` fixes the number
    of splits per view instead (the launch then reads no length on the host)."""
    b, hq, dim = q.shape
    hkv = arena_k.shape[0]
    if hq % hkv:
        raise ValueError(f"{hq} query heads do not group over {hkv} KV heads")
    if dim & (dim - 1):
        raise ValueError(f"decode_attention needs a power-of-two head dim, got {dim}")
    if arena_k.stride() != arena_v.stride() or arena_k.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("decode_attention needs K and V laid out alike, head dim contiguous")
    out = torch.empty_like(q)
    if b == 0:
        return out
    if splits is not None:
        nsplit = splits
    else:
        longest = int(n.max()) if max_n is None else max_n
        nsplit = max(1, -(-longest // SPLIT))
    pm = torch.empty(b * hq * nsplit, dtype=torch.float32, device=q.device)
    pl = torch.empty_like(pm)
    pacc = torch.empty(b * hq * nsplit * dim, dtype=torch.float32, device=q.device)
    c = n if ctx_len is None else ctx_len
    own = base + n if own_base is None else own_base
    partial, merge = _kernels()
    partial[(b, hq, nsplit)](
        q, arena_k, arena_v, base, n, c, own, pm, pl, pacc, scale,
        q.stride(0), q.stride(1), arena_k.stride(0), arena_k.stride(1),
        G=hq // hkv, D=dim, SPLIT=SPLIT, BLOCK=BLOCK, NSPLIT=nsplit, FIXED=splits is not None,
    )  # fmt: skip
    merge[(b, hq)](pm, pl, pacc, out, out.stride(0), out.stride(1), D=dim, NSPLIT=nsplit)
    return out
