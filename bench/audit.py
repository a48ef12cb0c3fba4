"""`corps bench audit`: the online fidelity audit against `corps fidelity`, and its cost.

1. **Agreement.** Each input is sampled in a baseline engine (temperature 1, as
   `corps fidelity` does) and replayed choreographed, forced to the baseline's
   tokens, in an engine that audits every decode (`audit=1`). At the same
   positions (each turn's first `AUDIT_POSITIONS`) and on the same tokens, per
   role: `corps fidelity`'s gap (the baseline's sampled tokens, replay minus
   baseline log-loss: a one-sample estimate of KL(baseline || choreographed))
   beside the audit's (that KL, computed over the whole vocabulary), and both
   modes' argmax agreement: for a pattern's voters, judge or reducer, whether
   they would choose as the baseline does (`--repair`: the replay repaired;
   `--decision-repair`: only the pattern's decision steps, e.g. the voters).
2. **Cost.** Passes over the inputs (the pattern's own settings, seed i for line
   i) in one choreographed engine, unaudited and audited 1 in N for each N,
   interleaved round by round after one untimed pass: the median wall time of
   each (its audits' shadows included: a pass waits for them) against the
   unaudited pass's, the median of each round's ratio to the unaudited pass
   beside it (paired: a machine whose speed drifts between rounds moves both),
   the same for the process's CPU time (`time.process_time`: the work done, which
   time the machine gives to others does not inflate), and the tokens the
   shadows encoded against the pass's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from corps.agents import Runtime
from corps.engine import AUDIT_POSITIONS, Engine, EngineConfig
from corps.patterns.cluster.each import each
from corps.patterns.evaluation.fidelity import Pair, replay, sample, sampling_params, warm
from corps.patterns.registry import run_pattern

out = Console()


async def agreement(
    pattern: str, lines: Sequence[Mapping[str, Any]], seed: int, model: str, dtype: str,
    concurrency: int, repair: str = "none", decision_repair: str = "none", bound: bool = True,
) -> list[dict[str, Any]]:  # fmt: skip
    """Per role (and "all"): turns, positions, the sampled gap, the audit's gap, both
    agreements; repairs capped at the baseline's work unless `bound` is False."""
    params = [sampling_params(pattern, line, seed + i) for i, line in enumerate(lines)]
    base_cfg = EngineConfig.of(model, mode="baseline", dtype=dtype)
    every = dict(audit=1, audit_budget=1.0)  # every decode, no token budget
    chor_cfg = EngineConfig.of(model, mode="choreographed", dtype=dtype, repair=repair,
                               decision_repair=decision_repair, repair_bound=bound,
                               **every)  # fmt: skip
    recorded, pairs = {}, []
    async with Engine.open(base_cfg) as be, Runtime(be) as brt:

        async def sample_one(i: int) -> None:
            recorded[i], _ = await sample(brt, pattern, params[i])

        await each(range(len(lines)), sample_one, concurrency=concurrency)
    async with Engine.open(chor_cfg) as ce, Runtime(ce) as crt:
        await warm(crt, pattern, params, recorded)
        before = (await ce.fidelity_report()).rows

        async def replay_one(i: int) -> None:
            forced, _ = await replay(crt, pattern, params[i], recorded[i])
            pairs.append(Pair(i, recorded[i].scores, forced.scores))

        await each(sorted(recorded), replay_one, concurrency=concurrency)
        after = (await ce.fidelity_report()).rows
    audits = _minus(after, before)
    return _by_role(pairs, audits)


def _minus(after, before) -> dict[str, list[float]]:
    """Per agent: positions, KL sum, agreement sum of the audits made between two
    reports' rows (the warm-up's left out); an agent may have a row per policy."""
    sums: dict[str, list[float]] = {}
    for rows, sign in ((after, 1), (before, -1)):
        for r in rows:
            s = sums.setdefault(r.key.agent, [0, 0.0, 0.0])
            s[0] += sign * r.positions
            s[1] += sign * r.gap * r.positions
            s[2] += sign * r.agreement * r.positions
    return sums


