"""`corps bench account`: where a workflow's time goes, phase by phase, in both modes.

For each pattern, one engine per mode (baseline, choreographed), on equal work (the
baseline's decoded tokens forced on the choreographed run, `corps.patterns.replay`),
each run as cold as the first (`Engine.reset_prefix_cache` before it: the same
inputs again would otherwise find the baseline's whole prompts cached, and the
choreographed repair bound at nothing):

1. a warm-up run of each mode (compiles, captures, first allocations): its wall
   only (`first_wall_s`), against which the timed run's shows what they cost;
2. a timed run under the per-phase account (`corps.engine.exec.phases`): per phase
   its entries, host seconds and, on CUDA, device seconds (CUDA events, no sync in
   between); what no phase holds is the wall time less the phases' sum ("outside":
   the event loop, the scheduler, the workflow's code, and on CUDA the device idle
   while the host works between steps);
3. a counted run: the kernel launches per phase as the op counter counts torch calls
   (`corps.engine.kernels.op_count`, the CPU's proxy for a GPU's launches), and on
   CUDA, in the same run, the kernels the profiler saw launched in each phase's
   ranges (so the proxy can be checked against the device). A CUDA graph's replay is
   one torch call to the counter and all its kernels to the profiler.

Each (pattern, mode) is one `ModeAccount`, written as a JSON line as soon as it is
measured. Nothing is asserted on the figures: they are the account.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AsyncExitStack, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console
from rich.table import Table

from corps.bench.workflow import sample_of
from corps.engine.exec.phases import PHASES

MODES = ("baseline", "choreographed")


@dataclass
class ModeAccount:
    """One pattern's run in one mode, phase by phase (dicts keyed by phase)."""

    pattern: str
    mode: str
    device: str
    wall_s: float
    ttft_s: float  # mean time to first token of its decode calls
    calls: int
    encoded: int  # tokens run through the model
    first_wall_s: float = 0.0  # the warm-up run's wall (compiles and captures in it)
    entries: dict[str, int] = field(default_factory=dict)
    host_s: dict[str, float] = field(default_factory=dict)
    device_s: dict[str, float] = field(default_factory=dict)  # CUDA only
    launches: dict[str, int] = field(default_factory=dict)  # op counter (counted run)
    kernels: dict[str, int] = field(default_factory=dict)  # profiler, CUDA only
    count_error: str = ""  # why the counted run failed, if it did (the timed run stands)

    @property
    def outside_s(self) -> float:
        """Wall time no phase holds: on CUDA the device's, elsewhere the host's."""
        return self.wall_s - sum((self.device_s or self.host_s).values())


class Ran(NamedTuple):
    """One mode's run in a pass: the pattern's result, what its wrapper measured, and
    its wall time."""

    result: Any  # corps.patterns.result.PatternResult
    measured: Any
    wall_s: float


async def _pass(
    runtimes: dict[str, Any], pattern: str, params: dict, wrap: Callable
) -> dict[str, Ran]:
    """One run per mode on equal work, each inside `wrap(mode)` (an async context
    manager yielding what it measures)."""
    from corps.patterns.registry import run_pattern
    from corps.patterns.replay import Replay

    replay, out = Replay(), {}
    for mode, rt in runtimes.items():
        await rt.engine.reset_prefix_cache()  # each run as cold as the first
        with (replay if mode == "baseline" else replay.forcing()).active():
            async with wrap(mode) as measured:
                t0 = time.perf_counter()
                result = await run_pattern(rt, pattern, params)
                wall = time.perf_counter() - t0
        out[mode] = Ran(result, measured, wall)
    return out


class _Counted:
    """The counted run's context: the op counter per phase and, on CUDA, the profiler
    over the same run."""

    def __init__(self, device: str, profile: bool) -> None:
        self.device, self.profile = device, profile and device.startswith("cuda")
        self.kernels: dict[str, int] = {}
        self._stack = AsyncExitStack()

    async def __aenter__(self):
        from corps.engine.exec.instruments import accounting, profiling

        self.account = await self._stack.enter_async_context(
            accounting(self.device, count_ops=True, labels=self.profile)
        )
        self.prof = None
        if self.profile:
            self.prof = await self._stack.enter_async_context(profiling(cuda=True))
        return self

    async def __aexit__(self, *exc) -> None:
        await self._stack.__aexit__(*exc)
        if self.prof is not None:
            from corps.engine.exec.phases import kernels_by_phase

            self.kernels = dict(kernels_by_phase(self.prof.events()))


#: what the counted run counts: nothing (no counted run), the op counter's launches,
#: or those and (on CUDA) the profiler's kernels
COUNTS = ("none", "ops", "kernels")


