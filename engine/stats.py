"""Engine statistics: a frozen snapshot."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineStats:
    mode: str
    capacity: int  # token slots in the store
    tokens_used: int
    tokens_free: int
    messages: int  # live messages (the attention sink not counted)
    tokens_encoded: int  # tokens run through the model
    tokens_reused: int  # cached tokens attended to without being re-encoded
    prefix_hit_tokens: int  # baseline: prompt tokens found in the radix cache
    prefix_query_tokens: int  # baseline: prompt tokens looked up
    prefix_shared_in_batch: int = 0  # baseline: of the hits, tokens a still-running call encoded
    steps: int = 0  # fused forward steps run by the scheduler
    mean_batch_size: float = 0.0  # calls per step
    queue_depth: int = 0  # calls waiting to be admitted
    running: int = 0  # calls admitted and stepping now
    tokens_per_s: float = 0.0  # tokens sampled per second of stepping
    tokens_sampled: int = 0  # tokens decodes sampled (or were forced to) since the engine opened
    mean_ttft_s: float = float("nan")  # mean time from submit to first token
    overhead: float = 0.0  # share of step time spent outside the forward
    leaks: int = 0  # leaks recorded since the engine started (policies allow and warn)
    reencodes: int = 0  # clean copies made (leak_policy="reencode")
    records: int = 0  # message records held, freed ones still referenced included
    view_tokens: int = 0  # tokens held in running calls' rotated views (beside the store)
    view_tokens_peak: int = 0
    view_capacity: int = 0  # tokens the view arena holds (views never spill outside it)
    kv_bytes: int = 0  # store + view arena (+ context scratch): all the KV memory it can use
    contexts: str = "copy"  # how calls hold their contexts: "copy" or "store" (read in place)
    # contexts="store": tokens of one layer that live contexts hold in the scratch
    # (their keys of the layer being run; 1/num_layers of a token's K and V each)
    scratch_tokens: int = 0
    scratch_tokens_peak: int = 0
    layers: int = 0  # the model's layers: a scratch token is 1/layers of a store token
    weight_bytes: int = 0  # the model's weights as held (float32 keeps projections twice)
    forward_s: float = 0.0  # seconds spent in the model's forward since the engine opened
    step_s: float = 0.0  # wall time of the batching loop's steps (admission, forward, sampling)
    # of step_s, the steps that encoded any prompt chunk (a prefill, a decode's prompt or
    # header) or a finished turn's footer; the rest only decoded. What a workflow could
    # save by encoding less.
    encode_step_s: float = 0.0
    # compile=True: lone one-row steps run through the captured graph, and the
    # seconds capturing it took when the engine opened (corps.engine.model.compiled_decode)
    compiled_steps: int = 0
    step_compile_s: float = 0.0
    # graphs != "off": decode-only steps run over static buffers, the CUDA graphs
    # captured (one per batch bucket) and the seconds their warm-up and capture took
    # (corps.engine.model.static_decode)
    static_steps: int = 0
    graphs_captured: int = 0
    graph_capture_s: float = 0.0
    constraints_compiled: int = 0  # distinct constraints compiled (each once per engine)
    constraint_compile_s: float = 0.0  # seconds they took, all together
    tokens_jumped: int = 0  # tokens constraints forced, appended without a step each
    spans_sent: int = 0  # otel=URL: spans the collector took (calls; the run root at close)
    spans_dropped: int = 0  # otel=URL: spans it did not take (down, refused); never an error
    policy: str = "fcfs"  # the scheduling policy (corps.engine.sched.policies)
    # the fair policy (corps.engine.sched.fair), per tenant: weight, served (tokens its
    # calls encoded and sampled), standing (recent service per unit of weight),
    # protected (1.0: its first tokens go first now), waiting and running calls
    tenants: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # preemption (choreographed): encodings dropped for room, and tokens made again when
    # a call read an evicted message (corps.engine.exec.memory), or copied back from the
    # store where it was saved (EngineConfig.store)
    messages_evicted: int = 0
    tokens_evicted: int = 0
    tokens_recomputed: int = 0
    tokens_copied_back: int = 0
    # of those copied back, ahead of the step that reads them (`Engine.expect`'s prefetch)
    tokens_prefetched: int = 0
    # tokens of live messages whose encodings are out of the KV store now: on disk with a
    # store (copied back when read), else recomputed when read (counted when asked: a
    # pass over the message table)
    tokens_spilled: int = 0
    tokens_in_host: int = 0  # of those, in host memory (a GPU store's host tier)
    # repairs (corps.engine.exec.repairs): the engine's default policy, rewired context
    # tokens recomputed in their readers' contexts (counted in tokens_encoded, not in
    # tokens_reused), and rewired tokens the deviation probe ran (its layers only)
    repair: str = "none"
    tokens_repaired: int = 0
    tokens_probed: int = 0
    # the online fidelity audit (corps.engine.audit): calls audited, their mean gap (KL
    # nats per position) and argmax agreement, the tokens their shadows encoded (also in
    # tokens_encoded) and shadows that could not run
    audited: int = 0
    audit_gap: float = float("nan")
    audit_agreement: float = float("nan")
    audit_tokens: int = 0
    audits_failed: int = 0

    @property
    def prefix_hit_rate(self) -> float:
        return (
            self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0
        )
