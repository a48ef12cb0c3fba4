"""Choosing each projection's product kernel by measurement on this machine.

Which kernel computes `x @ W^T` fastest depends on the CPU (AVX2 only, AVX-512,
bfloat16 units, AMX), the torch build and the number of rows a step brings: on
one AVX-512 machine float16 was fastest for one row and bfloat16 twice slower;
on an AVX2 one bfloat16 was fastest. So instead of a table written on one
machine, `dtype="auto"` times every candidate on the model's own projection
shapes for the row counts a step uses (`ROW_BUCKETS`), once per machine, and
keeps the fastest per bucket, except that each kernel reads a layout of its own
(one more copy of every weight), so a kernel is dropped where another one kept
for other buckets is within `LAYOUT_TOLERANCE` of it. The timings are cached under
`$CORPS_HOME/kernels/`, keyed by the CPU (model name and flags), the torch
version, the thread count and the model's shapes; `corps bench kernels --cpu`
prints them.

Candidates (activations stay float32; only the weights' format changes):

- `float32-t`: float32 W stored transposed, `x @ W^T` (exact);
- `float32`: float32 `F.linear` (exact);
- `float32-packed`: float32 W in oneDNN's blocked layout (exact; where oneDNN works);
- `float16`, `bfloat16`: 16-bit W, x cast in and the result cast out;
- `bfloat16-packed`: bfloat16 W in oneDNN's blocked layout (where oneDNN works).

"Exact" kernels compute in float32 (their sums may be ordered differently, so they
agree with `F.linear` to float32 rounding, not bit for bit). `dtype="float32"` on a
CPU chooses among them the same way, from the same timings.

The precision bound of "auto" is that of 16-bit weights (the `mixed` dtype):
float32 everywhere else, and logits within 16-bit rounding of float32 (tested:
every kernel, every bucket, within 5% of the largest logit for a prompt and 0.5%
for one row on the test models). `float32` stays exact and one flag away.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from corps.engine.model.onednn import onednn_pack, packed_product
from corps.engine.model.spec import ModelSpec

#: Row counts a step brings that get their own choice; a step of r rows uses the
#: smallest bucket >= r (the largest beyond it).
ROW_BUCKETS = (1, 2, 4, 8, 16, 64, 512)
#: Every candidate kernel, in the order the table prints them.
KERNELS = ("float32-t", "float32", "float32-packed", "float16", "bfloat16", "bfloat16-packed")
#: Kernels that compute in float32 (what dtype="float32" chooses among).
EXACT = ("float32-t", "float32", "float32-packed")
#: Kernels reading W in oneDNN's blocked layout, and the dtype it is held in.
PACKED = {"float32-packed": torch.float32, "bfloat16-packed": torch.bfloat16}
#: A 16-bit kernel slower than this many times the best timed before it at a bucket
#: of at least GIVE_UP_ROWS rows is not timed at larger buckets (a float16 gemm of
#: 512 rows on a CPU without float16 units takes seconds). Below that, a kernel slow
#: for one row may still win at more (plain bfloat16 gemms, 3x float16's one row).
GIVE_UP = 2.0
GIVE_UP_ROWS = 16

#: A kernel is kept only for buckets where it is faster than every other kernel kept
#: by more than this share: each kernel reads its own copy of the weights (on the
#: AMX Xeon, plain bfloat16 won only 512 rows, by 4%, for 270 MB more).
LAYOUT_TOLERANCE = 0.05

Timings = dict[str, dict[int, float]]  # kernel -> rows -> seconds for a step's products


@dataclass(frozen=True)
class KernelChoice:
    """The kernel each row bucket uses, and the timings it was chosen from."""

    buckets: tuple[int, ...]
    kernels: tuple[str, ...]  # one per bucket
    timings: Timings = field(default_factory=dict, compare=False)

    def kernel_for(self, rows: int) -> str:
        for bucket, kernel in zip(self.buckets, self.kernels, strict=True):
            if rows <= bucket:
                return kernel
        return self.kernels[-1]

    @property
    def used(self) -> frozenset[str]:
        return frozenset(self.kernels)

    def products(self, rows: int) -> float:
        """Seconds of a step's products over `rows` rows at the kernels chosen: the
        kernel of `rows`' bucket, its timings interpolated linearly between the
        buckets around `rows` (beyond the last, in proportion to it)."""
        kernel = self.kernel_for(rows)
        times = self.timings.get(kernel, {})
        known = [(b, times[b]) for b in self.buckets if math.isfinite(times.get(b, math.inf))]
        if not known:
            return float(rows)  # no timing: rows as the measure
        below = [(b, t) for b, t in known if b <= rows]
        above = [(b, t) for b, t in known if b >= rows]
        if not above:
            b, t = below[-1]
            return t * rows / b
        if not below:
            return above[0][1]
        (b0, t0), (b1, t1) = below[-1], above[0]
        return t0 if b1 == b0 else t0 + (t1 - t0) * (rows - b0) / (b1 - b0)


def rows_within(choice: KernelChoice, slowdown: float) -> int:
    """The most rows (a bucket) whose step's products, at the kernels `choice`
    uses, take at most `slowdown` times one row's: what a step may hold beside a
    latency-critical decode (`corps.engine.sched.policies`). The products alone are the
    conservative measure: a step's fixed cost only shrinks the ratio."""
    one = choice.timings.get(choice.kernel_for(1), {}).get(1, math.inf)
    rows = 1
    for b in choice.buckets:
        if choice.timings.get(choice.kernel_for(b), {}).get(b, math.inf) <= slowdown * one:
            rows = b
    return rows


