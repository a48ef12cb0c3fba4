"""Distillation: a LoRA adapter that makes the choreographed workflow behave as the baseline.

The Prompt Choreography paper's repair (section 3.4): sample baseline runs of a
workflow at temperature 1, replay each choreographed with every decode forced to
the baseline's tokens, and train LoRA adapters (attention and MLP projections) to
lower the log-loss of those tokens under choreography, back-propagating through
every prefill and decode of the workflow (`corps.engine.distill.differentiable`).

- `collect` samples the traces: per input, the baseline's scores of its tokens and
  the choreographed replay's message graph, appended to a JSON-lines file as each
  finishes (a later call with the same file skips the inputs already there).
- `distill` trains: each epoch goes over the training traces in a seeded order,
  in batches; the validation gap (choreographed minus baseline log-loss per token,
  `corps.patterns.evaluation.fidelity`) is measured before training and after each epoch,
  beside the same gap on as many training traces (whether the adapter fits what it
  saw but not new traces), and the adapter of the best epoch is saved in PEFT's
  format.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from corps.engine.distill.differentiable import DifferentiableReplay
from corps.engine.distill.graph import MessageGraph
from corps.engine.exec.torch_thread import TORCH
from corps.engine.model.adapter_files import SCOPES, TARGETS
from corps.patterns.cluster.each import each
from corps.patterns.evaluation import fidelity
from corps.patterns.evaluation.fidelity import Row
from corps.patterns.replay import TurnScores


@dataclass(frozen=True)
class Trace:
    """One input's baseline run, as distillation needs it."""

    index: int  # the input's line (0-based)
    seed: int
    graph: MessageGraph  # the choreographed replay's messages (tokens forced to the baseline's)
    baseline: dict[int, TurnScores]  # decode node id -> the baseline's scores of its tokens

    def to_json(self) -> str:
        return json.dumps(
            dict(
                index=self.index,
                seed=self.seed,
                graph=json.loads(self.graph.to_json()),
                baseline={str(k): asdict(v) for k, v in self.baseline.items()},
            )
        )

    @classmethod
    def from_json(cls, line: str) -> Trace:
        raw = json.loads(line)
        baseline = {
            int(k): TurnScores(
                **{**v, **{f: tuple(v[f]) for f in ("tokens", "logprobs", "greedy")}}
            )
            for k, v in raw["baseline"].items()
        }
        graph = MessageGraph.from_json(json.dumps(raw["graph"]))
        return cls(raw["index"], raw["seed"], graph, baseline)


async def trace_of(base_rt, chor_rt, pattern: str, params: Mapping[str, Any], index: int) -> Trace:
    """Sample the baseline run of `params` and replay it choreographed (forced)."""
    recorded, _ = await fidelity.sample(base_rt, pattern, params)
    forced, result = await fidelity.replay(chor_rt, pattern, params, recorded)
    graph = chor_rt.engine.graph(result.messages, pattern=pattern, index=index)
    baseline = {forced.scores[i].message: recorded.scores[i] for i in forced.scores}
    return Trace(index, int(params["seed"]), graph, baseline)


def load_traces(path: Path) -> dict[int, Trace]:
    """The traces a file holds, by input index (a torn last line is dropped)."""
    out: dict[int, Trace] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                t = Trace.from_json(line)
            except (ValueError, KeyError, TypeError):
                continue  # an interrupted write: that input runs again
            out[t.index] = t
    return out