async def account_pattern(
    runtimes: dict[str, Any], pattern: str, params: dict[str, Any], device: str,
    count: str = "kernels",
) -> list[ModeAccount]:  # fmt: skip
    """The warm-up, timed and counted (`count`, of COUNTS) runs of one pattern in each
    mode of `runtimes` ({mode: Runtime}, baseline first). A profiled run's events take
    a while to read on a large model (a kernel each: ~1,000 a decode step at 32 layers)."""
    from corps.engine.exec.instruments import accounting

    first = await _pass(runtimes, pattern, params, lambda mode: nullcontext())
    timed = await _pass(runtimes, pattern, params, lambda mode: accounting(device))
    counted, count_error = {}, ""
    if count != "none":
        profile = count == "kernels"
        try:
            counted = await _pass(runtimes, pattern, params, lambda m: _Counted(device, profile))
        except Exception as exc:  # the timed figures stand; the row says why it has no counts
            count_error = repr(exc)
    out = []
    for mode, (result, account, wall) in timed.items():
        seen = sample_of(result)  # its calls and their mean TTFT, as `bench workflow` has them
        c = counted[mode].measured if mode in counted else None
        out.append(ModeAccount(
            pattern, mode, device, wall, seen.ttft_s, calls=seen.calls,
            encoded=result.tokens_encoded, first_wall_s=first[mode].wall_s,
            entries=dict(account.entries),
            host_s=dict(account.host_s), device_s=dict(account.device_s),
            launches=dict(c.account.launches) if c else {},
            kernels=c.kernels if c else {}, count_error=count_error,
        ))  # fmt: skip
    return out


async def measure(
    model: str, patterns: list[str], *, max_tokens: int, device: str, dtype: str,
    count: str = "kernels", out: Path | None = None, engine_kw: dict[str, Any] | None = None,
    console: Console | None = None,
) -> tuple[list[ModeAccount], dict[str, str]]:  # fmt: skip
    """Every pattern's account in both modes (one engine per mode, shared by the
    patterns), each row to `out` (JSON lines) and each pattern's table to `console`
    as soon as it is measured; (the rows, {pattern: error} of the patterns that
    failed: the others still run)."""
    import warnings

    from corps.agents import Runtime
    from corps.cache.visibility import LeakWarning
    from corps.engine import Engine

    rows: list[ModeAccount] = []
    errors: dict[str, str] = {}

    def write(line: dict) -> None:
        if out is not None:
            with out.open("a") as f:
                f.write(json.dumps({"section": "account", **line}) + "\n")

    async with AsyncExitStack() as stack:
        runtimes = {}
        for mode in MODES:
            engine = await stack.enter_async_context(
                Engine.open(model, mode=mode, dtype=dtype, device=device, **(engine_kw or {}))
            )
            runtimes[mode] = await stack.enter_async_context(Runtime(engine))
        for pattern in patterns:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", LeakWarning)  # the dilemma leaks on purpose
                    got = await account_pattern(
                        runtimes, pattern, {"max_tokens": max_tokens, "seed": 0}, device, count
                    )
            except Exception as exc:  # reported as the pattern's error; the others run
                errors[pattern] = repr(exc)
                write({"pattern": pattern, "error": repr(exc)})
                continue
            for row in got:
                rows.append(row)
                write({**asdict(row), "outside_s": row.outside_s})
            if console is not None:
                console.print(table(pattern, got))
    return rows, errors


def table(pattern: str, rows: list[ModeAccount]) -> Table:
    """One pattern's account: a row per phase, time and launches per mode side by side."""
    by = {r.mode: r for r in rows if r.pattern == pattern}
    cuda = any(r.device_s for r in by.values())
    unit = "device ms" if cuda else "host ms"
    t = Table(title=f"{pattern}: where the time goes (equal work)")
    t.add_column("phase")
    for mode in by:
        t.add_column(f"{mode} {unit}", justify="right")
        t.add_column(f"{mode} launches", justify="right")
        if cuda:
            t.add_column(f"{mode} kernels", justify="right")
    for name in (*PHASES, "outside", "wall"):
        if name not in ("outside", "wall") and not any(name in r.entries for r in by.values()):
            continue
        cells = []
        for r in by.values():
            secs = (r.device_s or r.host_s).get(name, 0.0)
            if name == "outside":
                secs = r.outside_s
            elif name == "wall":
                secs = r.wall_s
            launches = sum(r.launches.values()) if name == "wall" else r.launches.get(name)
            cells += [f"{secs * 1e3:,.1f}", "" if launches is None else f"{launches:,}"]
            if cuda:
                k = sum(r.kernels.values()) if name == "wall" else r.kernels.get(name)
                cells.append("" if k is None else f"{k:,}")
        t.add_row(name, *cells)
    return t
