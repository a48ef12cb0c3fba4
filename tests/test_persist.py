"""Messages outliving the engine (`EngineConfig.store`): reopened with the same model,
every message and id is back and a call over them decodes what it would have
without the restart (encodings copied in, or encoded again from tokens); a killed
process leaves every message made before it; another setup is refused."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import anyio
import pytest

from corps.cache.durable import KV, StoreMismatch
from corps.cache.errors import UnknownHandle
from corps.engine.api.engine import Engine
from corps.engine.errors import BadConfig

from conftest import open_tiny

GREEDY = {"max_tokens": 6, "temperature": 0.0}


async def conversation(engine: Engine) -> tuple[list[int], str]:
    """A system prompt, a question, a reply: their ids, and a follow-up's text."""
    system = await engine.prefill("you are terse", role="system")
    q = await engine.prefill("what is two and two", parents=[system])
    a = await engine.decode(parents=[system, q], **GREEDY)
    b = await engine.decode(parents=[system, q, a], **GREEDY)
    return [system.id, q.id, a.id], engine.read(b, reader=None)


async def follow_up(engine: Engine, ids: list[int]) -> str:
    b = await engine.decode(parents=[engine.handle(i) for i in ids], **GREEDY)
    return engine.read(b, reader=None)


@pytest.mark.parametrize("mode", ["choreographed", "baseline"])
def test_reopened_messages_keep_their_ids_and_decode_as_before(tiny_dirs, tmp_path, mode):
    store = tmp_path / "store"

    async def main():
        async with open_tiny(tiny_dirs, mode=mode, store=store) as e:
            ids, want = await conversation(e)
            texts = [e.read(e.handle(i), reader=None) for i in ids]
        async with open_tiny(tiny_dirs, mode=mode, store=store) as e:
            assert [e.read(e.handle(i), reader=None) for i in ids] == texts
            assert await follow_up(e, ids) == want
            assert e.stats().tokens_recomputed == 0  # copied in, not encoded again
            new = await e.prefill("and three", parents=[e.handle(ids[0])])
            assert new.id > max(ids) + 1  # ids continue after every stored one

    anyio.run(main)


def test_without_saved_encodings_messages_are_encoded_again_from_their_tokens(tiny_dirs, tmp_path):
    """Encoding files lost (or never written: a crash): the same reply, recomputed."""
    store = tmp_path / "store"

    async def main():
        async with open_tiny(tiny_dirs, store=store) as e:
            ids, want = await conversation(e)
        for f in (store / KV).iterdir():
            f.unlink()
        async with open_tiny(tiny_dirs, store=store) as e:
            assert await follow_up(e, ids) == want
            assert e.stats().tokens_recomputed > 0

    anyio.run(main)


def test_a_freed_message_stays_freed_and_its_encoding_goes(tiny_dirs, tmp_path):
    store = tmp_path / "store"

    async def main():
        async with open_tiny(tiny_dirs, store=store) as e:
            keep = await e.prefill("kept")
            gone = await e.prefill("freed")
            e.free(gone)
            ids = (keep.id, gone.id)
        assert not (store / KV / f"{ids[1]}.safetensors").exists()
        async with open_tiny(tiny_dirs, store=store) as e:
            assert e.read(e.handle(ids[0]), reader=None) == "kept"
            with pytest.raises(UnknownHandle):
                await e.decode(parents=[e.handle(ids[1])], **GREEDY)

    anyio.run(main)


def test_another_setup_is_refused_and_nothing_is_changed(tiny_dirs, tmp_path):
    store = tmp_path / "store"

    async def main():
        async with open_tiny(tiny_dirs, store=store) as e:
            await e.prefill("hello")

    anyio.run(main)
    before = (store / "messages.db").read_bytes()
    with pytest.raises(StoreMismatch, match="dtype"):
        open_tiny(tiny_dirs, store=store, dtype="bfloat16")
    with pytest.raises(StoreMismatch, match="mode"):
        open_tiny(tiny_dirs, store=store, mode="baseline")
    with pytest.raises(StoreMismatch, match="model"):
        open_tiny(tiny_dirs, "qwen2", store=store)
    assert (store / "messages.db").read_bytes() == before