async def collect(
    base_rt,
    chor_rt,
    pattern: str,
    inputs: Sequence[Mapping[str, Any]],
    seeds: Sequence[int],
    path: Path,
    *,
    concurrency: int = 4,
    on_done: Callable[[], None] | None = None,
) -> tuple[list[Trace], list[tuple[int, str]]]:
    """Traces of every input (sampled or already in `path`), in input order, and the
    inputs that failed (index, why). New traces are appended to `path` as they end."""
    have = load_traces(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    async def one(i: int) -> None:
        params = fidelity.sampling_params(pattern, inputs[i], seeds[i])
        have[i] = await trace_of(base_rt, chor_rt, pattern, params, i)
        with path.open("a") as f:
            f.write(have[i].to_json() + "\n")

    todo = [i for i in range(len(inputs)) if not (i in have and have[i].seed == seeds[i])]
    for _ in range(len(inputs) - len(todo)):  # already there: done
        if on_done is not None:
            on_done()
    failed = await each(todo, one, concurrency=concurrency, on_done=on_done)
    return [have[i] for i in sorted(have) if i < len(inputs)], list(failed.items())


def gap_table(replayer: DifferentiableReplay, traces: Sequence[Trace]) -> list[Row]:
    """Fidelity rows (per role, then "all") of `traces` under the replayer's model."""
    pairs = []
    with torch.no_grad():
        for t in traces:
            out = replayer.run(t.graph)
            replayed = {
                k: TurnScores(b.role, b.tokens, tuple(out.logprobs[k].tolist()),
                              tuple(out.greedy[k].tolist()), k)
                for k, b in t.baseline.items()
            }  # fmt: skip
            pairs.append(fidelity.Pair(t.index, t.baseline, replayed))
    return fidelity.table(pairs)


OBJECTIVES = ("distribution", "tokens")
SCHEDULES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class Settings:
    """Training settings (the paper's LoRA: rank 64, alpha 32, dropout 0.05)."""

    epochs: int = 2
    rank: int = 64
    alpha: int = 32
    dropout: float = 0.05
    lr: float = 3e-4
    batch: int = 4  # traces per optimizer step
    seed: int = 0
    # "tokens": the log-loss of the baseline's sampled tokens (the paper's); "distribution":
    # the cross-entropy to the baseline's whole next-token distribution at each of those
    # positions (the same optimum, far less variance; see DifferentiableReplay.run)
    objective: str = "distribution"
    # the learning rate over the run's optimizer steps: "constant" (lr throughout),
    # "linear" (from lr down to 0 at the last step) or "cosine" (lr to 0, half a cosine)
    schedule: str = "constant"
    # the projections that get LoRA weights (module names; `targets_of` reads "attention")
    targets: tuple[str, ...] = TARGETS
    # which calls the adapter applies to: "all", or "rewired" (only calls whose context
    # choreography rewired, `corps.cache.rewired`; chain calls keep the base model)
    scope: str = "all"

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise ValueError(
                f"targets must be some of {', '.join(TARGETS)}, got {', '.join(self.targets)!r}"
            )
        if self.objective not in OBJECTIVES:
            raise ValueError(
                f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )


#: What `--targets` may name besides module names.
TARGET_SETS = {
    "all": TARGETS,
    "attention": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}


def targets_of(text: str) -> tuple[str, ...]:
    """ "all", "attention", "mlp" or comma-separated module names -> module names."""
    names: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        for name in TARGET_SETS.get(part, (part,)):
            if name not in names:
                names.append(name)
    return tuple(names)


def lr_factor(schedule: str, step: int, steps: int) -> float:
    """The learning rate's factor before optimizer step `step` (0-based) of `steps`."""
    done = step / steps if steps else 0.0
    if schedule == "linear":
        return 1.0 - done
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * done))
    return 1.0


@dataclass
class Epoch:
    epoch: int  # 0: before training
    train_loss: float | None  # mean log-loss per token over the epoch's steps
    val_gap: float
    val: list[dict[str, Any]]  # fidelity rows per role
    seconds: float = 0.0
    tokens_per_s: float | None = None
    # the gap on as many training traces as there are validation ones (the first):
    # far below val_gap means the adapter fits its traces and fails to generalise
    # (too few traces); close to it, that training has not fit them yet
    train_gap: float | None = None


@dataclass
class Distilled:
    """What `distill` did: each epoch's figures and which one was kept."""

    best_epoch: int
    epochs: list[Epoch] = field(default_factory=list)
    trainable_params: int = 0
    total_params: int = 0

    @property
    def before(self) -> float:
        return self.epochs[0].val_gap

    @property
    def after(self) -> float:
        return self.epochs[self.best_epoch].val_gap

    def as_dict(self) -> dict[str, Any]:
        return dict(
            best_epoch=self.best_epoch, val_gap_before=self.before, val_gap_after=self.after,
            trainable_params=self.trainable_params, total_params=self.total_params,
            epochs=[asdict(e) for e in self.epochs],
        )  # fmt: skip


