"""`corps bench kernels`: each CUDA kernel timed against its torch reference and against
SDPA on a gathered context, on shapes of the default model (SmolLM2-135M: 30 layers,
3 KV heads, 9 query heads, head dim 64).

GPU-only: timings are taken with CUDA synchronisation on a CUDA device. Without one
the command says so and exits 0; `--device cpu` under TRITON_INTERPRET=1 runs the
same code through Triton's interpreter (the timings then mean nothing; the tests use
it to keep this code honest).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel
from torch import Tensor

LAYERS, KV_HEADS, HEADS, DIM = 30, 3, 9, 64


class Timing(BaseModel):
    kernel: str
    shape: str
    ours_ms: float
    reference: str
    reference_ms: float
    sdpa_ms: float  # SDPA over the same context gathered into a padded batch

    @property
    def speedup(self) -> float:
        return self.reference_ms / self.ours_ms


def clock(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of `fn`, synchronising the device around each run."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()  # warm up: compiles, autotunes, allocates
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def _sdpa_gathered(q: Tensor, k: Tensor, v: Tensor, lengths: Tensor) -> Tensor:
    """SDPA over contexts gathered into one padded batch: q (B, Hq, T, D),
    k, v (B, Hkv, N, D), lengths (B,). Queries see their call's first `lengths` keys."""
    mask = torch.arange(k.shape[2], device=k.device)[None, :] < lengths[:, None]  # (B, N)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask[:, None, None, :], enable_gqa=True
    )


def bench_gather(device: torch.device, context: int, repeats: int, layers: int = LAYERS) -> Timing:
    from corps.engine.kernels.gather_rotate import gather_rotate, gather_rotate_ref

    g = torch.Generator(device=device).manual_seed(0)
    store = 4 * context
    sk = torch.randn(layers, store, KV_HEADS, DIM, device=device, generator=g)
    sv = torch.randn_like(sk)
    slots = torch.randperm(store, device=device, generator=g)[:context]
    pos = torch.arange(context, device=device)
    ang = pos[:, None].float() * torch.rand(DIM, device=device, generator=g)[None]  # (C, D)
    cos, sin = ang.cos(), ang.sin()
    out_k = torch.empty(layers, KV_HEADS, context, DIM, device=device)
    out_v = torch.empty_like(out_k)
    args = (sk, sv, slots, pos, cos, sin, out_k, out_v)
    ours = clock(lambda: gather_rotate(*args), device, repeats)
    ref = clock(lambda: gather_rotate_ref(*args), device, repeats)
    plain = clock(lambda: (sk[:, slots], sv[:, slots]), device, repeats)  # gather, no rotation
    return Timing(
        kernel="gather_rotate",
        shape=f"{context} slots x {layers} layers",
        ours_ms=ours,
        reference="torch gather + rotate",
        reference_ms=ref,
        sdpa_ms=plain,
    )


def _calls(device: torch.device, calls: int, context: int, g):
    n = torch.full((calls,), context, device=device)  # (B,) contexts, new token included
    base = torch.arange(calls, device=device) * context  # (B,)
    ak = torch.randn(KV_HEADS, calls * context, DIM, device=device, generator=g)  # (Hkv, A, D)
    av = torch.randn_like(ak)
    return ak, av, base, n


