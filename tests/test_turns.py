"""engine/api/turns.py's outside inputs: a recorded run that asks for an input nobody
gave pauses (`AwaitingInput`), keeps what it finished, and made again once the input
is given (from another engine on the store) replays and goes on from it, as a run
given the input at once would; one that waits in the process wakes when it is given.
Recorded calls' replay itself is tested in tests/test_persist.py."""

from __future__ import annotations

import anyio
import pytest

from corps.cache.errors import InvalidRequest
from corps.engine.api.engine import Engine
from corps.engine.errors import AwaitingInput

from conftest import open_tiny

GREEDY = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}


async def approval_run(engine: Engine) -> tuple[list[int], list[int]]:
    """A question, a draft, a person's approval, a final reply over all three: the
    ids of the question and the draft, and the final reply's tokens."""
    with engine.recorded("review") as run:
        q = await engine.prefill("what is two and two")
        draft = await engine.decode(parents=[q], **GREEDY)
        approval = await run.input("approval")
        final = await engine.decode(parents=[q, draft, approval], **GREEDY)
    return [q.id, draft.id], list(final.tokens)


def test_a_run_paused_for_an_input_resumes_from_it_in_another_engine(tiny_dirs, tmp_path):
    store = tmp_path / "store"

    async def main():
        async with open_tiny(tiny_dirs, store=tmp_path / "ref") as e:
            with e.recorded("review") as run:
                await run.give("approval", "yes, go on")
            _, want = await approval_run(e)
        async with open_tiny(tiny_dirs, store=store) as e:
            with pytest.raises(AwaitingInput, match="approval") as paused:
                await approval_run(e)
            assert (paused.value.run, paused.value.key) == ("review", "approval")
            made = [m.id for m in e.messages()]
        async with open_tiny(tiny_dirs, store=store) as e:  # another engine gives it
            with e.recorded("review") as run:
                given = await run.give("approval", "yes, go on")
            assert given.id not in made
        async with open_tiny(tiny_dirs, store=store) as e:
            ids, got = await approval_run(e)
            stats = e.stats()
        assert ids == made and got == want  # the finished turns replayed, the rest ran
        assert stats.tokens_recomputed == 0

    anyio.run(main)


def test_a_run_that_waits_in_the_process_wakes_when_its_input_is_given(tiny_dirs, tmp_path):
    async def main():
        async with open_tiny(tiny_dirs, store=tmp_path / "store") as e:
            got: list = []

            async def waiter(asked: anyio.Event) -> None:
                with e.recorded("chat") as run:
                    asked.set()
                    got.append(await run.input("reply", wait=True))

            async with anyio.create_task_group() as tg:
                asked = anyio.Event()
                tg.start_soon(waiter, asked)
                await asked.wait()
                with e.recorded("chat") as run:
                    given = await run.give("reply", "forty-two", owner="alice")
            assert got[0].id == given.id and e.read(got[0], reader="alice") == "forty-two"
            with e.recorded("chat") as run:  # given: read at once, in order
                assert (await run.input("reply")).id == given.id

    anyio.run(main)


def test_a_freed_input_is_asked_for_again_and_bad_keys_are_refused(tiny_dirs, tmp_path):
    async def main():
        async with open_tiny(tiny_dirs, store=tmp_path / "store") as e:
            with e.recorded("r") as run:
                given = await run.give("k", "an answer")
                e.free(given)
                with pytest.raises(AwaitingInput):
                    await run.input("k")
                messages = e.stats().messages
                for bad in ("", 7, None, "x" * 201):
                    with pytest.raises(InvalidRequest, match="key"):
                        await run.input(bad)
                    with pytest.raises(InvalidRequest, match="key"):
                        await run.give(bad, "text")
                assert e.stats().messages == messages  # nothing made by a refused give
            e.check()

    anyio.run(main)