def test_bad_store_settings_fail_before_loading(tiny_dirs, tmp_path):
    with pytest.raises(BadConfig, match="not for mode='hf'"):
        open_tiny(tiny_dirs, mode="hf", store=tmp_path / "s")
    (tmp_path / "file").write_text("x")
    with pytest.raises(BadConfig, match="is a file"):
        open_tiny(tiny_dirs, store=tmp_path / "file")


KILLED = """
import os, anyio
from corps.engine.api.engine import Engine

async def main():
    async with Engine.open({model!r}, dtype="float32", capacity=4096, store={store!r}) as e:
        system = await e.prefill("you are terse", role="system")
        q = await e.prefill("what is two and two", parents=[system])
        a = await e.decode(parents=[system, q], max_tokens=6, temperature=0.0)
        print(system.id, q.id, a.id, flush=True)
        os._exit(9)  # killed: nothing closes, nothing is saved at the end

anyio.run(main)
"""


def test_a_killed_process_leaves_every_message_it_made(tiny_dirs, tmp_path):
    """No close, no checkpoint: the rows and encodings written as each message was made
    are there, and a follow-up over them decodes as in one process."""
    store = tmp_path / "store"
    script = KILLED.format(model=str(tiny_dirs["llama"]), store=str(store))
    env = {**os.environ, "CORPS_PRECOMPILED": "off"}
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
        env=env, timeout=300,
    )  # fmt: skip
    assert run.returncode == 9, run.stderr[-2000:]
    ids = [int(x) for x in run.stdout.split()]

    async def main():
        async with open_tiny(tiny_dirs, store=tmp_path / "ref") as e:
            _, want = await conversation(e)
        async with open_tiny(tiny_dirs, store=store) as e:
            assert [m.id for m in e.messages()] == sorted(ids)
            assert await follow_up(e, ids) == want

    anyio.run(main)


async def crowd(engine: Engine) -> tuple[str, str, int]:
    """Two ~50-token messages, a long decode that does not fit beside both, then a call
    over the first message (whose encoding the decode's admission dropped)."""
    a = await engine.prefill("alpha beta gamma delta " * 2)
    b = await engine.prefill("one two three four five " * 2)
    long = await engine.decode(parents=[b], max_tokens=90, ignore_eos=True)
    back = await engine.decode(parents=[a], max_tokens=8, ignore_eos=True)
    return long.text, back.text, a.length


def test_with_a_store_an_evicted_encoding_comes_back_by_copy(tiny_dirs, tmp_path):
    """The store is the memory's tier: an encoding evicted for room is saved there and
    copied back when read (no model run), and its reader decodes as with room."""

    async def main():
        async with open_tiny(tiny_dirs) as roomy:
            want = await crowd(roomy)
        async with open_tiny(tiny_dirs, capacity=180, store=tmp_path / "s") as tight:
            got = await crowd(tight)
            stats = tight.stats()
            tight.check()
        assert got == want
        assert stats.messages_evicted >= 1 and stats.tokens_recomputed == 0
        assert stats.tokens_copied_back >= got[2]

    anyio.run(main)


def test_a_recorded_run_replays_its_finished_calls_and_runs_the_rest(tiny_dirs, tmp_path):
    """`engine.recorded(name)`: run again under its name, every call that finished
    before returns its message at once (same ids, same text, nothing encoded); a
    call with other inputs runs."""
    store = tmp_path / "store"

    async def main():
        async with open_tiny(tiny_dirs, store=store) as e:
            with e.recorded("run-1"):
                ids, want = await conversation(e)
        async with open_tiny(tiny_dirs, store=store) as e:
            with e.recorded("run-1"):
                again, got = await conversation(e)
            assert (again, got) == (ids, want)
            assert e.stats().tokens_encoded == 0
            with e.recorded("run-1"):  # same run, another question: that one runs
                other = await e.prefill("what is three and three", parents=[e.handle(ids[0])])
            assert other.id not in ids and e.stats().tokens_encoded > 0
            with e.recorded("run-2"):  # another run's calls are its own
                fresh = await e.prefill("you are terse", role="system")
            assert fresh.id != ids[0]

    anyio.run(main)