def bench_decode(device: torch.device, calls: int, context: int, repeats: int) -> Timing:
    from corps.cache.arena import ViewArena
    from corps.engine.attention import DecodePlan, SdpaAttention
    from corps.engine.kernels.decode_attention import decode_attention

    g = torch.Generator(device=device).manual_seed(0)
    ak, av, base, n = _calls(device, calls, context, g)
    q = torch.randn(calls, HEADS, DIM, device=device, generator=g)
    scale = DIM**-0.5
    ours = clock(
        lambda: decode_attention(q, ak, av, base, n, scale, max_n=context), device, repeats
    )
    # the torch backend's decode step over the same arena (one layer)
    arena = ViewArena(
        num_layers=1, num_kv_heads=KV_HEADS, head_dim=DIM, capacity=calls * context,
        dtype=q.dtype, device=device,
    )  # fmt: skip
    arena.k[0, :, : calls * context], arena.v[0, :, : calls * context] = ak, av
    idx = base[:, None] + torch.arange(context, device=device)[None]  # (B, N)
    plan = DecodePlan(  # each call's view one range: the context is the whole view
        arena, base + n - 1, idx.flatten(), (idx >= 0)[:, None], context, base, n, base + n, n,
        context,
    )  # fmt: skip
    k_new, v_new = ak[:, base + n - 1].transpose(0, 1), av[:, base + n - 1].transpose(0, 1)
    torch_ms = clock(
        lambda: SdpaAttention().attend_decode(0, q, k_new, v_new, plan, scale), device, repeats
    )
    kb = ak[:, idx].transpose(0, 1)  # (B, Hkv, N, D): the contexts gathered
    vb = av[:, idx].transpose(0, 1)
    sdpa = clock(lambda: _sdpa_gathered(q[:, :, None], kb, vb, n), device, repeats)
    return Timing(
        kernel="decode_attention",
        shape=f"{calls} calls x {context} context",
        ours_ms=ours,
        reference="torch backend decode",
        reference_ms=torch_ms,
        sdpa_ms=sdpa,
    )


def bench_prefill(device: torch.device, calls: int, rows: int, context: int, repeats: int):
    from corps.engine.kernels.flex_prefill import PrefillMask, flex_prefill

    g = torch.Generator(device=device).manual_seed(0)
    width = context + rows  # each call: its context, then its new rows
    ak = torch.randn(KV_HEADS, calls * width, DIM, device=device, generator=g)  # (Hkv, A, D)
    av = torch.randn_like(ak)
    base = torch.arange(calls, device=device) * width  # (B,)
    lo = base.repeat_interleave(rows)  # (T,)
    hi = lo + context + torch.arange(1, rows + 1, device=device).repeat(calls)  # (T,)
    q = torch.randn(calls * rows, HEADS, DIM, device=device, generator=g)  # (T, Hq, D)
    scale = DIM**-0.5
    mask = PrefillMask.build(lo, hi)
    ours = clock(lambda: flex_prefill(q, ak, av, mask, scale), device, repeats)

    def per_call_sdpa() -> None:  # what the torch backend does: one SDPA per call
        for c in range(calls):
            s = int(base[c])
            k, v = ak[:, s : s + width], av[:, s : s + width]  # (Hkv, W, D)
            qc = q[c * rows : (c + 1) * rows].transpose(0, 1)  # (Hq, rows, D)
            m = (
                torch.arange(width, device=device)[None]
                < (hi[c * rows : (c + 1) * rows] - s)[:, None]
            )
            F.scaled_dot_product_attention(qc, k, v, attn_mask=m, scale=scale, enable_gqa=True)

    torch_ms = clock(per_call_sdpa, device, repeats)
    idx = base[:, None] + torch.arange(width, device=device)[None]  # (B, W)
    kb, vb = ak[:, idx].transpose(0, 1), av[:, idx].transpose(0, 1)  # (B, Hkv, W, D)
    qb = q.view(calls, rows, HEADS, DIM).transpose(1, 2)  # (B, Hq, rows, D)
    causal = (
        torch.arange(width, device=device)[None]
        < (context + torch.arange(1, rows + 1, device=device))[:, None]
    )

    def batched_sdpa() -> None:
        F.scaled_dot_product_attention(qb, kb, vb, attn_mask=causal, scale=scale, enable_gqa=True)

    sdpa = clock(batched_sdpa, device, repeats)
    return Timing(
        kernel="flex_prefill",
        shape=f"{calls} calls x {rows} rows over {context} context",
        ours_ms=ours,
        reference="torch backend (SDPA per call)",
        reference_ms=torch_ms,
        sdpa_ms=sdpa,
    )


