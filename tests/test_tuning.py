"""engine/model/tuning.py: kernels chosen by measurement, with faked timings for other CPUs."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.engine.model import tuning
from corps.engine.model.linear import TunedLinear
from corps.engine.model.spec import ModelSpec
from corps.engine.model.tuning import (
    EXACT,
    KERNELS,
    ROW_BUCKETS,
    KernelChoice,
    cached_timings,
    choose,
    measure,
)

from conftest import open_tiny


def fake(fastest: dict[int, str], slow: float = 2.0) -> dict[str, dict[int, float]]:
    """Timings where `fastest[b]` takes 1 s at bucket b and everything else `slow`."""
    return {k: {b: 1.0 if fastest.get(b) == k else slow for b in ROW_BUCKETS} for k in KERNELS}


# What two real machines measured (corps' own tables), reduced to who wins where.
AVX512_BF16 = {
    1: "float16",
    2: "bfloat16-packed",
    **{b: "bfloat16-packed" for b in ROW_BUCKETS[2:]},
}
AVX2_ONLY = {1: "bfloat16", 2: "float32", **{b: "float32" for b in ROW_BUCKETS[2:]}}


@pytest.mark.parametrize("machine", [AVX512_BF16, AVX2_ONLY])
def test_the_fastest_kernel_is_chosen_per_bucket(machine):
    choice = choose(fake(machine), KERNELS)
    assert [choice.kernel_for(b) for b in ROW_BUCKETS] == [machine[b] for b in ROW_BUCKETS]


def test_exact_precision_only_chooses_among_float32_kernels():
    choice = choose(fake(AVX512_BF16), EXACT)
    assert choice.used <= set(EXACT)


def test_rows_map_to_the_smallest_bucket_that_holds_them():
    choice = KernelChoice((1, 4, 16), ("a", "b", "c"))
    assert [choice.kernel_for(r) for r in (1, 2, 4, 5, 16, 17, 999)] == list("abbcccc")


def test_ties_go_to_the_earlier_kernel_and_untimed_buckets_fail():
    timings = {k: {b: 1.0 for b in ROW_BUCKETS} for k in KERNELS}
    assert choose(timings, KERNELS).used == {KERNELS[0]}
    timings = {"float16": {1: math.inf}}
    with pytest.raises(ValueError, match="no allowed kernel was timed"):
        choose(timings, ["float16"], buckets=(1,))


def test_a_far_slower_kernel_is_not_timed_at_larger_buckets(monkeypatch):
    calls = []

    def best(kernel, shapes, held, xs, repeats, clock):
        rows = next(iter(xs.values())).shape[0]
        calls.append((kernel, rows))
        return {"float16": 10.0, "float32": 1.0, "float32-t": 30.0}.get(kernel, 0.5)

    monkeypatch.setattr(tuning, "_best", best)
    buckets = (1, 16, 32, 64)  # given up from GIVE_UP_ROWS (16) on, never below
    out = measure([(8, 4, 2)], ["float16", "bfloat16", "float32", "float32-t"], buckets)
    assert out["float16"] == {1: 10.0, 16: 10.0, 32: math.inf, 64: math.inf}  # 10x float32
    assert ("float16", 32) not in calls and ("bfloat16", 64) in calls
    assert set(out["float32-t"].values()) == {30.0}  # exact kernels are always timed


def test_measuring_times_every_kernel_on_the_real_products():
    out = measure([(16, 8, 3), (4, 8, 1)], list(tuning.available()), (1, 3), repeats=1)
    assert set(out) == set(tuning.available())
    assert all(math.isfinite(by[1]) and by[1] >= 0 for by in out.values())  # all timed at 1
    assert all(t >= 0 for by in out.values() for t in by.values())  # (inf: given up on)


SPEC = ModelSpec(64, 2, 4, 2, 8, 1e-5, 128, False, hidden_size=32, intermediate_size=48)


def test_timings_are_measured_once_per_machine_and_cached(tmp_path, monkeypatch):
    measured = []

    def measure_fn(shapes, kernels):
        measured.append(shapes)
        return fake(AVX2_ONLY)

    t1, path, fresh = cached_timings(SPEC, tmp_path, measure_fn=measure_fn)
    t2, path2, fresh2 = cached_timings(SPEC, tmp_path, measure_fn=measure_fn)
    assert (fresh, fresh2, path == path2, len(measured)) == (True, False, True, 1)
    assert t1 == t2 and json.loads(path.read_text())["timings"]
    assert measured[0][-1] == (64, 32, 1)  # the LM head is one of the products
    # another CPU (its flags differ) measures anew
    monkeypatch.setattr(tuning, "_cpu_info", lambda: {"model_name": "other", "flags": "avx2"})
    _, other, fresh3 = cached_timings(SPEC, tmp_path, measure_fn=measure_fn)
    assert fresh3 and other != path and len(measured) == 2
    # a damaged cache file is measured again, not trusted
    other.write_text("{not json")
    assert cached_timings(SPEC, tmp_path, measure_fn=measure_fn)[2]


def test_a_kernel_that_wins_by_little_is_not_worth_its_copy_of_the_weights():
    """The AMX Xeon's table: oneDNN's prepacked bfloat16 fastest up to 64 rows, plain
    bfloat16 at 512 by 4%: one layout is kept, not two. At 10% both are."""
    timings = fake({b: "bfloat16-packed" for b in ROW_BUCKETS})
    timings["bfloat16"][512] = 1.0
    timings["bfloat16-packed"][512] = 1.04
    assert choose(timings, KERNELS).used == {"bfloat16-packed"}
    assert choose(timings, KERNELS, tolerance=0).kernel_for(512) == "bfloat16"
    timings["bfloat16-packed"][512] = 1.10
    assert choose(timings, KERNELS).used == {"bfloat16-packed", "bfloat16"}


_TIMES = st.floats(min_value=1.0, max_value=3.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_TIMES, min_size=7, max_size=7), min_size=2, max_size=4),
       st.sampled_from([0.0, 0.05, 0.3]))  # fmt: skip
def test_fewer_layouts_stays_within_the_tolerance_and_cannot_drop_more(rows, tolerance):
    kernels = KERNELS[: len(rows)]
    timings = {
        k: dict(zip(ROW_BUCKETS, r, strict=True)) for k, r in zip(kernels, rows, strict=True)
    }
    picked = choose(timings, kernels, tolerance=tolerance)
    fastest = {b: min(timings[k][b] for k in kernels) for b in ROW_BUCKETS}
    for b, k in zip(ROW_BUCKETS, picked.kernels, strict=True):
        assert timings[k][b] <= fastest[b] * (1 + tolerance)  # never worse than allowed
    if tolerance == 0:
        chosen = zip(ROW_BUCKETS, picked.kernels, strict=True)
        assert all(timings[k][b] == fastest[b] for b, k in chosen)
    for k in picked.used:  # no kept kernel could go: some bucket of its needs it
        others = picked.used - {k}
        needs = [b for b, p in zip(ROW_BUCKETS, picked.kernels, strict=True) if p == k]
        assert not others or any(
            min(timings[o][b] for o in others) > fastest[b] * (1 + tolerance) for b in needs
        )


def test_processes_measuring_at_once_each_write_the_cache(tmp_path, monkeypatch):
    """Workers starting together on a new machine all measure and write the same
    cache file: each through a temporary file of its own (they once shared one, and
    the second rename found it gone: FileNotFoundError)."""
    import threading
    from pathlib import Path

    both = threading.Barrier(2, timeout=10)
    rename = Path.replace

    def replace_together(self, target):  # both writers are between write and rename
        both.wait()
        return rename(self, target)

    monkeypatch.setattr(Path, "replace", replace_together)
    errors = []

    def worker() -> None:
        try:
            cached_timings(SPEC, tmp_path, measure_fn=lambda *a: fake(AVX2_ONLY))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [p.suffix for p in tmp_path.iterdir()] == [".json"]  # no temporary left


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_kernel_stays_within_16_bit_rounding_of_float32(kernel):
    if kernel not in tuning.available():
        pytest.skip(f"{kernel} is not available here")
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g) * 0.05, torch.randn(96, generator=g)
    lin = TunedLinear.of(w, b, KernelChoice((1, 512), (kernel, kernel)))
    for rows in (1, 5):
        x = torch.randn(rows, 64, generator=g)
        ref = F.linear(x, w, b)
        got = lin(x)
        assert got.dtype == torch.float32 and got.shape == ref.shape
        bound = 0.0 if kernel in EXACT else 0.01
        assert (got - ref).abs().max() <= bound * ref.abs().max() + 1e-5


def test_a_projection_holds_only_the_layouts_it_uses():
    w = torch.randn(32, 16)
    lin = TunedLinear.of(w, None, KernelChoice((1, 512), ("float16", "float32")))
    assert set(lin.layouts) == {"float16", "float32"}
    assert lin.kernel_for(1) == "float16" and lin.kernel_for(2) == lin.kernel_for(999) == "float32"
    assert lin.weight_bytes == 32 * 16 * (2 + 4)


@pytest.mark.parametrize("machine", [AVX512_BF16, AVX2_ONLY])
async def test_an_auto_engine_follows_the_choice_and_stays_within_the_bound(
    tiny_dirs, tmp_path, monkeypatch, machine
):
    """dtype="auto" with another machine's timings: its projections use that machine's
    choice, and it decodes what float32 decodes up to 16-bit rounding."""
    monkeypatch.setenv("CORPS_HOME", str(tmp_path))
    monkeypatch.setattr(tuning, "measure", lambda shapes, kernels: fake(machine))
    monkeypatch.setattr("corps.engine.api.build.measure", lambda *a, **k: fake(machine))
    available = set(tuning.available())
    if not set(machine.values()) <= available:
        pytest.skip("this torch lacks a kernel that machine chose")
    async with open_tiny(tiny_dirs, "qwen2", dtype="auto") as engine:
        qkv = engine.executor.runner.w.layers[0].qkv
        assert [qkv.kernel_for(b) for b in ROW_BUCKETS] == [machine[b] for b in ROW_BUCKETS]
        q = await engine.prefill("the quick brown fox jumps over the lazy dog")
        auto = await engine.decode(parents=[q], max_tokens=4, ignore_eos=True)
    async with open_tiny(tiny_dirs, "qwen2", dtype="float32") as engine:
        q = await engine.prefill("the quick brown fox jumps over the lazy dog")
        exact = await engine.decode(parents=[q], max_tokens=4, ignore_eos=True)
    assert len(auto.generated) == len(exact.generated) == 4
    assert list((tmp_path / "kernels").glob("*.json"))  # cached for the next load


def test_a_choices_products_interpolate_its_kernels_timings_between_buckets():
    timings = {"float16": {1: 0.010, 2: 0.015, 4: math.inf}, "packed": {1: 1.0, 2: 1.0, 4: 0.014}}
    timings["packed"][8] = 0.016
    choice = KernelChoice((1, 2, 4, 8), ("float16", "float16", "packed", "packed"), timings)
    assert choice.products(1) == 0.010
    assert choice.products(2) == 0.015
    assert choice.products(3) == pytest.approx(0.5 * (1.0 + 0.014))  # packed's own timings
    assert choice.products(6) == pytest.approx(0.015)
    assert choice.products(16) == pytest.approx(0.032)  # beyond the last: in proportion
    assert KernelChoice((1,), ("float32",)).products(5) == 5.0  # untimed: the rows
