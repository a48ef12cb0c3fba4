"""Decode-only steps over static buffers: what a CUDA graph captures and replays.

On a GPU a decode step is bound by its launches, not its work: some 20 kernels a
layer, each a few microseconds of Python and driver time, around matmuls of one
row per call (on an H100, a 1B-shape step kept the GPU busy 2 ms of every 10-15).
A CUDA graph replays a whole step's kernels with one launch, but only over the
same buffers and the same shapes each time. So a decode-only step (one row per
call, every view in the arena, no adapter kept apart) is padded to a batch-size
bucket (`BUCKETS`), and everything it reads that changes from step to step is
copied into that bucket's static buffers first: the tokens, their positions and
store slots, and each call's arena rows (where its new key goes, where its
context and own tokens lie, how long its view is). The step itself reads only
those buffers, the weights, the store and the arena:

- padding rows are token 0 at position 0, written to the store's and the arena's
  scratch rows (never handed out), each a view of one key (its own); their
  logits are dropped;
- attention reads each view straight from the arena, its ranges taken from the
  buffers (`DecodePlan.static`): a backend whose decode kernel reads ragged views
  (Triton) with a fixed number of splits per view, sized in the kernel from the
  view's length; the torch backend gathers every view padded to a key width, the
  smallest power of two >= the longest view (at least `MIN_WIDTH`), so it holds
  one graph per (bucket, width) where Triton holds one per bucket.

`capture=True` (CUDA): each (bucket, width) is captured on its first step, after
two eager warm-up runs on a side stream (Triton compiles, cuBLAS picks its
kernels), into one memory pool all graphs share, and replayed from then on.
`capture=False`: the same function runs eagerly over the same buffers: on a CPU
it tests, against the ordinary step, everything but the capture itself. A
capture that fails (a kernel that cannot be captured) warns once and the
engine goes on with the buffers run eagerly: the step it was for still runs.
A step the buffers cannot describe (a prompt chunk, a jumped token or a footer,
views outside the arena or read from the store, an adapter kept apart, more calls
than the largest bucket) runs through the ordinary step.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from corps.cache.arena import ViewArena
from corps.engine.attention import DecodePlan
from corps.engine.model.runner import ForwardBatch, ModelRunner

#: Batch sizes a decode-only step is padded to (one buffer set, one graph each).
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: The narrowest key width the torch backend's static attention gathers.
MIN_WIDTH = 64
#: Programs a ragged decode kernel aims at per layer (calls x query heads x splits):
#: enough to fill a GPU's streaming multiprocessors a few times over for one call.
TARGET_PROGRAMS = 1024
#: The rows of a bucket's input buffer (each (B,) long).
IDS, POSITIONS, SLOTS, WRITE, CTX_BASE, CTX_LEN, OWN_BASE, LENGTHS = range(8)


def bucket_for(rows: int) -> int | None:
    """The smallest bucket holding `rows` rows, or None when none does."""
    return next((b for b in BUCKETS if b >= rows), None)


def width_for(longest: int) -> int:
    """The key width the torch backend's static plan gathers for views of at most
    `longest` keys: the next power of two, at least MIN_WIDTH."""
    return max(MIN_WIDTH, 1 << (longest - 1).bit_length())


@dataclass
class StaticStep:
    """One (bucket, width)'s static buffers and, once captured, its graph."""

    inputs: Tensor  # (8, B) long: ids, positions, slots, write, ctx base/len, own base, lengths
    pad: Tensor  # (8, B) long: what a padding row holds in each
    logits: Tensor | None = None  # (B, V) the captured step's output
    graph: torch.cuda.CUDAGraph | None = None


