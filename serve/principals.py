"""Who a request is: principals from API keys, and the reader each request reads as.

A principal is a tenant and the agents it may act as. A key file (`corps serve
--keys FILE`, TOML) maps each API key to one:

    [[keys]]
    key = "sk-team-a-1"
    tenant = "team-a"
    agents = ["alice", "bob"]   # corps_agent may name only these; omitted: any

    [[keys]]
    key_sha256 = "9f86d08..."   # the key's SHA-256 in hex: the file holds no secret
    tenant = "team-b"
    weight = 2                  # the tenant's share of the engine under load (default 1)
    max_requests = 16           # this key's requests in the server at once (429 past)
    tokens_per_minute = 20000   # this key's prompt + completion tokens a minute (429 past)

`--api-key KEY` is one key of tenant "default" that may act as any agent; with no
key at all (local use) every request is tenant "local", any agent. A request's
reader is always its principal's (`Who.reader`, "tenant/agent", or "tenant/" for
a request that names no agent): never the engine's sees-everything reader, so a
message private to an agent is private to it over HTTP as in-process.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from corps.serve.errors import ServeError

#: tenant and agent names: no "/" (it joins them into the engine's owner names)
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


#: the largest weight a key file may give a tenant (and 1 / it the smallest)
MAX_WEIGHT = 1000.0
#: the largest quota a key file may give (requests at once, tokens a minute)
MAX_QUOTA = 1 << 40


@dataclass(frozen=True)
class Quota:
    """What one key may hold or spend (None: no bound of its own)."""

    max_requests: int | None = None  # requests in the server at once
    tokens_per_minute: int | None = None  # prompt + completion tokens, a rolling minute


@dataclass(frozen=True, eq=False)
class Principal:
    """A tenant, the agents its requests may act as (None: any name), the tenant's
    weight and the key's quota. Compared by identity: each key's is its own."""

    tenant: str
    agents: frozenset[str] | None = None
    weight: float = 1.0
    quota: Quota = Quota()

    def acting_as(self, agent: str | None) -> Who:
        """The request's identity when it names `agent` (ServeError 403 if this
        principal may not act as it)."""
        if agent is not None and self.agents is not None and agent not in self.agents:
            raise ServeError(
                403, f"corps_agent: this API key may not act as agent {agent!r}; "
                f"ask for a key that lists it", "permission_error", "corps_agent",
            )  # fmt: skip
        return Who(self, agent)


@dataclass(frozen=True)
class Who:
    """One request's identity: its principal and the agent it acts as (None: none)."""

    principal: Principal
    agent: str | None

    @property
    def tenant(self) -> str:
        return self.principal.tenant

    @property
    def reader(self) -> str:
        """The engine owner and reader name of this request's calls."""
        return f"{self.tenant}/{self.agent or ''}"

    @property
    def label(self) -> str:
        return f"agent {self.agent!r}" if self.agent else "a request that names no agent"


LOCAL = Principal("local")