def distill(
    model_path: str | Path,
    train: Sequence[Trace],
    val: Sequence[Trace],
    out: str | Path,
    settings: Settings = Settings(),
    *,
    on_step: Callable[[int, int, float, float], None] | None = None,
    on_epoch: Callable[[Epoch], None] | None = None,
) -> Distilled:
    """Train a LoRA adapter on `train`, keep the epoch with the lowest validation gap
    (epoch 0: none trained; then `out` holds an adapter that changes nothing), save it
    to `out` (PEFT's format) with `distill.json`. `on_step(step, steps, loss, tok/s)`
    after each optimizer step, `on_epoch(epoch)` after each validation (both called on
    the torch thread).

    Loading and training run on the process's torch thread
    (`corps.engine.exec.torch_thread`), as engines do: torch work on a second thread
    beside it slows both (measured: a training step 1.25 -> 1.7 s while an engine's
    torch thread lingered). Engines of the process wait for it meanwhile."""
    if not train:
        raise ValueError("no training traces")
    return TORCH.call(_train, model_path, train, val, out, settings, on_step, on_epoch)


def _train(
    model_path: str | Path,
    train: Sequence[Trace],
    val: Sequence[Trace],
    out: str | Path,
    settings: Settings,
    on_step: Callable[[int, int, float, float], None] | None,
    on_epoch: Callable[[Epoch], None] | None,
) -> Distilled:
    """`distill`'s work, on the torch thread."""
    from corps.engine.model.adapter_files import trainable, write_scope
    from corps.engine.model.weights import load_hf

    torch.manual_seed(settings.seed)
    model = trainable(
        load_hf(model_path, dtype=torch.float32),
        rank=settings.rank, alpha=settings.alpha, dropout=settings.dropout,
        targets=settings.targets,
    )  # fmt: skip
    replayer = DifferentiableReplay(model, scope=settings.scope)
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    out = Path(out)
    report = Distilled(
        best_epoch=0,
        trainable_params=sum(p.numel() for p in params),
        total_params=sum(p.numel() for p in model.parameters()),
    )

    probe = list(train[: len(val)])  # training traces whose gap is measured too

    def validate(epoch: int, loss: float | None, seconds: float, tps: float | None) -> None:
        model.eval()
        rows = gap_table(replayer, val)
        fit = gap_table(replayer, probe)[-1].gap
        report.epochs.append(
            Epoch(epoch, loss, rows[-1].gap, [r.as_dict() for r in rows], seconds, tps, fit)
        )
        if on_epoch is not None:
            on_epoch(report.epochs[-1])
        if rows[-1].gap <= report.epochs[report.best_epoch].val_gap:
            report.best_epoch = epoch
            model.save_pretrained(str(out))
            write_scope(out, settings.scope)

    validate(0, None, 0.0, None)
    order = list(train)
    rng = random.Random(settings.seed)
    steps = settings.epochs * -(-len(order) // settings.batch)
    step = 0
    decay = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda i: lr_factor(settings.schedule, i, steps)
    )
    for epoch in range(1, settings.epochs + 1):
        model.train()
        rng.shuffle(order)
        t0, nll, tokens = time.perf_counter(), 0.0, 0
        for b in range(0, len(order), settings.batch):
            batch = order[b : b + settings.batch]
            n = sum(t.graph.target_tokens for t in batch)
            optim.zero_grad()
            total = 0.0
            for t in batch:  # one graph at a time: memory is one workflow's activations
                got = replayer.run(t.graph, teacher=settings.objective == "distribution")
                loss = got.soft_loss() if settings.objective == "distribution" else got.loss()
                (loss / n).backward()
                total += loss.item()
            optim.step()
            decay.step()
            step, nll, tokens = step + 1, nll + total, tokens + n
            if on_step is not None:
                on_step(step, steps, total / n, tokens / (time.perf_counter() - t0))
        seconds = time.perf_counter() - t0
        validate(epoch, nll / tokens, seconds, tokens / seconds)
    (out / "distill.json").write_text(json.dumps(report.as_dict(), indent=2))
    return report