class StaticDecode:
    """Decode-only steps of a runner through static buffers (captured on CUDA)."""

    def __init__(self, runner: ModelRunner, arena: ViewArena, capture: bool) -> None:
        self.runner = runner
        self.arena = arena  # every view a static step reads lives here
        self.capture = capture
        # a ragged decode kernel (plan_keys None) needs no key width: one graph a bucket
        self.ragged = getattr(runner.attention, "plan_keys", 0) is None
        self.heads = runner.spec.num_heads
        self.steps: dict[tuple[int, int | None], StaticStep] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.refused: str | None = None  # why capturing stopped, if it did
        self.runs = 0  # steps run through the static buffers
        self.capture_seconds = 0.0  # warm-up and capture of every graph, all together

    def release(self) -> None:
        """Drop the buffers and graphs (the engine is closing)."""
        self.steps.clear()
        self.pool = None

    def key(self, batch: ForwardBatch) -> tuple[int, int | None] | None:
        """(bucket, key width or None) of a step the static buffers can run, else None."""
        t = batch.input_ids.shape[0]
        if t != len(batch.spans) or batch.logit_rows.shape[0] != t:
            return None  # a span of several rows, or rows without logits
        bucket = bucket_for(t)
        if bucket is None or self.runner.w.lora is not None:
            return None
        longest = 0
        for sp in batch.spans:
            view = sp.view
            if (
                sp.at is not None
                or view.batch_arena is not self.arena
                or (view.ctx is not None and view.ctx.in_store)
            ):
                return None
            longest = max(longest, view.length + 1)
        return bucket, None if self.ragged else width_for(longest)

    def forward(self, batch: ForwardBatch, key: tuple[int, int | None]) -> Tensor:
        """Run the step `key(batch)` named: fill its buffers, replay (or run) it,
        advance the views; the logits of its rows (T, V), in row order."""
        step = self.steps.get(key)
        if step is None:
            step = self.steps[key] = self._buffers(key[0])
        t = self._fill(step, batch)
        if step.graph is not None:
            step.graph.replay()
            logits = step.logits
        elif self.capture:
            try:
                logits = self._capture(step, key)
            except Exception as exc:  # a capture refused: the same buffers, eagerly
                self.capture, self.refused = False, f"{type(exc).__name__}: {exc}"
                warnings.warn(
                    f"graphs: capturing a decode step failed ({self.refused}); decode "
                    "steps run eagerly over the same buffers from now on",
                    RuntimeWarning,
                    stacklevel=2,
                )
                logits = self._run(step.inputs, key)
        else:
            logits = self._run(step.inputs, key)
        for sp in batch.spans:
            sp.view.advance(1)
        self.runs += 1
        return logits[:t].clone()  # the graph's output is overwritten by its next replay

    def _buffers(self, bucket: int) -> StaticStep:
        dev = self.arena.k.device
        pad = torch.zeros(8, bucket, dtype=torch.long, device=dev)
        pad[SLOTS] = self.runner.store.scratch
        pad[WRITE] = pad[CTX_BASE] = pad[OWN_BASE] = self.arena.scratch
        pad[LENGTHS] = 1  # a view of one key: the padding row's own
        return StaticStep(pad.clone(), pad)

    def _fill(self, step: StaticStep, batch: ForwardBatch) -> int:
        """Copy the batch's rows into the buffers, padding the rest; its row count."""
        views = [sp.view for sp in batch.spans]
        t = len(views)
        meta = torch.tensor(
            [
                [v.own_base + v.own_length for v in views],  # where the new key goes
                [v.ctx_base for v in views],
                [v.ctx_len for v in views],
                [v.own_base for v in views],
                [v.length + 1 for v in views],  # the new key included
            ]
        )  # (5, T) on the host: one copy
        inputs = step.inputs
        inputs[:, t:] = step.pad[:, t:]
        inputs[IDS, :t] = batch.input_ids
        inputs[POSITIONS, :t] = batch.positions
        inputs[SLOTS, :t] = batch.slots
        inputs[WRITE:, :t] = meta.to(inputs.device, non_blocking=True)
        return t

    def _run(self, inputs: Tensor, key: tuple[int, int | None]) -> Tensor:
        """The step over the buffers: logits (B, V) of every row, padding included."""
        bucket, width = key
        runner = self.runner
        splits = max(1, min(32, TARGET_PROGRAMS // (bucket * self.heads))) if self.ragged else None
        plan = DecodePlan.static(
            self.arena, inputs[WRITE], inputs[CTX_BASE], inputs[CTX_LEN], inputs[OWN_BASE],
            inputs[LENGTHS], width, splits,
        )  # fmt: skip
        attention, scale = runner.attention, runner.scale

        def attend(i: int, q: Tensor, k_rot: Tensor, v: Tensor) -> Tensor:
            return attention.attend_decode(i, q, k_rot, v, plan, scale)  # (B, Hq, D)

        x = runner.layers(inputs[IDS], inputs[POSITIONS], inputs[SLOTS], attend)
        return runner.logits(x)  # (B, V)

    def _capture(self, step: StaticStep, key: tuple[int, int | None]) -> Tensor:
        """Warm up and capture `key`'s step over its filled buffers, then replay it
        once (capturing runs nothing); the logits (B, V). Every run writes the same
        K/V to the same rows, so the warm-ups change nothing the replay does not."""
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._run(step.inputs, key)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            step.logits = self._run(step.inputs, key)
        step.graph = graph
        graph.replay()
        self.capture_seconds += time.perf_counter() - t0
        return step.logits


def use_graphs(runner: ModelRunner, arena: ViewArena, how: str) -> None:
    """Run the runner's decode-only steps over static buffers (`EngineConfig.graphs`):
    "capture" (CUDA graphs), "static" (the same buffers, eagerly) or "off"."""
    runner.static = None if how == "off" else StaticDecode(runner, arena, capture=how == "capture")