class Keys:
    """API keys and their principals; `principal(authorization)` authenticates a request.

    Keys are kept as SHA-256 digests and compared in constant time."""

    def __init__(self, by_digest: dict[bytes, Principal] | None) -> None:
        # by the SHA-256 of each key; None: no key configured (local use), every
        # request is LOCAL
        self._by_digest = by_digest

    @classmethod
    def single(cls, api_key: str) -> Keys:
        return cls({_digest(api_key): Principal("default")})

    @classmethod
    def load(cls, path: Path) -> Keys:
        """The key file at `path` (ValueError saying what is wrong)."""
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        entries = data.get("keys")
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"{path}: needs one or more [[keys]] tables")
        out: dict[bytes, Principal] = {}
        for i, e in enumerate(entries):
            out[_key_of(e, i, path, out)] = _principal_of(e, i, path)
        weights = _weights(out.values(), path)
        return cls({d: replace(p, weight=weights[p.tenant]) for d, p in out.items()})

    def weights(self) -> dict[str, float]:
        """Each tenant's weight (the fair policy's shares); empty with no key file."""
        return {p.tenant: p.weight for p in (self._by_digest or {}).values()}

    def weighted(self) -> bool:
        """Whether any tenant's weight is not 1."""
        return any(w != 1.0 for w in self.weights().values())

    @property
    def open(self) -> bool:
        """No key configured: every request is the local principal."""
        return self._by_digest is None

    def principal(self, authorization: str) -> Principal | None:
        """The principal of an `Authorization` header's value; None: not authenticated."""
        if self._by_digest is None:
            return LOCAL
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key:
            return None
        given = _digest(key.strip())
        found = None
        for digest, p in self._by_digest.items():  # all compared: no early exit
            if secrets.compare_digest(digest, given):
                found = p
        return found


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def _key_of(entry, i: int, path: Path, seen: dict) -> bytes:
    """The SHA-256 of entry i's key: given as `key`, or as `key_sha256` (hex)."""
    where = f"{path}: keys[{i}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a table")
    if ("key" in entry) == ("key_sha256" in entry):
        raise ValueError(f"{where} needs one of key or key_sha256")
    if "key" in entry:
        key = entry["key"]
        if not isinstance(key, str) or len(key) < 8:
            raise ValueError(f"{where}.key must be a string of 8 or more characters")
        digest = _digest(key)
    else:
        hexed = entry["key_sha256"]
        if not isinstance(hexed, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", hexed):
            raise ValueError(f"{where}.key_sha256 must be 64 hexadecimal digits")
        digest = bytes.fromhex(hexed)
    if digest in seen:
        raise ValueError(f"{where} repeats an earlier key")
    return digest


FIELDS = {"key", "key_sha256", "tenant", "agents", "weight", "max_requests",
          "tokens_per_minute"}  # fmt: skip


def _principal_of(entry: dict, i: int, path: Path) -> Principal:
    where = f"{path}: keys[{i}]"
    tenant = entry.get("tenant")
    if not isinstance(tenant, str) or not NAME.match(tenant):
        raise ValueError(f"{where}.tenant must match {NAME.pattern}")
    unknown = sorted(set(entry) - FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    quota = Quota(*(_count(entry, name, where) for name in ("max_requests", "tokens_per_minute")))
    weight = _weight(entry, where)  # None: the tenant's other keys' (or 1)
    agents = entry.get("agents")
    if agents is not None and (
        not isinstance(agents, list)
        or not all(isinstance(a, str) and NAME.match(a) for a in agents)
    ):
        raise ValueError(f"{where}.agents must be a list of names matching {NAME.pattern}")
    named = None if agents is None else frozenset(agents)
    return Principal(tenant, named, weight if weight is not None else 0.0, quota)


def _count(entry: dict, name: str, where: str) -> int | None:
    """A quota field: a whole number from 1 to MAX_QUOTA, or absent (None)."""
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_QUOTA:
        raise ValueError(f"{where}.{name} must be a whole number from 1 to {MAX_QUOTA}")
    return value


def _weight(entry: dict, where: str) -> float | None:
    value = entry.get("weight")
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not 1 / MAX_WEIGHT <= value <= MAX_WEIGHT:  # NaN fails both
        raise ValueError(f"{where}.weight must be a number from {1 / MAX_WEIGHT} "
                         f"to {MAX_WEIGHT:g}")  # fmt: skip
    return float(value)


def _weights(principals, path: Path) -> dict[str, float]:
    """Each tenant's weight: the one its keys give (0.0: not given), 1 if none gives one;
    ValueError if two of its keys give different weights."""
    out: dict[str, float] = {}
    for p in principals:
        if p.weight and out.get(p.tenant, p.weight) != p.weight:
            raise ValueError(f"{path}: the keys of tenant {p.tenant!r} give it two weights; "
                             f"give one (or give it on one key)")  # fmt: skip
        if p.weight or p.tenant not in out:
            out[p.tenant] = p.weight
    return {t: w or 1.0 for t, w in out.items()}