def _by_role(pairs: list[Pair], audits: dict[str, list[float]]) -> list[dict[str, Any]]:
    rows: dict[str, list[float]] = {}  # role -> turns, positions, nll gap sum, agree sum
    k = AUDIT_POSITIONS
    for p in pairs:
        for index, base in p.baseline.items():
            other = p.replayed.get(index)
            if other is None:
                continue
            n = min(k, len(base.logprobs), len(other.logprobs))
            s = rows.setdefault(base.role, [0, 0, 0.0, 0.0])
            s[0] += 1
            s[1] += n
            s[2] += sum(base.logprobs[:n]) - sum(other.logprobs[:n])
            s[3] += sum(a == b for a, b in zip(base.greedy[:n], other.greedy[:n], strict=True))
    out_rows = []
    every = [0, 0, 0.0, 0.0]
    audit_all = [0, 0.0, 0.0]
    for role, s in [*rows.items()]:
        a = audits.get(role, [0, 0.0, 0.0])
        every = [x + y for x, y in zip(every, s, strict=True)]
        audit_all = [x + y for x, y in zip(audit_all, a, strict=True)]
        out_rows.append(_row(role, s, a))
    out_rows.append(_row("all", every, audit_all))
    return out_rows


def _row(role: str, s: list[float], a: list[float]) -> dict[str, Any]:
    nan = float("nan")
    return dict(
        role=role, turns=int(s[0]), positions=int(s[1]),
        sampled_gap=s[2] / s[1] if s[1] else nan, sampled_agree=s[3] / s[1] if s[1] else nan,
        audited_positions=int(a[0]), audit_gap=a[1] / a[0] if a[0] else nan,
        audit_agree=a[2] / a[0] if a[0] else nan,
    )  # fmt: skip


async def cost(
    pattern: str, lines: Sequence[Mapping[str, Any]], seed: int, model: str, dtype: str,
    rates: Sequence[int], rounds: int, concurrency: int, budget: float,
) -> list[dict[str, Any]]:  # fmt: skip
    """Per audit rate (0 first): median wall of a pass, its ratio to the unaudited
    pass's, the tokens encoded by the pass and by its audits, the calls audited
    (under the token budget `budget`)."""
    cfg = EngineConfig.of(model, mode="choreographed", dtype=dtype, audit_budget=budget)
    walls: dict[int, list[float]] = {r: [] for r in [0, *rates]}
    cpus: dict[int, list[float]] = {r: [] for r in walls}
    tokens: dict[int, list[tuple[int, int, int]]] = {r: [] for r in walls}
    async with Engine.open(cfg) as engine, Runtime(engine) as rt:

        async def one_pass(rate: int) -> tuple[float, float, tuple[int, int, int]]:
            s0 = engine.stats()
            t0, c0 = time.perf_counter(), time.process_time()
            with engine.workflow("bench-audit", audit=rate):

                async def one(i: int) -> None:
                    await run_pattern(rt, pattern, {**lines[i], "seed": seed + i})

                await each(range(len(lines)), one, concurrency=concurrency)
            await engine.fidelity_report()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            s1 = engine.stats()
            audit = s1.audit_tokens - s0.audit_tokens
            encoded = s1.tokens_encoded - s0.tokens_encoded - audit
            return wall, cpu, (encoded, audit, s1.audited - s0.audited)

        await one_pass(0)  # untimed: the process's warm-up
        for _ in range(rounds):
            for rate in walls:
                wall, cpu, counts = await one_pass(rate)
                walls[rate].append(wall)
                cpus[rate].append(cpu)
                tokens[rate].append(counts)
    base = statistics.median(walls[0])
    return [
        dict(
            audit=rate,
            wall_s=statistics.median(w),
            ratio=statistics.median(w) / base,
            paired=_paired(w, walls[0]),
            cpu_s=statistics.median(cpus[rate]),
            cpu_paired=_paired(cpus[rate], cpus[0]),
            walls=w,
            cpus=cpus[rate],
            tokens_encoded=sum(t[0] for t in tokens[rate]) / rounds,
            audit_tokens=sum(t[1] for t in tokens[rate]) / rounds,
            audited=sum(t[2] for t in tokens[rate]) / rounds,
            budget=budget,
        )
        for rate, w in walls.items()
    ]