KILLED_RUN = """
import os, anyio
from corps.engine.api.engine import Engine

async def main():
    async with Engine.open({model!r}, dtype="float32", capacity=4096, store={store!r}) as e:
        with e.recorded("run-1"):
            system = await e.prefill("you are terse", role="system")
            q = await e.prefill("what is two and two", parents=[system])
            a = await e.decode(parents=[system, q], max_tokens=6, temperature=0.0)
            os._exit(9)  # killed before its last turn

anyio.run(main)
"""


def test_a_killed_run_resumes_from_its_last_finished_call(tiny_dirs, tmp_path):
    """Killed before its last call: run again under its name, the three finished calls
    are replayed from the store (their encodings, saved as each was made, copied back:
    nothing finished is encoded again) and only the last runs, giving what an
    uninterrupted run gives."""
    store = tmp_path / "store"
    script = KILLED_RUN.format(model=str(tiny_dirs["llama"]), store=str(store))
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
        env={**os.environ, "CORPS_PRECOMPILED": "off"}, timeout=300,
    )  # fmt: skip
    assert run.returncode == 9, run.stderr[-2000:]

    async def main():
        async with open_tiny(tiny_dirs, store=tmp_path / "ref") as e:
            _, want = await conversation(e)
        async with open_tiny(tiny_dirs, store=store) as e:
            with e.recorded("run-1"):
                _, got = await conversation(e)
            assert got == want
            stats = e.stats()
        # only the follow-up ran, over the finished turns' encodings copied back
        assert stats.tokens_recomputed == 0 and stats.tokens_copied_back > 0
        assert 0 < stats.tokens_encoded < sum(len(m.tokens) for m in e.messages())

    anyio.run(main)


def test_recorded_runs_need_a_store_and_a_name(tiny_dirs, tmp_path):
    from corps.cache.errors import InvalidRequest

    async def main():
        async with open_tiny(tiny_dirs) as e:
            with pytest.raises(InvalidRequest, match="store"):
                e.recorded("x")
        async with open_tiny(tiny_dirs, store=tmp_path / "s") as e:
            for bad in ("", 7, "x" * 201):
                with pytest.raises(InvalidRequest, match="name"), e.recorded(bad):
                    pass

    anyio.run(main)


KILLED_TOT = """
import os, random, anyio
from corps.agents import Runtime
from corps.engine.api.engine import Engine
from corps.engine.api.submit import Submitter
from corps.patterns.tree_of_thoughts import tree_of_thoughts

done, kill_at = [0], {kill_at}
wait = Submitter.wait

async def counted(self, job):
    handle = await wait(self, job)
    done[0] += 1
    if done[0] == kill_at:
        os._exit(9)  # killed right after this call finished and was recorded
    return handle

Submitter.wait = counted

async def main():
    async with Engine.open({model!r}, dtype="float32", capacity=4096, store={store!r}) as e:
        async with Runtime(e) as rt:
            with e.recorded("tot"):
                await tree_of_thoughts(rt, **{params!r})

anyio.run(main)
"""


def test_a_tree_of_thoughts_killed_at_a_random_turn_resumes_to_the_same_answer(tiny_dirs, tmp_path):
    """Killed after a random number of finished calls (drawn per run of the suite and
    printed on failure): resumed under its name, the answer is an uninterrupted run's,
    every finished call is replayed and none of their tokens is encoded again."""
    from corps.agents import Runtime
    from corps.patterns.tree_of_thoughts import tree_of_thoughts

    params = dict(branches=3, voters=2, max_tokens=6, vote_tokens=4, seed=5)
    kill_at = random.Random().randint(1, 3 + 3 + 2 + 2)  # prompts, branches, votes, answer
    store = tmp_path / "store"
    script = KILLED_TOT.format(model=str(tiny_dirs["llama"]), store=str(store),
                               kill_at=kill_at, params=params)  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
        env={**os.environ, "CORPS_PRECOMPILED": "off"}, timeout=300,
    )  # fmt: skip
    assert run.returncode == 9, (kill_at, run.stderr[-2000:])

    async def main():
        async with open_tiny(tiny_dirs) as e, Runtime(e) as rt:
            want = await tree_of_thoughts(rt, **params)
        async with open_tiny(tiny_dirs, store=store) as e, Runtime(e) as rt:
            with e.recorded("tot"):
                got = await tree_of_thoughts(rt, **params)
            stats = e.stats()
        assert got.answer == want.answer, kill_at
        assert [m.text for m in got.messages] == [m.text for m in want.messages], kill_at
        assert stats.tokens_recomputed == 0, kill_at

    anyio.run(main)


