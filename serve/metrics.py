"""The server's Prometheus metrics: its own counters beside the engine's statistics,
in Prometheus' text exposition format (`GET /metrics`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Metrics:
    """Counters only: labels are status codes and, where the operator allows it
    (`corps serve --tenant-metrics`), the key file's tenant names: never anything a
    client sent."""

    requests: int = 0  # HTTP requests received
    errors: Counter = field(default_factory=Counter)  # requests refused or failed, by status
    completions: int = 0  # choices generated
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens read from the store, not encoded again
    # per tenant: tokens of its answered requests (prompt + completion), its refusals
    tenant_tokens: Counter = field(default_factory=Counter)
    tenant_refused: Counter = field(default_factory=Counter)

    def count(self, prompt, replies, tenant: str = "") -> int:
        """One answered request of `tenant`: its prompt (`completion.Prompt`) and its
        replies' handles; returns its tokens, prompt and completion."""
        generated = sum(len(h.generated) for h in replies)
        self.completions += len(replies)
        self.prompt_tokens += prompt.tokens
        self.completion_tokens += generated
        self.cached_tokens += prompt.cached_tokens
        self.tenant_tokens[tenant] += prompt.tokens + generated
        return prompt.tokens + generated

    def refused(self, status: int, tenant: str | None = None) -> None:
        self.errors[status] += 1
        if tenant is not None:
            self.tenant_refused[tenant] += 1

    def refused_tenant(self, tenant: str) -> None:
        """A request of `tenant` refused at the gate (counted by status by the handler)."""
        self.tenant_refused[tenant] += 1

    def tenants(self, inside: dict[str, int], service: dict[str, dict]) -> dict[str, dict]:
        """Per tenant: requests inside now, tokens answered, refusals, and the engine's
        fair share figures where it keeps them (`service`: served, standing, weight)."""
        names = set(inside) | set(self.tenant_tokens) | set(self.tenant_refused) | set(service)
        return {t: {"inside": inside.get(t, 0), "tokens": self.tenant_tokens[t],
                    "refused": self.tenant_refused[t], **service.get(t, {})}
                for t in sorted(names)}  # fmt: skip

    def render(self, stats, inside: int = 0, audits=None, tenants=None) -> str:
        """The text exposition of these counters, the requests inside the server now,
        the engine's `EngineStats` and its fidelity audits (an `AuditReport`) by repair
        policy (the engine's own names: never a client's agent or workflow); with
        `tenants` (`Metrics.tenants`), a series per tenant."""
        rows = [
            ("corps_http_requests_total", "counter", "HTTP requests received", self.requests),
            ("corps_http_requests_inside", "gauge", "requests being answered now", inside),
            ("corps_completions_total", "counter", "choices generated", self.completions),
            ("corps_prompt_tokens_total", "counter", "prompt tokens", self.prompt_tokens),
            ("corps_completion_tokens_total", "counter", "tokens generated",
             self.completion_tokens),
            ("corps_cached_tokens_total", "counter", "prompt tokens reused from the store",
             self.cached_tokens),
            ("corps_tokens_encoded_total", "counter", "tokens run through the model",
             stats.tokens_encoded),
            ("corps_tokens_reused_total", "counter", "cached tokens attended to",
             stats.tokens_reused),
            ("corps_queue_depth", "gauge", "calls waiting to be admitted", stats.queue_depth),
            ("corps_running_calls", "gauge", "calls admitted and stepping", stats.running),
            ("corps_store_used_tokens", "gauge", "KV store slots in use", stats.tokens_used),
            ("corps_store_capacity_tokens", "gauge", "KV store slots", stats.capacity),
            ("corps_tokens_evicted_total", "counter", "tokens whose encodings left the KV "
             "store for room", stats.tokens_evicted),
            ("corps_tokens_recomputed_total", "counter", "evicted tokens encoded again when "
             "read", stats.tokens_recomputed),
            ("corps_tokens_copied_back_total", "counter", "evicted tokens copied back from "
             "the store (--store) instead", stats.tokens_copied_back),
            ("corps_tokens_prefetched_total", "counter", "of those, copied back before the "
             "step that read them", stats.tokens_prefetched),
            ("corps_tokens_spilled", "gauge", "tokens of live messages out of the KV store "
             "(on disk with --store)", stats.tokens_spilled),
            ("corps_steps_total", "counter", "fused forward steps", stats.steps),
            ("corps_step_seconds_total", "counter", "seconds spent in steps", stats.step_s),
            ("corps_leaks_total", "counter", "calls' reads of context hidden from their reader "
             "(leak policies allow and warn)", stats.leaks),
            ("corps_audited_calls_total", "counter", "decodes audited against the baseline",
             stats.audited),
            ("corps_audit_tokens_total", "counter", "tokens the audits' shadows encoded",
             stats.audit_tokens),
            ("corps_audits_failed_total", "counter", "audits whose shadow could not run",
             stats.audits_failed),
        ]  # fmt: skip
        out = []
        for name, kind, about, value in rows:
            out += [f"# HELP {name} {about}", f"# TYPE {name} {kind}", f"{name} {value}"]
        name = "corps_http_errors_total"
        out += [f"# HELP {name} requests answered with an error, by status",
                f"# TYPE {name} counter"]  # fmt: skip
        out += [f'{name}{{status="{s}"}} {n}' for s, n in sorted(self.errors.items())]
        return "\n".join(out + _audits(audits) + _tenants(tenants)) + "\n"


TENANT_SERIES = (
    ("inside", "corps_tenant_requests_inside", "gauge", "requests being answered now"),
    ("tokens", "corps_tenant_tokens_total", "counter", "prompt and completion tokens answered"),
    ("refused", "corps_tenant_refused_total", "counter", "requests refused (429 and others)"),
    ("served", "corps_tenant_service_tokens_total", "counter",
     "tokens the engine encoded and sampled for it (fair policy)"),
    ("standing", "corps_tenant_standing", "gauge",
     "recent service per unit of weight (fair policy)"),
    ("weight", "corps_tenant_weight", "gauge", "its share of the engine (fair policy)"),
)  # fmt: skip


def _tenants(tenants: dict[str, dict] | None) -> list[str]:
    if not tenants:
        return []
    out = []
    for key, name, kind, about in TENANT_SERIES:
        rows = [(t, f[key]) for t, f in tenants.items() if key in f]
        if rows:
            out += [f"# HELP {name} per tenant: {about}", f"# TYPE {name} {kind}"]
            out += [f'{name}{{tenant="{t}"}} {v:.6g}' for t, v in rows]
    return out


def _audits(report) -> list[str]:
    """Per repair policy: the audited gap (KL nats per token) and argmax agreement."""
    if report is None or not report.rows:
        return []
    by: dict[str, list[float]] = {}  # policy -> positions, gap sum, agreement sum
    for r in report.rows:
        s = by.setdefault(r.key.repair, [0, 0.0, 0.0])
        s[0] += r.positions
        s[1] += r.gap * r.positions
        s[2] += r.agreement * r.positions
    out = []
    for name, about, i in (
        ("corps_audit_gap", "mean KL(baseline || choreographed), nats per token", 1),
        ("corps_audit_agreement", "share of positions whose most likely token agrees", 2),
    ):
        out += [f"# HELP {name} {about}", f"# TYPE {name} gauge"]
        out += [f'{name}{{repair="{p}"}} {s[i] / s[0]:.6g}' for p, s in sorted(by.items()) if s[0]]
    return out
