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
from dataclasses import dataclass
from pathlib import Path

from corps.serve.errors import ServeError

#: tenant and agent names: no "/" (it joins them into the engine's owner names)
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class Principal:
    """A tenant, and the agents its requests may act as (None: any name)."""

    tenant: str
    agents: frozenset[str] | None = None

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
        return cls(out)

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


def _principal_of(entry: dict, i: int, path: Path) -> Principal:
    where = f"{path}: keys[{i}]"
    tenant = entry.get("tenant")
    if not isinstance(tenant, str) or not NAME.match(tenant):
        raise ValueError(f"{where}.tenant must match {NAME.pattern}")
    unknown = sorted(set(entry) - {"key", "key_sha256", "tenant", "agents"})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    agents = entry.get("agents")
    if agents is None:
        return Principal(tenant)
    if not isinstance(agents, list) or not all(isinstance(a, str) and NAME.match(a)
                                               for a in agents):  # fmt: skip
        raise ValueError(f"{where}.agents must be a list of names matching {NAME.pattern}")
    return Principal(tenant, frozenset(agents))