def choose(
    timings: Timings,
    allowed: Sequence[str],
    buckets=ROW_BUCKETS,
    tolerance: float = LAYOUT_TOLERANCE,
) -> KernelChoice:
    """The fastest allowed kernel per bucket (ties: the earlier in KERNELS), then as
    few kernels as that allows within `tolerance` (`fewer_layouts`)."""
    picks = []
    for b in buckets:
        times = [(timings.get(k, {}).get(b, math.inf), KERNELS.index(k), k) for k in allowed]
        best = min(times)
        if math.isinf(best[0]):
            raise ValueError(f"no allowed kernel was timed at {b} rows")
        picks.append(best[2])
    picks = fewer_layouts(tuple(buckets), picks, timings, tolerance)
    return KernelChoice(tuple(buckets), tuple(picks), timings)


def fewer_layouts(
    buckets: tuple[int, ...], picks: list[str], timings: Timings, tolerance: float
) -> list[str]:
    """`picks` (the fastest kernel per bucket) with kernels dropped, the one picked
    for fewest buckets first, while each of its buckets has another kernel still
    picked within `tolerance` of that bucket's fastest time; the fastest such
    kernel takes the bucket. Every bucket stays within `tolerance` of its fastest."""

    def t(kernel: str, bucket: int) -> float:
        return timings.get(kernel, {}).get(bucket, math.inf)

    fastest = [t(k, b) for k, b in zip(picks, buckets, strict=True)]

    def takers(k: str, picks: list[str]) -> dict[int, str] | None:
        """For each bucket of k, the fastest other kernel picked, if every one is
        within `tolerance` of the bucket's fastest; else None."""
        others = sorted(set(picks) - {k}, key=KERNELS.index)
        moves = {}
        for i, b in enumerate(buckets):
            if picks[i] == k:
                moves[i] = min(others, key=lambda o, b=b: t(o, b))
                if t(moves[i], b) > fastest[i] * (1 + tolerance):
                    return None
        return moves

    picks = list(picks)
    while len(set(picks)) > 1:
        rarest_first = sorted(set(picks), key=lambda k: (picks.count(k), KERNELS.index(k)))
        moves = next((m for k in rarest_first if (m := takers(k, picks))), None)
        if moves is None:
            return picks
        for i, kernel in moves.items():
            picks[i] = kernel
    return picks


def available(device: torch.device | str = "cpu") -> tuple[str, ...]:
    """The candidates this torch can run here."""

    def works(kernel: str) -> bool:
        if kernel not in PACKED:
            return True
        return onednn_pack(torch.zeros(16, 16, dtype=PACKED[kernel], device=device)) is not None

    return tuple(k for k in KERNELS if works(k))