def _paired(times: Sequence[float], base: Sequence[float]) -> tuple[float, float, float]:
    """Each round's time over the unaudited pass's of the same round: (median, lowest,
    highest)."""
    ratios = sorted(t / b for t, b in zip(times, base, strict=True) if b > 0)
    if not ratios:
        return (float("nan"),) * 3
    return statistics.median(ratios), ratios[0], ratios[-1]


def show(
    pattern: str, agree: list[dict[str, Any]], costs: list[dict[str, Any]], repair: str = "none"
) -> None:
    if agree:
        _agreement_table(pattern, agree, repair)
    if costs:
        _cost_table(pattern, costs)


def _agreement_table(pattern: str, agree: list[dict[str, Any]], repair: str) -> None:
    title = (f"{pattern}: the audit's gap against corps fidelity's, first {AUDIT_POSITIONS} "
             f"positions of each turn, the same tokens (repair {repair})")  # fmt: skip
    t = Table(title=title, title_justify="left")
    for col in ("role", "turns", "positions", "fidelity gap", "audit gap", "fidelity agree",
                "audit agree"):  # fmt: skip
        t.add_column(col, justify="left" if col == "role" else "right")
    for r in agree:
        t.add_row(r["role"], str(r["turns"]), f"{r['positions']} / {r['audited_positions']}",
                  f"{r['sampled_gap']:.4f}", f"{r['audit_gap']:.4f}",
                  f"{r['sampled_agree']:.0%}", f"{r['audit_agree']:.0%}")  # fmt: skip
    out.print(t)
    out.print("[dim]fidelity gap: the baseline's sampled tokens, replay minus baseline "
              "log-loss (a one-sample estimate of KL(baseline || choreographed)); audit gap: "
              "that KL over the vocabulary; positions: sampled / audited[/]")  # fmt: skip


def _cost_table(pattern: str, costs: list[dict[str, Any]]) -> None:
    budget = costs[0]["budget"]
    c = Table(title=f"{pattern}: what the audit costs (median of each rate's passes; token "
              f"budget {budget:.0%})", title_justify="left")  # fmt: skip
    for col in ("audit", "audited calls", "wall s", "wall / unaudited", "paired (range)",
                "cpu s", "cpu paired (range)", "tokens encoded", "shadow tokens",
                "shadow / encoded"):  # fmt: skip
        c.add_column(col, justify="right")
    for r in costs:
        share = r["audit_tokens"] / r["tokens_encoded"] if r["tokens_encoded"] else 0.0
        c.add_row("off" if not r["audit"] else f"1 in {r['audit']}", f"{r['audited']:.1f}",
                  f"{r['wall_s']:.2f}", f"{r['ratio']:.3f}x", _span(r["paired"]),
                  f"{r['cpu_s']:.2f}", _span(r["cpu_paired"]), f"{r['tokens_encoded']:.0f}",
                  f"{r['audit_tokens']:.0f}", f"{share:.0%}")  # fmt: skip
    out.print(c)
    out.print("[dim]paired: the median of each round's time over the unaudited pass's in the "
              "same round; cpu: the process's CPU time[/]")  # fmt: skip


def _span(p: tuple[float, float, float]) -> str:
    return f"{p[0]:.3f}x ({p[1]:.3f}-{p[2]:.3f})"
