"""The examples in examples/ run and do what they claim (tiny model for speed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from corps.agents import AgentError
from corps.cache import LeakageError
from corps.engine.api.access import hidden_sources

from conftest import open_tiny

EXAMPLES = Path(__file__).parent.parent / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"examples_{name}"] = module  # pydantic resolves annotations through it
    spec.loader.exec_module(module)
    return module


pd = load("prisoners_dilemma")


def _player(name: str | None) -> str | None:
    """ "alice" or "bob" for a player agent's run-unique name."""
    return name.rsplit("-", 1)[-1] if name and name.startswith("prisoners_dilemma-") else None


@pytest.mark.filterwarnings("ignore::corps.cache.visibility.LeakWarning")
async def test_prisoners_dilemma_warn_flags_leaks_both_ways(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        game = await pd.play(engine, policy="warn", max_tokens=6)
        table = engine.executor.table
        leaks = engine.leaks()
        owners = {
            (_player(leak.reader), _player(table.get(next(iter(leak.sources))).owner))
            for leak in leaks
        }
        assert owners == {("bob", "alice"), ("alice", "bob")}
        # every leak the detector can see is flagged: each call by a player that attends
        # to the other's utterance is in the record
        for leak in leaks:
            assert leak.sources == hidden_sources(table, leak.reader, leak.parent)
        assert game.leaks == len(leaks) == 12
        assert len(game.details["transcript"]) == 4 and set(game.details["decisions"]) == {
            "Alice",
            "Bob",
        }


async def test_prisoners_dilemma_reencode_leaves_no_leak(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        game = await pd.play(engine, policy="reencode", max_tokens=6)
        assert game.leaks == 0 and engine.leaks() == []
        table = engine.executor.table
        players = [m for m in table.all() if _player(m.owner) and m.view_of is None]
        assert len(players) > 10
        for msg in players:
            assert hidden_sources(table, msg.owner, msg.id) == frozenset(), msg
        assert any(e.kind == "reencode" for e in engine.access_events())


async def test_prisoners_dilemma_deny_fails_the_first_offending_call(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        with pytest.raises(AgentError) as info:
            await pd.play(engine, policy="deny", max_tokens=6)
        cause = info.value.__cause__
        assert isinstance(cause, LeakageError)
        assert "-bob" in str(cause).split(" attends")[0] and "alice's system" in str(cause)


async def test_ask_example_runs(tiny_dirs, monkeypatch, capsys):
    ask = load("ask")
    monkeypatch.setattr(ask.Engine, "open", lambda *a, **k: open_tiny(tiny_dirs, "llama"))
    await ask.main()
    assert "Q: What is 7*6?" in capsys.readouterr().out


async def test_custom_workflow_example_asks_its_solvers_at_once(tiny_dirs):
    from corps.agents import Runtime

    example = load("custom_workflow")
    seeds = {sum(map(ord, n)) for n in ("solver-a", "solver-b")}
    assert len(seeds) == 2  # each solver samples with its own seed
    async with open_tiny(tiny_dirs, "llama") as engine, Runtime(engine) as rt:
        result = await example.run(rt, question="What is 3 times 7?")
        stats = engine.stats()
    assert len(result["answers"]) == 2 and isinstance(result["verdict"], str)
    assert stats.mean_batch_size > 1.2  # the two decodes shared steps (alone: 1.0)


@pytest.mark.parametrize(
    ("public", "policy", "leaks"), [(False, "warn", 4), (True, "warn", 0), (False, "reencode", 0)]
)
async def test_the_code_review_leaks_its_private_prompts_unless_public_or_reencoded(
    tiny_dirs, public, policy, leaks
):
    """The writer's draft was encoded over its private prompt (each reviewer leaks it),
    each review over its reviewer's (the writer leaks both); public prompts remove
    the leaks at no cost, reencode by encoding again."""
    import warnings

    from corps.agents import Runtime

    example = load("code_review")
    async with open_tiny(tiny_dirs, "llama", leak_policy=policy) as engine, Runtime(engine) as rt:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            revised = await example.run(rt, public_prompts=public)
        stats = engine.stats()
    assert isinstance(revised, str) and stats.leaks == leaks