def layouts(w: Tensor, kernels: frozenset[str] | set[str]) -> dict[str, Tensor]:
    """The weight layouts those kernels read, from W (N, K) float32."""
    out: dict[str, Tensor] = {}
    if "float32-t" in kernels:
        out["float32-t"] = w.t().contiguous()  # (K, N)
    if "float32" in kernels:
        out["float32"] = w
    if "float16" in kernels:
        out["float16"] = w.to(torch.float16)
    if "bfloat16" in kernels:
        out["bfloat16"] = w.to(torch.bfloat16)
    for kernel, dtype in PACKED.items():
        if kernel in kernels:
            out[kernel] = onednn_pack(w.to(dtype))
    return out


def product(kernel: str, x: Tensor, w: Tensor) -> Tensor:
    """x (M, K) float32 times the layout `w` of `kernel`: (M, N) float32, no bias."""
    if kernel == "float32-t":
        return x @ w
    if kernel == "float32":
        return F.linear(x, w)
    if kernel == "float32-packed":
        return packed_product(x, w)
    if kernel == "bfloat16-packed":
        return packed_product(x.to(torch.bfloat16), w).to(x.dtype)
    return F.linear(x.to(w.dtype), w).to(x.dtype)  # float16 / bfloat16


def step_shapes(spec: ModelSpec) -> list[tuple[int, int, int]]:
    """(N, K, how many) of the products of one forward step: each layer's fused QKV,
    output, fused gate-up and down projections, and the LM head."""
    e, d, i = spec.hidden_size, spec.head_dim, spec.intermediate_size
    qkv = (spec.num_heads + 2 * spec.num_kv_heads) * d
    n = spec.num_layers
    return [
        (qkv, e, n),
        (e, spec.num_heads * d, n),
        (2 * i, e, n),
        (e, i, n),
        (spec.vocab_size, e, 1),
    ]


