"""`EngineConfig`: every setting of an engine, validated once, torch-free.

The one home of the valid values (modes, dtypes, context kinds, attention
backends, leak policies) and their checks. The CLI, scenario files and the
benchmarks build one before loading anything, so a bad value fails in a line,
before minutes of model loading. It is frozen and pickles, so a remote worker
can build the same engine from it.

Environment variables only fill defaults (`corps.engine.env` reads them):
`CORPS_CONTEXTS` (contexts), `CORPS_ATTENTION` (attention backend) and
`CORPS_PRECOMPILED` (precompiled).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from corps.cache.errors import InvalidRequest
from corps.cache.visibility import LEAK_POLICIES, check_policy
from corps.engine.adapter_dir import adapter_problem
from corps.engine.audit import AUDIT_BUDGET, check_audit
from corps.engine.config_rules import check_combination
from corps.engine.env import env_setting, env_value
from corps.engine.errors import BadConfig
from corps.engine.repair import DECISION_REPAIR, parse_repair

Mode = Literal["choreographed", "baseline", "hf"]
Dtype = Literal["auto", "mixed", "float32", "bfloat16", "float16"]
Contexts = Literal["copy", "store"]
Attention = Literal["torch", "triton", "flex", "triton+flex"]
OtelProtocol = Literal["http/protobuf", "grpc"]
PolicyName = Literal["fcfs", "workflow", "objective", "fair"]
CompileGemms = Literal["library", "autotune"]
Graphs = Literal["auto", "capture", "static", "off"]
Precompiled = Literal["auto", "build", "off"]
WeightFormat = Literal["auto", "dense", "gguf", "int8", "int4"]

#: Engine modes: choreography, the prefix-cached baseline, and transformers `generate`.
MODES: tuple[str, ...] = get_args(Mode)
#: Weight and activation precisions. "auto" (the default) is float32 activations,
#: attention and KV store, with each projection's kernel (float32, float16 or
#: bfloat16 weights) chosen by measurement on this CPU per row count
#: (`corps.engine.model.tuning`); "mixed" is the same with a fixed rule
#: (`corps.engine.model.linear`); "float32" is exact against transformers.
DTYPES: tuple[str, ...] = get_args(Dtype)
#: How calls hold the contexts they read (`corps.cache.context`).
CONTEXTS: tuple[str, ...] = get_args(Contexts)
#: Attention backends (`corps.engine.attention`); None picks by device.
ATTENTION_BACKENDS: tuple[str, ...] = get_args(Attention)
#: How decode-only steps run (`corps.engine.model.static_decode`).
GRAPHS: tuple[str, ...] = get_args(Graphs)
#: How projections hold their weights (`corps.engine.model.weights.WEIGHT_FORMATS`):
#: "auto" runs a GGUF model's own 4- and 8-bit blocks (the embedded default) and
#: keeps any other model dense; "dense" de-quantizes; "int8" / "int4" quantize on load.
WEIGHT_FORMATS: tuple[str, ...] = get_args(WeightFormat)

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_DTYPE = "auto"
#: Default KV memory (the store and the view arena together) when no capacity is given.
DEFAULT_MEMORY_BUDGET = 2 << 30
#: The default budget never buys more slots than this: a tiny model would otherwise
#: get millions of slots (and their bookkeeping) it has no use for.
DEFAULT_MAX_CAPACITY = 1 << 17


_Positive = Annotated[int, Field(ge=1)]


#: tokens per fused step by default: on a CPU a step's cost grows with its rows, so
#: short steps keep decodes flowing between prompt chunks; on a GPU a step is bound by
#: its kernel launches (an H200 ran a 2,048-token prompt of a 1B model as four
#: 512-token steps: 2,344 kernels, the GPU busy 16 of 63 ms), so a prompt of a few
#: thousand tokens goes in one (vLLM and SGLang batch 2-8k tokens a step)
STEP_TOKENS = {"cpu": 512, "cuda": 4096}


#: Steps the torch thread may run back to back before the event loop takes them
#: back (`EngineConfig.run_ahead`): a hop costs ~0.1 ms on a CPU, a decode step of
#: a small model not many times that.
RUN_AHEAD = 8


def step_tokens_for(device: str) -> int:
    """The default `step_tokens` of an engine on `device`."""
    return STEP_TOKENS["cuda" if device.startswith("cuda") else "cpu"]


class EngineConfig(BaseModel):
    """Everything `Engine.open` needs to build an engine; frozen.

    - `model`: an alias (`corps models`), a local HF directory or a hub id.
    - `mode`: "choreographed" (reuse encodings), "baseline" (re-encode the parents'
      text with a radix prefix cache) or "hf" (transformers `generate`, one call at
      a time: the reference a typical agent framework gives you).
    - `dtype`: "auto" (default: float32 activations, each projection's kernel and
      weight format measured fastest on this CPU, once, cached under
      `$CORPS_HOME/kernels`; within 16-bit rounding of float32), "mixed" (16-bit
      weights by a fixed rule), "float32" (exact against transformers),
      "bfloat16" or "float16".
    - `weights`: how projections hold their weights. "auto" (default): a model whose
      directory holds its GGUF (the embedded default) runs the file's own 4- and
      8-bit blocks through torch's packed int4 kernel (bfloat16 products, see
      `corps.engine.model.quantized`); any other model stays dense. "dense": the
      de-quantized path, exact against transformers in float32. "gguf": the file's
      blocks, or a typed error without one. "int8" (CPU) / "int4": any model
      quantized on load, round to nearest (int8 per channel, int4 per group of 32).
    - `device`: "cpu" or "cuda[:N]".
    - `attention`: the attention backend; None picks by device (torch on CPU,
      triton+flex on CUDA with Triton). Default from `CORPS_ATTENTION`.
    - `contexts`: "copy" (each placed context rotated once into the view arena) or
      "store" (read from the store at every step; less memory, slower long decodes;
      torch backend only). Default from `CORPS_CONTEXTS`, else "copy".
    - `capacity`: KV store token slots (the view arena gets as many); None: as many
      as `memory_budget` bytes buy; without a budget, on CUDA `memory_fraction` of
      the device memory free once the weights are loaded (vLLM's
      `gpu_memory_utilization`, default 0.9), elsewhere 2 GiB (at most
      DEFAULT_MAX_CAPACITY slots).
    - `queue_size`, `step_tokens`, `max_running`: the batching loop's queue, tokens
      per fused step (default `step_tokens_for(device)`: 512 on a CPU, 4096 on
      CUDA), and calls running at once.
    - `run_ahead`: steps the torch thread may run back to back, without a hop to
      the event loop between them, while nothing needs the loop there (no call
      ended, arrived, was cancelled or streams its tokens; `RUN_AHEAD`). 1: a hop
      after every step.
    - `leak_policy`: the default for calls made as an agent (`corps.engine.api.access`).
    - `trace`: write every call, message and leak to this JSON-lines file.
    - `otel`: send each call's span to this OpenTelemetry collector as the call ends
      (e.g. http://localhost:4318/v1/traces; needs `pip install 'corps[otel]'`);
      `otel_protocol` is "http/protobuf" (default) or "grpc". A collector that is
      down never slows or fails the engine: `stats().spans_dropped` counts what it
      did not take.
    - `auto_free`: free an encoding once the last `Handle` naming it is collected.
    - `store`: a directory where messages outlive the process (`corps.cache.durable`):
      every message is recorded as it is made, encodings are saved as the engine
      closes, and an engine opened on the same directory with the same model and
      settings has every message and id back (`Engine.handle(id)`); another model,
      dtype, weight format or mode is refused (`StoreMismatch`). Not for mode "hf".
      `store_rebuild`: a store made with the same model files in another dtype or
      weight format drops its encodings instead (its messages encoded again when read).
    - `policy`: how the batching loop admits waiting calls (`corps.engine.sched.policies`):
      "fcfs" (first come, first served), "workflow" (earlier workflows first, task
      groups whole), "objective" (latency calls first, the batch bounded beside
      them) or "fair" ("objective", with each tenant its share: calls name their
      `tenant`; `corps.engine.sched.fair`).
    - `deduce_objectives`: in a workflow whose objective is "latency", the calls of
      a task group of two or more (a map stage, proposals, voters) are latency but
      not critical: admitted first and whole, without bounding the batch; calls
      made alone are critical (`corps.engine.api.submit.deduce_objective`). False:
      every call of such a workflow bounds the batch, as per-call latency
      targets would.
    - `adapter`: a LoRA adapter directory in PEFT's format (`corps distill --out`, or
      peft's save_pretrained) merged into the weights at load, in every mode and dtype.
      An adapter of scope "rewired" (`corps distill --scope rewired`) is kept apart
      and applies only to the calls whose context choreography rewired
      (`corps.engine.model.adapter_rows`).
    - `adapter_copy`: for an adapter of scope "rewired", also hold the adapted
      projections with the adapter merged in (one more copy of them): a step whose
      rows are all rewired calls then costs what the base model's does, and only
      steps mixing rewired and chain calls add the adapter's low-rank product
      (True, the default). False: every rewired row pays for the product, with
      no second copy of the weights.
    - `admission`: workflow-level admission (`corps.engine.sched.gate`): a pattern's
      run starts only when the store can hold it beside the runs in flight (True,
      the default), so many workflows at once wait rather than fail with
      CacheFullError; False starts every run at once.
    - `max_workflows`: at most this many pattern runs in flight at once, whatever
      memory allows; the others wait whole, first come first served, before their
      first call (None, the default: as memory allows). A bound on the work many
      clients can start on one engine at once; it costs throughput when it binds
      below the concurrency that saturates the engine, and measured under open-loop
      load it did not shorten the latency tail (docs/benchmarks.md, "serve").
      `corps run --inputs --concurrency` caps one data set's runs on the caller's
      side. A run started inside another run is not counted (it is already in);
      runs that wait on each other from separate tasks need a cap above their
      number, or they wait forever.
    - `evict`: preemption (choreographed mode): when a call cannot get store slots
      and nothing running will give any back, the encodings of messages no
      running call reads are dropped, in the policy's order, and recomputed
      from their parents when a call reads them again (`corps.engine.exec.memory`):
      the call runs instead of failing with CacheFullError (True, the default).
      False: it fails.
    - `compile`: capture a lone call's one-row decode step as one graph with
      torch.compile (`corps.engine.model.compiled_decode`), its weights frozen in: a
      quarter to a third less time per token for one stream on a CPU, at a
      compile of 40-60 s for SmolLM2-135M each time the engine opens, and
      one more copy of the weights. Rounding differs from the eager step (not
      exact in float32), so off by default; CPU, torch attention backend.
    - `compile_gemms`: the products inside that graph. "library" (default): the
      CPU libraries' kernels (oneDNN, MKL) on weights inductor packs for them.
      "autotune": inductor also generates its own C++ GEMM kernels (AMX or
      AVX-512 micro-kernels where the CPU has them) and times them against the
      library's for each product shape on this machine, keeping the faster; on
      an Intel Xeon with AMX a stream decoded 1.3x faster than with "library",
      at a compile half again as long (docs/benchmarks.md).
    - `precompiled`: the same lone one-row decode step compiled ahead of time
      (AOTInductor) into a package under `$CORPS_HOME/steps`, once per machine and
      shape of model, and loaded in a tenth of a second by every engine after
      (`corps.engine.model.precompiled_decode`): for quantized weights on a CPU
      (the default model's GGUF), one stream decoded 1.6x faster than eagerly on
      our 2-core EPYC. "auto" (the default): load the package if it is kept, else
      decode eagerly and have a background process build it once this process
      has exited (at the lowest priority, about a minute on 2 cores), for the
      engines opened after it (`corps.engine.api.precompile`). "build": build it now if
      it is missing (blocks about a minute), then use it. "off": decode eagerly.
      Its default is `$CORPS_PRECOMPILED` when set. Not exact against the eager
      step (it fuses the norms and casts); ignored under compile=True.
    - `graphs`: decode-only steps (one row per call) over static buffers padded
      to a batch-size bucket (`corps.engine.model.static_decode`). "capture": each
      bucket's step captured as a CUDA graph on its first use and replayed after
      (one launch a step instead of hundreds; CUDA only); "static": the same
      buffers run eagerly (exact against the ordinary step: how the path is tested
      without a GPU); "off": every step eager with its own shapes; "auto" (the
      default): "capture" on CUDA, "off" elsewhere.
    - `repair`: what a choreographed call whose context is rewired recomputes of its
      parents' encodings in its own context, unless the call names its own
      (`corps.engine.repair`): "none" (default), "first:K", "recompute:R", "full",
      "temp:T", "serial" (its parents laid end to end first), or several joined by "+";
      or "auto": chosen per workflow and agent from audits (`corps.engine.auto_repair`;
      "auto:P": new keys start at rung P of its ladder).
    - `decision_repair`: the repair the built-in patterns give their decision steps
      (a tree of thoughts' voters, the debate's moderator and judge, map-reduce's
      reducer, branch-solve-merge's merger: `corps.patterns.run.Run.decision_repair`) when
      neither their workflow nor `repair` names one (`repair` stays "none"; under
      "auto" they start auto's ladder at its rung): "query:0.3"
      (the default, `DECISION_REPAIR`; measured in docs/fidelity.md), any policy,
      or "none" for plain choreography. `repair_bound` (True): every repair of a
      choreographed call recomputes at most what the baseline would encode of its
      context, less a margin (`corps.engine.exec.baseline_work`); False lifts it.
    - `audit`: the online fidelity audit (`corps.engine.audit`): 1 in N choreographed
      decodes of each workflow and agent is also encoded as the baseline reads it,
      and the gap between the two is recorded (`Engine.fidelity_report()`, `stats()`, traces,
      /metrics); 0 (the default) audits nothing unless a workflow, agent or call
      asks (or its repair is "auto"). `audit_budget`: the share of the tokens the
      engine encodes for its calls that the audits may encode besides (0.05; 1.0:
      every due audit runs).
    - `jump_forward`: when a decode's constraint allows exactly one continuation
      for several tokens (a JSON key, punctuation), append them without sampling
      and encode them together in the next step (True); False samples each one.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = DEFAULT_MODEL
    mode: Mode = "choreographed"
    dtype: Dtype = DEFAULT_DTYPE
    weights: WeightFormat = "auto"
    device: str = "cpu"
    attention: Attention | None = Field(
        default_factory=lambda: env_value("CORPS_ATTENTION", ATTENTION_BACKENDS)
    )
    contexts: Contexts = Field(
        default_factory=lambda: env_value("CORPS_CONTEXTS", CONTEXTS) or "copy"
    )
    capacity: Annotated[int, Field(ge=16)] | None = None
    memory_budget: Annotated[int, Field(ge=1)] | None = None
    memory_fraction: Annotated[float, Field(gt=0.0, le=1.0)] = 0.9
    queue_size: _Positive = 256
    step_tokens: _Positive | None = None  # None: step_tokens_for(device)
    max_running: _Positive = 256
    run_ahead: _Positive = RUN_AHEAD
    leak_policy: str = "warn"
    trace: Path | None = None
    otel_protocol: OtelProtocol = "http/protobuf"  # before otel: otel's check reads it
    otel: str | None = None
    auto_free: bool = False
    store: Path | None = None
    store_rebuild: bool = False
    jump_forward: bool = True
    graphs: Graphs = "auto"
    repair: str = "none"
    decision_repair: str = DECISION_REPAIR
    repair_bound: bool = True
    audit: int = 0
    audit_budget: Annotated[float, Field(gt=0.0, le=1.0)] = AUDIT_BUDGET
    compile: bool = False
    compile_gemms: CompileGemms = "library"
    precompiled: Precompiled = Field(
        default_factory=lambda: env_setting(
            "CORPS_PRECOMPILED", get_args(Precompiled), "auto", "precompiled"
        )
    )
    admission: bool = True
    max_workflows: _Positive | None = None
    evict: bool = True
    policy: PolicyName = "fcfs"
    deduce_objectives: bool = True
    adapter: Path | None = None
    adapter_copy: bool = True

    @field_validator(
        "attention",
        "contexts",
        "mode",
        "dtype",
        "weights",
        "leak_policy",
        "otel_protocol",
        "policy",
        "precompiled",
        mode="before",
    )
    @classmethod
    def _normalise(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("leak_policy")
    @classmethod
    def _policy(cls, value: str) -> str:
        return check_policy(value)

    @field_validator("otel")
    @classmethod
    def _otel(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        value = value.strip()
        http = info.data.get("otel_protocol", "http/protobuf") == "http/protobuf"
        if not value or (http and not value.startswith(("http://", "https://"))):
            raise ValueError(
                "give the collector's http(s) URL, e.g. http://localhost:4318/v1/traces "
                "(host:port with otel_protocol='grpc')"
            )
        return value

    @field_validator("adapter")
    @classmethod
    def _adapter(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        why = adapter_problem(value)
        if why is not None:
            raise ValueError(why)
        return Path(value).expanduser()

    @field_validator("repair", "decision_repair")
    @classmethod
    def _repair(cls, value: str) -> str:
        try:
            return str(parse_repair(value))  # canonical: "recompute:0.15"
        except InvalidRequest as exc:
            raise ValueError(str(exc)) from None

    @field_validator("audit", mode="before")
    @classmethod
    def _audit(cls, value: Any) -> int:
        try:
            return check_audit(value) or 0  # an int, not "3" nor True: a rate is counted
        except InvalidRequest as exc:
            raise ValueError(str(exc)) from None

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        kind, _, index = value.strip().lower().partition(":")
        if kind not in ("cpu", "cuda", "meta") or (index and not index.isdigit()):
            raise ValueError("must be 'cpu' or 'cuda[:N]'")
        return value.strip().lower()

    @classmethod
    def of(cls, config: EngineConfig | str | None = None, /, **fields: Any) -> EngineConfig:
        """A validated config from a config, a model name, or neither, updated with
        `fields`. Bad values raise InvalidRequest naming each field and what it takes."""
        if isinstance(config, EngineConfig):
            base = config.model_dump()
        elif isinstance(config, str | os.PathLike):
            base = {"model": str(config)}
        elif config is None:
            base = {}
        else:
            raise InvalidRequest(
                f"expected an EngineConfig or a model name, got {type(config).__name__}"
            )
        fields = {k: v for k, v in fields.items() if not (k == "contexts" and v is None)}
        try:
            made = cls(**{**base, **fields})
        except ValidationError as exc:
            fields = tuple(str(e["loc"][0]) for e in exc.errors() if e["loc"])
            raise BadConfig(_explain(exc), fields) from None
        check_combination(made)
        return made


def _explain(exc: ValidationError) -> str:
    """One line per bad field: its name, what it takes, what it got."""
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "config"
        allowed = _ALLOWED.get(field)
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown engine setting {field!r} (settings: {', '.join(_FIELDS)})")
        elif allowed is not None:
            parts.append(f"{field} must be one of {', '.join(allowed)}, got {err['input']!r}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"{field}: {msg}, got {err['input']!r}")
    return "; ".join(parts)


_ALLOWED = {
    "mode": MODES,
    "dtype": DTYPES,
    "contexts": CONTEXTS,
    "attention": ATTENTION_BACKENDS,
    "leak_policy": LEAK_POLICIES,
    "graphs": GRAPHS,
    "weights": WEIGHT_FORMATS,
}
_FIELDS = tuple(EngineConfig.model_fields)
