"""The arguments of one prefill or decode call, checked before anything runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from corps.cache.handle import Handle
from corps.cache.visibility import Private, Public, Shared
from corps.engine.errors import InvalidRequest
from corps.engine.sampling import SamplingParams

Text = str | Sequence[int]


@dataclass(frozen=True)
class PrefillRequest:
    message: Text
    role: str = "user"
    parents: Sequence[Handle] = ()
    offsets: Sequence[int | None] | None = None
    new_offset: int | None = None
    frame: bool = True
    owner: str | None = None
    visibility: Any = None

    def __post_init__(self) -> None:
        _check_common(self.role, self.parents, self.owner, self.visibility)
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
    visibility: Any = None

    def __post_init__(self) -> None:
        _check_common(self.role, self.parents, self.owner, self.visibility)
        if not isinstance(self.header, str):
            _check_ids(self.header, "header")
        if not self.frame and len(self.header) == 0:
            raise InvalidRequest(
                "decode with frame=False needs a non-empty header: the first generated token "
                "is predicted from the header's last token"
            )


def decode_request(**kwargs: Any) -> DecodeRequest:
    """A DecodeRequest from the flat keyword arguments of `Engine.decode`."""
    names = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos", "force")
    given = {k: kwargs.pop(k) for k in names if k in kwargs}
    sampling = {k: v for k, v in given.items() if v is not None}  # None means the default
    if "stop" in sampling:
        stop = sampling["stop"]
        sampling["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
    if "force" in sampling:
        sampling["force"] = tuple(sampling["force"])
        sampling.setdefault("max_tokens", max(len(sampling["force"]), 1))
    try:
        return DecodeRequest(sampling=SamplingParams(**sampling), **kwargs)
    except TypeError as exc:
        raise InvalidRequest(f"bad decode arguments: {exc}") from None


def prefill_request(message: Text, **kwargs: Any) -> PrefillRequest:
    try:
        return PrefillRequest(message, **kwargs)
    except TypeError as exc:
        raise InvalidRequest(f"bad prefill arguments: {exc}") from None


def _check_common(role: str, parents: Sequence[Handle], owner: Any, visibility: Any) -> None:
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