def measure(
    shapes: Sequence[tuple[int, int, int]],
    kernels: Sequence[str],
    buckets: Sequence[int] = ROW_BUCKETS,
    *,
    repeats: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> Timings:
    """Seconds of one step's products per kernel and bucket, best of `repeats`.

    Each shape gets as many distinct weights as the step has (its count), so the
    weights stream from memory as in a real step instead of sitting in cache (a
    one-row product is bound by those reads). One kernel's layouts are held at a
    time, in KERNELS order (the exact ones first). A 16-bit kernel more than GIVE_UP
    times slower than the best timed before it at a bucket of GIVE_UP_ROWS rows or
    more is not timed at larger ones (inf there); the exact ones always are (the
    float32 choice needs them)."""
    g = torch.Generator().manual_seed(0)
    xs = {(r, s): torch.randn(r, s[1], generator=g) for r in buckets for s in shapes}
    out: Timings = {k: {} for k in kernels}
    for k in sorted(kernels, key=KERNELS.index):
        held = {s: [layouts(_weight(s, g), {k})[k] for _ in range(s[2])] for s in shapes}
        given_up = False
        for rows in buckets:
            if given_up:
                out[k][rows] = math.inf
                continue
            by_shape = {s: xs[(rows, s)] for s in shapes}
            out[k][rows] = _best(k, shapes, held, by_shape, repeats, clock)
            best = min(out[j].get(rows, math.inf) for j in kernels)
            slow = out[k][rows] > GIVE_UP * best and rows >= GIVE_UP_ROWS
            given_up = k not in EXACT and slow
        del held
    return out


def _weight(shape: tuple[int, int, int], g: torch.Generator) -> Tensor:
    return torch.randn(shape[0], shape[1], generator=g) * 0.02  # (N, K)


def _best(kernel, shapes, held, xs, repeats: int, clock) -> float:
    """Best of `repeats` runs of every weight of every shape (one step's products)."""
    product(kernel, xs[shapes[0]], held[shapes[0]][0])  # warm up (oneDNN primitives)
    best = math.inf
    for _ in range(repeats):
        t0 = clock()
        for s in shapes:
            x = xs[s]
            for w in held[s]:
                product(kernel, x, w)
        best = min(best, clock() - t0)
    return best


def machine_key(shapes: Sequence[tuple[int, int, int]], kernels: Sequence[str]) -> str:
    """What the timings depend on: this CPU (model and flags), torch, the threads,
    the shapes and the candidates."""
    cpu = _cpu_info()
    blob = json.dumps(
        dict(
            cpu=cpu,
            torch=torch.__version__,
            threads=torch.get_num_threads(),
            shapes=[list(s) for s in shapes],
            kernels=list(kernels),
            buckets=list(ROW_BUCKETS),
        ),
        sort_keys=True,
    )
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _cpu_info() -> dict[str, str]:
    """The CPU's model name and feature flags (Linux /proc/cpuinfo; else platform)."""
    info = {"machine": platform.machine(), "model": platform.processor(), "flags": ""}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not info.get("model_name"):
            info["model_name"] = value.strip()
        elif key in ("flags", "Features") and not info["flags"]:
            info["flags"] = " ".join(sorted(value.split()))
    return info


def cpu_name() -> str:
    """A short name of this CPU for tables."""
    info = _cpu_info()
    return info.get("model_name") or info.get("model") or info["machine"]


def cached_timings(
    spec: ModelSpec,
    cache_dir: Path,
    *,
    kernels: Sequence[str] | None = None,
    measure_fn: Callable[..., Timings] = measure,
) -> tuple[Timings, Path, bool]:
    """This machine's timings for the model's shapes: read from `cache_dir`, or
    measured now and written there. Returns (timings, the cache file, measured now)."""
    kernels = tuple(kernels or available())
    shapes = step_shapes(spec)
    path = cache_dir / f"{machine_key(shapes, kernels)}.json"
    try:
        data = json.loads(path.read_text())
        return _timings_from_json(data["timings"]), path, False
    except (OSError, ValueError, KeyError, TypeError):
        pass
    timings = measure_fn(shapes, kernels)
    cache_dir.mkdir(parents=True, exist_ok=True)
    record = dict(cpu=cpu_name(), torch=torch.__version__, timings=_timings_to_json(timings))
    _write_atomically(path, json.dumps(record, indent=1))
    return timings, path, True


def _write_atomically(path: Path, text: str) -> None:
    """`text` into `path` by a rename: a concurrent reader never sees half a file,
    and processes measuring at once (workers starting on a new machine) each
    write a temporary file of their own, so no rename loses the other's."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def choose_fastest(timings: Timings) -> KernelChoice:
    """The fastest kernel per bucket among every candidate that was timed."""
    timed = [k for k, by_rows in timings.items() if any(map(math.isfinite, by_rows.values()))]
    return choose(timings, timed)


def auto_choice(spec: ModelSpec, cache_dir: Path, **kw) -> KernelChoice:
    """The fastest kernel per bucket among every candidate available here."""
    timings, _, _ = cached_timings(spec, cache_dir, **kw)
    return choose_fastest(timings)


def weight_format(
    dtype: str, spec: ModelSpec, device: str, cache_dir: Path, **kw
) -> tuple[bool, KernelChoice | None]:
    """How `dtype` holds the projections' weights: (mixed, measured choice). On a CPU,
    "auto" is the fastest choice measured here and "float32" the fastest among the
    float32 kernels (`EXACT`), from the same timings; elsewhere "auto" is "mixed" and
    "float32" plain float32; other dtypes neither."""
    on_cpu = str(device).startswith("cpu")
    if dtype == "float32" and on_cpu:
        timings, _, _ = cached_timings(spec, cache_dir, **kw)
        return False, choose(timings, [k for k in EXACT if k in timings])
    if dtype != "auto":
        return dtype == "mixed", None
    if not on_cpu:
        return True, None
    return False, auto_choice(spec, cache_dir, **kw)


def _timings_to_json(t: Timings) -> dict[str, dict[str, float | None]]:
    return {k: {str(b): (None if math.isinf(s) else s) for b, s in v.items()} for k, v in t.items()}


def _timings_from_json(d: Mapping) -> Timings:
    return {
        k: {int(b): (math.inf if s is None else float(s)) for b, s in v.items()}
        for k, v in d.items()
    }