def test_privacy_survives_the_restart(tiny_dirs, tmp_path):
    """Owners and visibility come back exactly: a private message is as private after a
    restart as before (read and attended to by its owner only), a shared one as shared."""
    from corps.cache.visibility import AccessDenied, Private, Shared

    store = tmp_path / "store"

    async def main():
        async with open_tiny(tiny_dirs, store=store, leak_policy="deny") as e:
            secret = await e.prefill("the code is 4417", owner="alice", visibility=Private())
            team = await e.prefill("meet at noon", owner="alice", visibility=Shared({"bob"}))
            ids = secret.id, team.id
        async with open_tiny(tiny_dirs, store=store, leak_policy="deny") as e:
            secret, team = (e.handle(i) for i in ids)
            assert e.read(secret, reader="alice") == "the code is 4417"
            with pytest.raises(AccessDenied):
                e.read(secret, reader="bob")
            with pytest.raises(AccessDenied):
                await e.decode(parents=[secret], owner="bob", **GREEDY)
            assert e.read(team, reader="bob") == "meet at noon"
            with pytest.raises(AccessDenied):
                e.read(team, reader="carol")
            await e.decode(parents=[secret], owner="alice", **GREEDY)  # its owner may

    anyio.run(main)


def test_leaving_a_replayed_call_frees_nothing_of_the_run_it_replays(tiny_dirs, tmp_path):
    """A replayed call's message was made by an earlier run: a stream left at its one
    delta, or a `decode_many` that fails beside it, leaves it as it was."""
    store = tmp_path / "store"

    async def main():
        async with open_tiny(tiny_dirs, store=store) as e:
            with e.recorded("r"):
                q = await e.prefill("hello there")
                a = await e.decode(parents=[q], **GREEDY)
        async with open_tiny(tiny_dirs, store=store) as e:
            with e.recorded("r"):
                q2 = await e.prefill("hello there")
                async with e.stream(parents=[q2], **GREEDY) as s:
                    async for _ in s:
                        break  # the consumer leaves at the first (and only) delta
            assert s.handle is None and not e.handle(a.id).freed
        async with open_tiny(tiny_dirs, store=store) as e:
            gone = await e.prefill("freed before it is read")
            e.free(gone)
            with e.recorded("r"):
                q3 = await e.prefill("hello there")
                with pytest.raises(UnknownHandle):  # the first replays, the second fails
                    await e.decode_many([dict(parents=[q3], **GREEDY), dict(parents=[gone])])
            assert e.read(e.handle(a.id), reader=None) == a.text
            e.check()

    anyio.run(main)


def test_store_rebuild_reencodes_for_another_dtype_but_never_another_model(tiny_dirs, tmp_path):
    """`store_rebuild=True`: the same model in another dtype drops the encodings and
    takes the store (messages encoded again as read); another model stays refused."""
    store = tmp_path / "store"

    async def main():
        async with open_tiny(tiny_dirs, store=store) as e:
            ids, _ = await conversation(e)
        with pytest.raises(StoreMismatch, match="store_rebuild=True"):
            open_tiny(tiny_dirs, store=store, dtype="bfloat16")
        with pytest.raises(StoreMismatch, match="tokens belong to that model"):
            open_tiny(tiny_dirs, "qwen2", store=store, store_rebuild=True)
        async with open_tiny(tiny_dirs, store=store, dtype="bfloat16", store_rebuild=True) as e:
            assert [m.id for m in e.messages()] == [*ids, ids[-1] + 1]
            await follow_up(e, ids)
            assert e.stats().tokens_recomputed > 0 and e.stats().tokens_copied_back == 0
        async with open_tiny(tiny_dirs, store=store, dtype="bfloat16") as e:  # it is theirs now
            await follow_up(e, ids)
        with pytest.raises(StoreMismatch, match="dtype"):
            open_tiny(tiny_dirs, store=store)

    anyio.run(main)
