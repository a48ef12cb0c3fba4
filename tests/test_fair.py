"""engine/sched/fair.py: each tenant its share. Order by service received, the bounded
gap between backlogged tenants (VTC's guarantee) under any weights and call sizes,
protection of a tenant that asks far less than its share, work conservation with
one tenant, weights checked; and on a real engine, a tenant's service is the tokens
its calls encoded and sampled."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.engine import Engine
from corps.engine.errors import InvalidRequest
from corps.engine.sched.fair import FairShare, tenant_of

from helpers import fake_job as job


def names(groups):
    return [[j.name for j in g] for g in groups]


def test_the_least_served_tenant_goes_first():
    p = FairShare(aging_s=100, half_life_s=1e9)
    p.served([(job(0, tenant="a"), 500), (job(0, tenant="b"), 50)], now=1.0)
    a, b = job(2.0, tenant="a", name="a"), job(3.0, tenant="b", name="b")
    assert names(p.order([a, b], now=4.0)) == [["b"], ["a"]]  # b came later, served less
    ordered = p.step_order([a, b])
    assert [j.name for j in ordered] == ["b", "a"]


def test_a_tenants_standing_halves_each_half_life_and_weighs_by_its_weight():
    p = FairShare(half_life_s=10.0)
    p.set_weights({"a": 2.0})
    p.served([(job(0, tenant="a"), 100)], now=0.0)
    assert p.standing("a", now=0.0) == pytest.approx(50.0)  # 100 tokens / weight 2
    assert p.standing("a", now=10.0) == pytest.approx(25.0)
    assert p.standing("b", now=10.0) == 0.0  # never served
    assert p.figures(now=10.0)["a"]["served"] == 100


def test_a_call_that_names_no_tenant_is_the_default_tenant():
    assert tenant_of(job(0)) == ""
    assert tenant_of(job(0, tenant="t")) == "t"


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0, 4.0]), min_size=2, max_size=4),
    costs=st.lists(st.integers(1, 200), min_size=1, max_size=8),
    steps=st.integers(20, 200),
)
def test_backlogged_tenants_stay_within_one_call_of_their_weighted_share(weights, costs, steps):
    """Every tenant always has a call waiting; one slot at a time is given to the
    first group of the policy's order and charged at once. The gap between any two
    tenants' service per weight never exceeds the largest call over the smallest
    weight (without forgetting): each gets its weighted share within one call."""
    p = FairShare(aging_s=1e9, half_life_s=1e12)
    tenants = [f"t{i}" for i in range(len(weights))]
    p.set_weights(dict(zip(tenants, weights, strict=True)))
    served = dict.fromkeys(tenants, 0.0)
    bound = max(costs) / min(weights)
    for i in range(steps):
        waiting = [job(float(i), tenant=t, name=t) for t in tenants]
        first = p.order(waiting, now=float(i))[0][0]
        cost = costs[i % len(costs)]
        p.served([(first, cost)], now=float(i))
        served[first.name] += cost
        per_weight = [served[t] / w for t, w in zip(tenants, weights, strict=True)]
        assert max(per_weight) - min(per_weight) <= bound + 1e-6
        weight = weights[tenants.index(first.name)]
        assert p.standing(first.name, now=float(i)) == pytest.approx(served[first.name] / weight)


def test_a_light_tenants_first_token_is_protected_beside_a_heavy_one():
    p = FairShare(aging_s=100, half_life_s=1e9, cost=None, feedback=None, latency_prefill=16)
    heavy = [job(0.0, tenant="heavy", name=f"h{i}") for i in range(4)]
    p.served([(heavy[0], 10_000)], now=1.0)
    light = job(2.0, tenant="light", name="light")
    p.order([light], now=2.0)
    running = [*heavy, light]
    ordered = p.step_order(running)
    assert ordered[0] is light  # its prompt first in the step's budget
    assert p.is_latency(light) and p.is_critical(light)
    assert not p.is_critical(heavy[0])
    assert p.step_budget(ordered, 512) == len(running) + 16  # the step bounded beside it
    assert not p.may_admit([job(2.5, tenant="heavy")], running * 2, [], now=3.0)
    assert p.figures()["light"]["protected"] == 1.0
    light.generated = [7]  # past its first token: no longer critical
    assert not p.is_critical(light)


def test_alone_or_alike_nothing_is_held_back():
    """One tenant, or tenants of like standing: every call runs with the whole budget."""
    p = FairShare(aging_s=100, half_life_s=1e9)
    alone = [job(0.0, tenant="a") for _ in range(5)]
    p.served([(alone[0], 10_000)], now=1.0)
    assert p.step_calls(p.step_order(alone)) == alone
    assert p.step_budget(alone, 512) == 512
    both = [*alone, *(job(0.0, tenant="b") for _ in range(5))]
    p.served([(both[-1], 9_000)], now=1.0)  # b has about as much as a
    order = p.step_order(both)
    assert not any(p.is_critical(j) for j in both)
    assert sorted(map(id, p.step_calls(order))) == sorted(map(id, both))
    assert p.step_budget(both, 512) == 512


@pytest.mark.parametrize(
    "weights",
    [
        {"a": 0},
        {"a": -1},
        {"a": math.nan},
        {"a": math.inf},
        {"a": 1e6},
        {"a": True},
        {"a": "2"},
        {3: 1.0},
        {"x" * 201: 1.0},
    ],
)
def test_bad_weights_are_refused_and_change_nothing(weights):
    p = FairShare()
    p.set_weights({"ok": 2.0})
    with pytest.raises(InvalidRequest):
        p.set_weights({"b": 1.0, **weights})
    assert set(p.shares) == {"ok"} and p.shares["ok"].weight == 2.0


async def test_a_tenants_service_is_what_its_calls_encoded_and_sampled():
    async with Engine.open("dummy:tiny", policy="fair") as engine:
        q = await engine.prefill("hello there", tenant="team-a")
        r = await engine.decode(parents=[q], max_tokens=5, temperature=0.0, tenant="team-a")
        o = await engine.decode(parents=[q], max_tokens=3, temperature=0.0)
        figures = engine.policy.figures()
        assert figures["team-a"]["served"] == (
            q.tokens_encoded + r.tokens_encoded + len(r.generated)
        )
        assert figures[""]["served"] == o.tokens_encoded + len(o.generated)
        with pytest.raises(InvalidRequest, match="tenant"):
            await engine.prefill("x", tenant=7)
        with pytest.raises(InvalidRequest, match="tenant"):
            await engine.decode(parents=[q], tenant="")
        engine.check()


async def test_under_a_backlog_two_tenants_get_service_in_their_weights_ratio():
    """Two slots, each tenant keeping four decodes waiting, nothing forgotten: the
    service each received, per unit of weight, ends within what the two slots' calls
    in flight can hold (weights 3:1)."""
    import anyio

    async with Engine.open("dummy:tiny", policy="fair", max_running=2) as engine:
        engine.policy.set_weights({"a": 3.0, "b": 1.0})
        engine.policy.half_life_s = 1e12
        q = await engine.prefill("the shared question")
        done = {"a": 0, "b": 0}
        stop = anyio.Event()

        async def loop(tenant: str) -> None:
            while not stop.is_set():
                h = await engine.decode(parents=[q], max_tokens=4, temperature=0.0,
                                        ignore_eos=True, tenant=tenant)  # fmt: skip
                engine.free(h)
                done[tenant] += 1
                if sum(done.values()) >= 80:
                    stop.set()

        async with anyio.create_task_group() as tg:
            for tenant in ("a", "a", "a", "a", "b", "b", "b", "b"):
                tg.start_soon(loop, tenant)
        figures = engine.policy.figures()
        call = max(f["served"] / max(done[t], 1) for t, f in figures.items() if t in done)
        a, b = figures["a"]["served"] / 3.0, figures["b"]["served"] / 1.0
        assert abs(a - b) <= 3 * call, (figures, done)  # b's calls count whole: 1 / weight
        assert done["a"] > 2 * done["b"]  # about three to one
        engine.check()
