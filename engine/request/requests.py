"""The arguments of one prefill or decode call, checked before anything runs.

A call's keyword arguments (`PrefillArgs`, `DecodeArgs`: the typed keywords of
`Engine.prefill` / `Engine.decode` and their twins) are turned into one frozen
request (`PrefillRequest`, `DecodeRequest`) at the API's edge; that request is
what the guard checks, the loop queues and the planner plans.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from corps.cache.handle import Handle
from corps.cache.visibility import Private, Public, Shared, Visibility, check_policy
from corps.engine.audit import check_audit
from corps.engine.errors import InvalidRequest
from corps.engine.repair import Repair, parse_repair
from corps.engine.request.constraint import KINDS, constraint_of
from corps.engine.request.sampling_params import SamplingParams
from corps.engine.request.workflow import Objective, check_objective

Text = str | Sequence[int]


class PrefillArgs(TypedDict, total=False):
    """Keywords of `Engine.prefill` (all optional).

    role: "user" by default. parents: handles the message attends to. offsets: where
    each parent sits (None: right after the previous one). new_offset: where the new
    message starts. frame: wrap in the chat template's role markers (True). owner:
    the agent making the call. visibility: Public(), Private() or Shared(readers).
    leak_policy: this call's leak policy (else the agent's, else the engine's).
    objective: "latency" or "throughput" for the scheduling policy (else the agent's,
    else its workflow's; `corps.engine.request.workflow`). repair: which rewired
    parent encodings to recompute in this call's context, e.g. "recompute:0.15"
    (`corps.engine.repair`; else the engine's `repair`). tenant: whose share of the
    engine the call's work counts against under the `fair` scheduling policy
    (`corps.engine.sched.fair`; None: the engine's one default tenant).
    """

    role: str
    parents: Sequence[Handle]
    offsets: Sequence[int | None] | None
    new_offset: int | None
    frame: bool
    owner: str | None
    visibility: Visibility | None
    leak_policy: str | None
    objective: Objective | None
    repair: str | Repair | None
    tenant: str | None


class DecodeArgs(TypedDict, total=False):
    """Keywords of `Engine.decode`, `stream` and `decode_nowait` (all optional).

    As `PrefillArgs` (role "assistant" by default), plus header (text or ids the
    message starts with) and the sampling settings: either `sampling=SamplingParams(...)`
    or its fields as keywords (max_tokens, temperature, top_p, top_k, seed, stop,
    ignore_eos, force, logprobs, top_logprobs, logit_bias), which override the
    `sampling` given. At most one of regex,
    json_schema (a dict, its JSON or a pydantic model class), choices (the text is
    one of them) or grammar (Lark) constrains the generated text to match it
    (`corps.engine.request.constraint`). cache_salt (baseline mode): the call reuses
    only prompt prefixes cached by calls with the same salt, and its own are found only
    by them (a server gives each tenant its own). audit (N: this call is one of 1 in N
    audited, 0: never; None: its agent's, workflow's, else the engine's): the online
    fidelity audit (`corps.engine.audit`). final (False): no call will read the reply as
    a parent (a workflow's last answer, a vote): its last token and closing footer are
    not run through the model and its encoding is not kept, as a serving engine keeps
    none of a finished request; a later call that does read it has it encoded again from
    its tokens first (as an evicted message), so it is still a valid parent.
    """

    role: str
    parents: Sequence[Handle]
    offsets: Sequence[int | None] | None
    new_offset: int | None
    header: Text
    frame: bool
    owner: str | None
    visibility: Visibility | None
    leak_policy: str | None
    objective: Objective | None
    repair: str | Repair | None
    tenant: str | None
    sampling: SamplingParams
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop: str | Sequence[str] | None
    ignore_eos: bool | None
    force: Sequence[int] | None
    logprobs: bool | None
    top_logprobs: int | None
    logit_bias: Mapping[int, float] | Sequence[tuple[int, float]] | None
    regex: str | None
    json_schema: Mapping[str, Any] | str | type | None
    choices: Sequence[str] | None
    grammar: str | None
    cache_salt: str | None
    audit: int | None
    final: bool


@dataclass(frozen=True)
class PrefillRequest:
    message: Text
    role: str = "user"
    parents: Sequence[Handle] = ()
    offsets: Sequence[int | None] | None = None
    new_offset: int | None = None
    frame: bool = True
    owner: str | None = None
    visibility: Visibility | None = None
    leak_policy: str | None = None
    objective: Objective | None = None
    repair: Repair | None = None  # None: the engine's
    tenant: str | None = None  # whose fair share it counts against (None: the default)

    def __post_init__(self) -> None:
        _check_common(self)
        if not isinstance(self.message, str):
            _check_ids(self.message, "message")
        if not self.frame and len(self.message) == 0:
            raise InvalidRequest("an unframed message must not be empty")


@dataclass(frozen=True)
class DecodeRequest:
    parents: Sequence[Handle] = ()
    offsets: Sequence[int | None] | None = None
    new_offset: int | None = None
    role: str = "assistant"
    header: Text = ""
    frame: bool = True
    sampling: SamplingParams = field(default_factory=SamplingParams)
    owner: str | None = None
    visibility: Visibility | None = None
    leak_policy: str | None = None
    objective: Objective | None = None
    repair: Repair | None = None  # None: the engine's
    cache_salt: str | None = None  # baseline: reuse only prefixes cached under this salt
    audit: int | None = None  # 1 in N audited (corps.engine.audit); None: the next level's
    tenant: str | None = None  # whose fair share it counts against (None: the default)
    final: bool = False  # no call reads the reply: its encoding is not kept

    def __post_init__(self) -> None:
        _check_common(self)
        check_audit(self.audit)
        if not isinstance(self.final, bool):
            raise InvalidRequest(f"final must be True or False, got {type(self.final).__name__}")
        if self.cache_salt is not None and not isinstance(self.cache_salt, str):
            raise InvalidRequest(f"cache_salt must be a string, got {type(self.cache_salt)}")
        if not isinstance(self.sampling, SamplingParams):
            raise InvalidRequest(f"sampling must be a SamplingParams, got {self.sampling!r}")
        if not isinstance(self.header, str):
            _check_ids(self.header, "header")
        if not self.frame and len(self.header) == 0:
            raise InvalidRequest(
                "decode with frame=False needs a non-empty header: the first generated token "
                "is predicted from the header's last token"
            )


_SAMPLING = tuple(f.name for f in dataclasses.fields(SamplingParams) if f.name != "constraint")


def decode_request(args: Mapping[str, Any] | DecodeRequest) -> DecodeRequest:
    """A DecodeRequest from `DecodeArgs` (or the request itself)."""
    if isinstance(args, DecodeRequest):
        return args
    kwargs = dict(args)
    given_base = kwargs.pop("sampling", None)
    base = given_base or SamplingParams()
    if not isinstance(base, SamplingParams):
        raise InvalidRequest(f"sampling must be a SamplingParams, got {base!r}")
    given = {k: kwargs.pop(k) for k in _SAMPLING if k in kwargs}
    sampling = {k: v for k, v in given.items() if v is not None}  # None means the default
    constraint = constraint_of(**{k: kwargs.pop(k) for k in KINDS if k in kwargs})
    if constraint is not None:
        sampling["constraint"] = constraint
    if "stop" in sampling:
        stop = sampling["stop"]
        sampling["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
    if "logit_bias" in sampling:
        bias = sampling["logit_bias"]
        pairs = bias.items() if isinstance(bias, Mapping) else bias
        sampling["logit_bias"] = tuple(sorted(pairs))
    if "force" in sampling:
        sampling["force"] = tuple(sampling["force"])
        if "max_tokens" not in sampling and (
            given_base is None or base.max_tokens < len(sampling["force"])
        ):  # a forced decode runs as many tokens as it is given
            sampling["max_tokens"] = max(len(sampling["force"]), 1)
    _check_names(kwargs, DecodeArgs, "decode")
    return DecodeRequest(sampling=dataclasses.replace(base, **sampling), **kwargs)


def prefill_request(message: Text, args: Mapping[str, Any]) -> PrefillRequest:
    """A PrefillRequest from a message and `PrefillArgs`."""
    _check_names(args, PrefillArgs, "prefill")
    return PrefillRequest(message, **args)


def prefill_request_of(args: Mapping[str, Any] | PrefillRequest) -> PrefillRequest:
    """A PrefillRequest from one item of `prefill_many`: a request, or a mapping with
    `message` and `PrefillArgs`."""
    if isinstance(args, PrefillRequest):
        return args
    kwargs = dict(args)
    if "message" not in kwargs:
        raise InvalidRequest("each prefill_many item needs a 'message'")
    return prefill_request(kwargs.pop("message"), kwargs)


def _check_names(kwargs: Mapping[str, Any], args: type, call: str) -> None:
    unknown = sorted(set(kwargs) - set(args.__annotations__))
    if unknown:
        raise InvalidRequest(
            f"unknown {call} argument(s) {', '.join(map(repr, unknown))}; "
            f"{call} takes {', '.join(args.__annotations__)}"
        )


def _check_common(req: PrefillRequest | DecodeRequest) -> None:
    role, parents, owner, visibility = req.role, req.parents, req.owner, req.visibility
    if req.leak_policy is not None:
        check_policy(req.leak_policy)
    if req.repair is not None:  # a string becomes its Repair (frozen: set once, here)
        object.__setattr__(req, "repair", parse_repair(req.repair))
    check_objective(req.objective)
    tenant = req.tenant
    if tenant is not None and (not isinstance(tenant, str) or not 0 < len(tenant) <= 200):
        raise InvalidRequest(
            f"tenant must be a name of 1 to 200 characters, got {type(tenant).__name__}"
        )
    if not isinstance(role, str) or not role:
        raise InvalidRequest(f"role must be a non-empty string, got {role!r}")
    if owner is not None and (not isinstance(owner, str) or not owner):
        raise InvalidRequest(f"owner must be an agent name (a non-empty string), got {owner!r}")
    if visibility is not None and not isinstance(visibility, Public | Private | Shared):
        raise InvalidRequest(
            f"visibility must be Public(), Private() or Shared(readers), got {visibility!r}"
        )
    if isinstance(parents, Handle | str):
        raise InvalidRequest("parents must be a list of handles, not a single value")
    for p in parents:
        if not isinstance(p, Handle):
            raise InvalidRequest(
                f"parents must be Handles returned by this engine, got {type(p).__name__}"
            )


def _check_ids(ids: Sequence[int], what: str) -> None:
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise InvalidRequest(f"{what} must be text or a list of non-negative token ids")