def measure(device: str = "cuda", *, small: bool = False, repeats: int = 20) -> list[Timing]:
    """Time every kernel on `device`; `small` shapes keep the interpreter fast."""
    dev = torch.device(device)
    if small:
        return [
            bench_gather(dev, 16, repeats, layers=2),
            bench_decode(dev, 2, 96, repeats),
            bench_prefill(dev, 2, 8, 32, repeats),
        ]
    return [
        bench_gather(dev, 4096, repeats),
        bench_decode(dev, 1, 4096, repeats),
        bench_decode(dev, 32, 2048, repeats),
        bench_prefill(dev, 4, 256, 2048, repeats),
    ]


def table(timings: list[Timing], device: str):
    from rich.table import Table

    t = Table(title=f"corps kernels on {device}: median ms (lower is better)")
    for col in ("kernel", "shape", "kernel ms", "reference", "ref ms", "ref / kernel", "SDPA ms"):
        t.add_column(col, justify="right" if "ms" in col or "/" in col else "left")
    for r in timings:
        t.add_row(
            r.kernel, r.shape, f"{r.ours_ms:.3f}", r.reference, f"{r.reference_ms:.3f}",
            f"{r.speedup:.2f}x", f"{r.sdpa_ms:.3f}",
        )  # fmt: skip
    return t


def cpu_table(timings, choice, *, cpu: str, cache: str, exact) -> Any:
    """`corps bench kernels --cpu`: ms of one forward step's products per kernel and
    row count, the chosen kernel of each row count in bold (dtype="auto"), and the
    exact (float32) choice."""
    from rich.table import Table

    buckets = choice.buckets
    t = Table(title=f"product kernels on {cpu} (ms per step's products; bold: dtype=auto)")
    wide = max(map(len, timings), default=8)  # kernel names are never cut
    t.add_column("kernel", no_wrap=True, min_width=wide)
    for b in buckets:
        t.add_column(f"{b} rows", justify="right", no_wrap=True, min_width=wide)
    for kernel, by_rows in timings.items():
        cells = []
        for b in buckets:
            s = by_rows.get(b, float("inf"))
            text = "-" if s == float("inf") else f"{s * 1e3:.1f}"
            cells.append(f"[bold]{text}[/]" if choice.kernel_for(b) == kernel else text)
        t.add_row(kernel, *cells)
    t.add_row("auto picks", *[choice.kernel_for(b) for b in buckets], style="green")
    t.add_row("float32 picks", *[exact.kernel_for(b) for b in buckets], style="dim")
    t.caption = f"cached in {cache}"
    return t


def unavailable(device: str) -> str | None:
    """Why the Triton kernels cannot be timed on `device` (None: they can)."""
    from corps.engine.kernels import interpreting, triton_available

    if device.startswith("cuda") and not torch.cuda.is_available():
        return (
            "no CUDA device: kernel timings need a GPU, skipped. The kernels are verified "
            "on CPU by the test suite (Triton's interpreter against torch references)."
        )
    if not triton_available():
        return "the kernels need Triton: pip install 'corps[cuda]'"
    if not device.startswith("cuda") and not interpreting():
        return f"--device {device} runs Triton through its interpreter: set TRITON_INTERPRET=1"
    return None


def cpu_kernels(model_dir, remeasure: bool) -> tuple[Any, bool]:
    """The table of the CPU product kernels `dtype="auto"` chooses from for the model in
    `model_dir` (timed once per machine, cached; `remeasure` times them again), and
    whether they were timed now."""
    from corps.engine.model import tuning
    from corps.engine.model.names import corps_home
    from corps.engine.model.weights import read_spec

    spec = read_spec(model_dir)
    cache = corps_home() / "kernels"
    if remeasure:
        shapes = tuning.step_shapes(spec)
        path = cache / f"{tuning.machine_key(shapes, tuning.available())}.json"
        path.unlink(missing_ok=True)
    timings, path, fresh = tuning.cached_timings(spec, cache)
    choice = tuning.choose_fastest(timings)
    exact = tuning.choose(timings, tuning.EXACT)
    table = cpu_table(timings, choice, cpu=tuning.cpu_name(), cache=str(path), exact=exact)
    return table, fresh
