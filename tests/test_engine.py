"""The public async Engine API (corps.engine.api.engine) and baseline mode end to end."""

from __future__ import annotations

import json
import re

import anyio
import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corps.cache.handle import Handle
from corps.engine.errors import ConstraintViolated, InvalidConstraint, InvalidRequest

from conftest import open_tiny
from helpers import reachable_tensor_bytes, run_calls


async def test_documented_api_shape(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        sys = await engine.prefill("You are a careful solver.", role="system")
        q = await engine.prefill("What is 7*6?", role="user", parents=[sys])
        ans = await engine.decode(
            parents=[sys, q], role="assistant", header="", max_tokens=8, temperature=0.0
        )
        assert isinstance(ans, Handle) and ans.parents == (sys, q)
        assert ans.role == "assistant" and ans.offset == sys.length + q.length
        assert ans.length == len(ans.tokens) and isinstance(ans.text, str)
        many = await engine.decode_many(
            [dict(parents=[sys, q], max_tokens=6, seed=i, temperature=1.0) for i in range(4)]
        )
        assert len(many) == 4 and len({h.id for h in many}) == 4
        assert (
            engine.tokenizer is engine.chat.tokenizer
            and (engine.model_path / "config.json").exists()
        )
        stats = engine.stats()
        assert stats.messages == 7 and stats.tokens_reused > 0
        assert stats.forward_s > 0  # time in the model's forward, for benchmarks' overhead


async def test_reset_prefix_cache_makes_the_same_call_as_cold_as_the_first(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", mode="baseline") as engine:
        sys = await engine.prefill("You are a careful solver. " * 4, role="system")
        ask = dict(parents=[sys], max_tokens=4, temperature=0.0)
        first = await engine.decode(**ask)
        again = await engine.decode(**ask)  # its prompt cached by the first
        assert again.tokens_encoded < first.tokens_encoded
        used = engine.stats().tokens_used
        freed = await engine.reset_prefix_cache()
        assert freed > 0 and engine.stats().tokens_used == used - freed
        cold = await engine.decode(**ask)
        assert cold.tokens_encoded == first.tokens_encoded and cold.tokens == first.tokens
        assert sys.text  # messages stay
        engine.check()
    async with open_tiny(tiny_dirs, "llama", mode="choreographed") as engine:
        sys = await engine.prefill("You are a careful solver.", role="system")
        await engine.decode(parents=[sys], max_tokens=4, temperature=0.0)
        assert await engine.reset_prefix_cache() == 0  # no prefix cache; its bound forgets
        await engine.decode(parents=[sys], max_tokens=4, temperature=0.0)
        engine.check()


async def test_free_owned_releases_every_live_message_of_those_agents(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        a1 = await engine.prefill("one of a's", owner="a")
        a2 = await engine.decode(parents=[a1], max_tokens=3, owner="a")
        b1 = await engine.prefill("b's own", owner="b")
        engine.free(a1)  # already freed: not counted again
        assert engine.free_owned(["a", "nobody"]) == 1
        assert a2.freed and not b1.freed
        assert engine.stats().tokens_used == b1.length
        assert engine.free_owned(["a"]) == 0


@pytest.mark.parametrize("contexts", ["copy", "store"])
async def test_peaks_start_over_for_a_phase(tiny_dirs, contexts):
    torch_only = dict(attention="torch") if contexts == "store" else {}  # as on a GPU
    async with open_tiny(tiny_dirs, "llama", contexts=contexts, **torch_only) as engine:
        q = await engine.prefill("what is seven times six, and why")
        await engine.decode_many([dict(parents=[q], max_tokens=3) for _ in range(2)])
        before = engine.stats()
        assert before.view_tokens_peak > 0 and before.view_tokens == 0
        assert (before.scratch_tokens_peak > 0) == (contexts == "store")
        engine.reset_peak_stats()  # nothing held now: the peaks start from zero
        after = engine.stats()
        assert (after.view_tokens_peak, after.scratch_tokens_peak) == (0, 0)
        assert after.contexts == contexts


async def test_seeded_sampling_is_reproducible(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        kw = dict(parents=[q], max_tokens=12, temperature=1.5, top_p=0.9, top_k=50, ignore_eos=True)
        a = await engine.decode(seed=7, **kw)
        b = await engine.decode(seed=7, **kw)
        others = await engine.decode_many([dict(seed=s, **kw) for s in (1, 7, 3)])
        assert a.tokens == b.tokens == others[1].tokens


async def test_a_sampled_call_draws_the_same_however_its_prompt_is_chunked(tiny_dirs):
    """A sampled call draws from its generator only when it samples, never on its
    prompt's earlier chunks: a seed gives the same tokens whatever the step budget."""
    got = []
    for step_tokens in (512, 40):
        async with open_tiny(tiny_dirs, "llama", step_tokens=step_tokens) as engine:
            q = await engine.prefill("hello world")
            h = await engine.decode(
                parents=[q], header=[5 + i % 50 for i in range(150)], temperature=1.5,
                top_p=0.95, seed=11, max_tokens=8, ignore_eos=True,
            )  # fmt: skip
            got.append(h.generated)
    assert got[0] == got[1]


async def test_a_step_mixing_greedy_sampled_and_forced_calls_gives_each_its_own(tiny_dirs):
    """Greedy calls take their argmax from one op over the step's rows, sampled ones
    their draws from one batched sampler; each call (forced ones too) must still get
    exactly what it gets alone."""
    async with open_tiny(tiny_dirs, "llama") as engine:
        qs = [await engine.prefill(t) for t in ("hello world", "the lazy dog", "one two")]
        kinds = [
            dict(max_tokens=10, ignore_eos=True),
            dict(max_tokens=10, ignore_eos=True, temperature=1.2, seed=5),
            dict(force=[7, 8, 9, 10]),
            dict(max_tokens=10, ignore_eos=True),
            dict(max_tokens=10, ignore_eos=True, temperature=0.8, top_p=0.9, seed=2),
            dict(max_tokens=10, ignore_eos=True, temperature=1.5, top_p=0.9, seed=3),
            dict(force=[5, 6, 7], temperature=0.7, top_p=0.95),
        ]
        reqs = [dict(parents=[qs[i % 3]], **kw) for i, kw in enumerate(kinds)]
        alone = [await engine.decode(**r) for r in reqs]
        together = await engine.decode_many(reqs)
        assert [h.generated for h in together] == [h.generated for h in alone]
        assert together[2].generated == [7, 8, 9, 10] and together[6].generated == [5, 6, 7]


async def test_stop_strings_and_raw_header(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("the quick brown fox")
        free = await engine.decode(parents=[q], max_tokens=20, ignore_eos=True)
        assert len(free.text) > 2
        stop = free.text[1:3]
        cut = await engine.decode(parents=[q], max_tokens=20, ignore_eos=True, stop=[stop])
        assert stop not in cut.text and free.text.startswith(cut.text)
        raw = await engine.decode(parents=[q], frame=False, header=[5, 6], max_tokens=3)
        assert raw.tokens[:2] == [5, 6]
        assert raw.tokens == [5, 6, *raw.generated]  # unframed: no footer


async def test_decoded_turns_are_closed_with_the_footer(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        footer = engine.chat.encode(engine.chat.frame("assistant")[1])
        assert footer  # the tiny template closes a turn with end-of-turn + newline
        q = await engine.prefill("the quick brown fox")
        free = await engine.decode(parents=[q], max_tokens=20, ignore_eos=True)
        cut = await engine.decode(
            parents=[q], max_tokens=20, ignore_eos=True, stop=[free.text[1:3]]
        )
        for h in (free, cut):  # cut by max_tokens, cut by a stop string: the whole footer
            assert h.tokens[-len(footer) :] == footer
            assert h.tokens[: -len(footer)][-len(h.generated) :] == h.generated
            assert h.length == len(h.tokens) and h.tokens_encoded == h.length
        assert len(cut.generated) < 20  # the stop string really cut it


@pytest.mark.parametrize("mode, closing_steps", [("choreographed", 1), ("baseline", 0)])
async def test_a_turn_is_closed_in_one_step_or_not_at_all(tiny_dirs, mode, closing_steps):
    # choreography encodes the last token and footer together (the message is kept);
    # the baseline never encodes them (its readers re-encode the turn's text)
    async with open_tiny(tiny_dirs, "llama", mode=mode) as engine:
        q = await engine.prefill("hello world")
        steps = engine.stats().steps
        a = await engine.decode(parents=[q], max_tokens=5, ignore_eos=True)
        # one step for the prompt (or header) and the first token, one per next token
        assert engine.stats().steps - steps == 1 + 4 + closing_steps
        fmt = engine.chat
        footer = fmt.encode(fmt.frame("assistant")[1])  # whole: max_tokens cut the turn
        assert footer and a.tokens == a.tokens[: len(a.tokens) - len(footer)] + footer


async def test_baseline_multi_turn_reencodes_only_the_new_turn(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", mode="baseline") as engine:
        sys = await engine.prefill("you are a careful solver", role="system")
        u1 = await engine.prefill("what is seven times six", parents=[sys])
        a1 = await engine.decode(parents=[sys, u1], max_tokens=6, ignore_eos=True)
        u2 = await engine.prefill("hello world", parents=[sys, u1, a1])
        before = engine.stats()
        a2 = await engine.decode(parents=[sys, u1, a1, u2], max_tokens=6, ignore_eos=True)
        after = engine.stats()
        # A turn's last token and footer are never encoded in the baseline (its text is
        # re-encoded where it is read), so a2 re-encodes a1's, then the new user turn and
        # its own header and tokens but its last one and footer: the tails cancel.
        fmt = engine.chat
        tail = 1 + len(fmt.encode(fmt.frame("assistant")[1]))
        assert after.tokens_encoded - before.tokens_encoded == u2.length + a2.length
        hit = after.prefix_hit_tokens - before.prefix_hit_tokens
        assert hit == sys.length + u1.length + a1.length - tail
        assert 0 < after.prefix_hit_rate < 1


async def test_baseline_evicts_under_pressure_and_keeps_working(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama", mode="baseline", capacity=120) as engine:
        for i in range(8):
            q = await engine.prefill(f"hello world number {i} " * 3)
            await engine.decode(parents=[q], max_tokens=8, ignore_eos=True)
        assert engine.stats().tokens_used <= 120


# ---- guarantees on every path (issue 14) ----


async def test_stats_free_and_leaks_are_safe_while_steps_run(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        done = anyio.Event()

        async def hammer() -> None:
            while not done.is_set():
                engine.stats(), engine.leaks()
                h = await engine.prefill("x", parents=[q])
                engine.free(h)

        async def work() -> None:
            await engine.decode_many(
                [dict(parents=[q], max_tokens=16, ignore_eos=True) for _ in range(8)]
            )
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(hammer)
            tg.start_soon(work)
        live = sum(m.slots for m in engine.messages())
        assert engine.stats().tokens_used == live


async def test_freed_records_are_forgotten_once_no_handle_names_them(tiny_dirs):
    import gc

    async with open_tiny(tiny_dirs, "llama") as engine:
        base = engine.stats().records
        sys = await engine.prefill("You are terse.", role="system")
        q = await engine.prefill("2+2?", parents=[sys])
        a = await engine.decode(parents=[sys, q], max_tokens=3)
        for h in (sys, q):
            engine.free(h)
        assert sys.text == "You are terse." and sys.freed  # readable through its handle
        del sys, q, h
        gc.collect()
        assert engine.stats().records == base + 3  # a's encoding attended to both
        text = a.parents[0].text  # provenance stays readable
        engine.free(a)
        del a
        gc.collect()
        assert engine.stats().records == base and text == "You are terse."


async def test_auto_free_releases_encodings_whose_handles_are_gone(tiny_dirs):
    import gc

    async with open_tiny(tiny_dirs, "llama", auto_free=True) as engine:
        used, base = engine.stats().tokens_used, engine.stats().records
        q = await engine.prefill("hello there")
        kept = await engine.decode(parents=[q], max_tokens=3)
        assert engine.stats().tokens_used > used
        del q  # kept's encoding attended to q: q is freed, its record stays
        gc.collect()
        stats = engine.stats()
        assert stats.messages == 1 and stats.records == base + 2  # q (freed) and kept
        ids = kept.parents[0].id
        del kept
        gc.collect()
        stats = engine.stats()
        assert stats.tokens_used == used and stats.messages == 0 and stats.records == base
        assert ids not in [m.id for m in engine.messages()]


def test_mixed_precision_engine_agrees_with_float32_within_16_bit_rounding(tiny_dirs):
    """dtype="mixed": float32 except the projections' weights (float16 for one row,
    bfloat16 for more). Prefill (many rows: bfloat16) and a lone decode step (one
    row: float16) stay within their rounding of the float32 engine; the weights take
    fewer bytes."""
    from corps.engine.model.linear import fast_bfloat16
    from corps.engine.request.requests import PrefillRequest

    logits, one_row, sizes = {}, {}, {}
    for dtype in ("float32", "mixed"):
        engine = open_tiny(tiny_dirs, "qwen2", dtype=dtype)  # qwen2: biased projections
        core = engine.executor
        assert core.precision == dtype and core.memory.store.k.dtype == torch.float32
        req = PrefillRequest("the quick brown fox jumps over the lazy dog", role="user")
        _, (lg,) = run_calls(core, [req], want_logits=True)
        logits[dtype] = lg
        one = PrefillRequest([42], frame=False)  # a one-row step: the float16 kernel
        _, (one_row[dtype],) = run_calls(core, [one], want_logits=True)
        sizes[dtype] = core.stats().weight_bytes
    ref = logits["float32"]
    assert (logits["mixed"] - ref).abs().max() <= 0.05 * ref.abs().max()
    assert not torch.equal(logits["mixed"], ref)
    ref = one_row["float32"]
    assert (one_row["mixed"] - ref).abs().max() <= 0.005 * ref.abs().max()
    assert not torch.equal(one_row["mixed"], ref)
    # mixed: a float16 copy of each projection's W (one-row products) beside W in
    # bfloat16 where the CPU has fast bfloat16 gemms, else in float32 (6 bytes a weight:
    # an AVX2 CPU), and a float16 embedding; float32: 4 or 8 bytes a weight (one layout
    # or two, by the kernels measured on this CPU). Smaller only with fast bfloat16.
    if fast_bfloat16(torch.device("cpu")):
        assert sizes["mixed"] < sizes["float32"]
    else:
        assert sizes["mixed"] < 2 * sizes["float32"]


# ---- constrained decoding ----


_LEAVES = st.sampled_from(["a", "b", "0", "1", " ", "x,", "[a-c]", "[0-9]"])
_PROPERTY = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _regex_trees(leaves=_LEAVES):
    """Small regexes as trees, so each one's longest match is known."""
    return st.recursive(
        leaves.map(lambda s: ("lit", s)),
        lambda inner: st.one_of(
            st.tuples(st.just("cat"), inner, inner),
            st.tuples(st.just("alt"), inner, inner),
            st.tuples(st.just("opt"), inner),
            st.tuples(st.just("rep"), inner, st.integers(1, 3)),
        ),
        max_leaves=5,
    )


def _regex(t) -> str:
    kind = t[0]
    if kind == "lit":
        return t[1]
    if kind == "cat":
        return _regex(t[1]) + _regex(t[2])
    if kind == "alt":
        return f"({_regex(t[1])}|{_regex(t[2])})"
    if kind == "opt":
        return f"({_regex(t[1])})?"
    return f"({_regex(t[1])}){{1,{t[2]}}}"


def _longest(t) -> int:
    kind = t[0]
    if kind == "lit":
        return 1 if t[1].startswith("[") else len(t[1])
    if kind == "cat":
        return _longest(t[1]) + _longest(t[2])
    if kind == "alt":
        return max(_longest(t[1]), _longest(t[2]))
    if kind == "opt":
        return _longest(t[1])
    return _longest(t[1]) * t[2]


def _schemas():
    """Random JSON schemas: nested objects, enums, arrays, bounded integers and numbers."""
    leaf = st.one_of(
        st.just({"type": "boolean"}),
        st.integers(-50, 50).map(lambda lo: {"type": "integer", "minimum": lo, "maximum": lo + 99}),
        st.just({"type": "number", "minimum": 0, "maximum": 10}),
        st.lists(st.sampled_from(["yes", "no", "maybe", "a b"]), min_size=1, max_size=3,
                 unique=True).map(lambda e: {"enum": e}),
        st.integers(0, 4).map(lambda n: {"type": "string", "maxLength": n}),
        st.just({"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}),
    )  # fmt: skip

    def obj(inner):
        props = st.dictionaries(st.sampled_from(["k", "answer", "n", "why"]), inner, min_size=1,
                                max_size=3)  # fmt: skip
        return props.map(
            lambda p: {"type": "object", "properties": p, "required": list(p),
                       "additionalProperties": False}
        )  # fmt: skip

    return st.recursive(leaf, obj, max_leaves=4).map(
        lambda s: s if s.get("type") == "object" else {"type": "object",
                                                        "properties": {"v": s}, "required": ["v"],
                                                        "additionalProperties": False}
    )  # fmt: skip


def _run(tiny_dirs, mode: str, requests: list[dict]) -> list[tuple[str, str | None, bool]]:
    """(text, finish_reason, complete) of each decode after one prefill, fused in one batch."""

    async def body():
        async with open_tiny(tiny_dirs, "llama", mode=mode) as engine:
            q = await engine.prefill("say something short")
            hs = await engine.decode_many([dict(parents=[q], **r) for r in requests])
            engine.check()
            return [(h.text, h.finish_reason, h.complete) for h in hs]

    return anyio.run(body)


@pytest.mark.parametrize("mode", ["choreographed", "baseline"])
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_constrained_text_matches_its_regex_greedy_or_sampled_beside_free_calls(
    tiny_dirs, mode, data
):
    trees = data.draw(st.lists(_regex_trees(), min_size=2, max_size=4))
    seed = data.draw(st.integers(0, 10_000))
    requests = [
        dict(regex=_regex(t), max_tokens=_longest(t) + 2, temperature=1.0 if i % 2 else 0.0,
             top_k=5 * (i % 3), seed=seed + i)
        for i, t in enumerate(trees)
    ] + [dict(max_tokens=5, temperature=1.0, seed=seed)]  # fmt: skip
    out = _run(tiny_dirs, mode, requests)
    for t, (text, reason, complete) in zip(trees, out, strict=False):
        # each token is at least a character: the longest match fits in max_tokens
        assert complete and re.fullmatch(_regex(t), text), (_regex(t), text, reason)
        assert reason in ("constraint", "end_of_turn")
    assert out[-1][2]  # the free call beside them is untouched


@pytest.mark.parametrize("mode", ["choreographed", "baseline"])
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_constrained_json_matches_its_schema(tiny_dirs, mode, data):
    schemas = data.draw(st.lists(_schemas(), min_size=1, max_size=3))
    seed = data.draw(st.integers(0, 10_000))
    requests = [
        dict(json_schema=s, max_tokens=160, temperature=float(i % 2), seed=seed + i)
        for i, s in enumerate(schemas)
    ]
    for s, (text, reason, complete) in zip(schemas, _run(tiny_dirs, mode, requests), strict=True):
        if complete:
            jsonschema.validate(json.loads(text), s)
        else:  # a number's digits can run on: stopped by max_tokens, a valid prefix
            assert reason == "max_tokens", (s, text)


def test_constraints_hold_in_hf_mode_too(tiny_dirs):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    requests = [
        dict(regex="(ab|ba){1,2}", max_tokens=6),
        dict(choices=["left", "right"], max_tokens=6, temperature=1.0, seed=3),
        dict(json_schema=schema, max_tokens=20),
    ]
    out = _run(tiny_dirs, "hf", requests)
    assert re.fullmatch("(ab|ba){1,2}", out[0][0]) and out[1][0] in ("left", "right")
    assert json.loads(out[2][0])["ok"] in (True, False) and all(c for _, _, c in out)


async def test_a_bad_constraint_fails_at_the_call_and_leaves_the_store_as_it_was(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello")
        before = engine.stats()
        for bad in (dict(regex="(unclosed"), dict(json_schema={"type": 7}), dict(choices=[])):
            with pytest.raises(InvalidConstraint):
                await engine.decode(parents=[q], max_tokens=4, **bad)
            with pytest.raises(InvalidConstraint):
                engine.decode_nowait(parents=[q], max_tokens=4, **bad)
        after = engine.stats()
        assert (after.tokens_used, after.messages, after.tokens_encoded) == (
            before.tokens_used, before.messages, before.tokens_encoded
        )  # fmt: skip
        engine.check()


async def test_a_constrained_call_cut_by_max_tokens_keeps_its_valid_prefix(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello")
        h = await engine.decode(parents=[q], regex="abcabcabc", max_tokens=2)
        assert h.finish_reason == "max_tokens" and not h.complete
        assert "abcabcabc".startswith(h.text) and h.text
        done = await engine.decode(parents=[q], regex="ab", max_tokens=8)
        assert done.complete and done.text == "ab" and done.finish_reason == "constraint"


async def test_a_forced_token_that_breaks_the_constraint_fails_that_call_only(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello")
        bad = engine.tokenizer.encode("zz", add_special_tokens=False)
        with pytest.raises(ConstraintViolated, match="does not match"):
            await engine.decode(parents=[q], regex="ab", force=bad)
        ok = await engine.decode(parents=[q], max_tokens=3)
        assert ok.length > 0
        engine.check()


async def test_twins_with_different_constraints_are_not_merged(tiny_dirs):
    """Twin decodes share logit rows, which a constraint masks in place; calls with
    different constraints must not share them (each matches its own)."""
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello")
        a, b, same, _free = await engine.decode_many(
            [
                dict(parents=[q], header="x", regex="ab", max_tokens=4),
                dict(parents=[q], header="x", regex="ba", max_tokens=4),
                dict(parents=[q], header="x", regex="ab", max_tokens=4),
                dict(parents=[q], header="x", max_tokens=4),
            ]
        )
        assert (a.text, b.text, same.text) == ("xab", "xba", "xab")
        assert engine.stats().tokens_reused > 0


@pytest.mark.parametrize("mode", ["choreographed", "baseline"])
async def test_jump_forward_gives_the_same_text_in_fewer_steps(tiny_dirs, mode):
    """Keys and punctuation a schema forces are appended without sampling and encoded
    together: the same text as sampling each, in fewer forward steps."""
    schema = {
        "type": "object",
        "properties": {"verdict": {"const": "stop"}, "sure": {"enum": ["yes", "no"]}},
        "required": ["verdict", "sure"],
        "additionalProperties": False,
    }
    seen = {}
    for jump in (False, True):
        async with open_tiny(tiny_dirs, "llama", mode=mode, jump_forward=jump) as engine:
            q = await engine.prefill("decide")
            steps = engine.stats().steps
            stream = engine.stream(parents=[q], json_schema=schema, max_tokens=40)
            streamed = "".join([delta async for delta in stream])
            h = stream.handle
            seen[jump] = (h.text, engine.stats().steps - steps, engine.stats().tokens_jumped)
            assert streamed == h.text and h.complete
            jsonschema.validate(json.loads(h.text), schema)
            engine.check()
    (text, steps, jumped), (text_j, steps_j, jumped_j) = seen[False], seen[True]
    assert text == text_j and jumped == 0 and jumped_j > 0
    assert steps_j < steps


# ---- select ----


@pytest.mark.parametrize("mode", ["choreographed", "baseline", "hf"])
async def test_select_scores_equal_each_option_scored_alone(tiny_dirs, mode):
    """All options in one fused step score as each would alone (<= 1e-4, float32);
    the best normalised score wins; its encoding is kept, the others are freed."""
    options = ["yes", "no", "maybe later", "x"]
    async with open_tiny(tiny_dirs, "llama", mode=mode) as engine:
        sys = await engine.prefill("be brief", role="system")
        q = await engine.prefill("is it so?", parents=[sys])
        messages = engine.stats().messages
        s = await engine.select(parents=[sys, q], options=options, header="Answer: ")
        assert engine.stats().messages == messages + 1  # the chosen one only
        alone = [
            (await engine.select(parents=[sys, q], options=[o], header="Answer: ")).totals[0]
            for o in options
        ]
        assert s.totals == pytest.approx(alone, abs=1e-4)
        assert (
            s.index == max(range(4), key=lambda i: s.normalized[i]) and s.option == options[s.index]
        )
        assert s.handle.text == "Answer: " + s.option and s.handle.parents == (sys, q)
        lengths = [len(engine.tokenizer.encode(o, add_special_tokens=False)) for o in options]
        assert s.normalized == pytest.approx(
            [t / n for t, n in zip(s.totals, lengths, strict=True)]
        )
        by_total = await engine.select(
            parents=[sys, q], options=options, header="Answer: ", by="total"
        )
        assert by_total.index == max(range(4), key=lambda i: s.totals[i])
        if mode != "hf":
            engine.check()


async def test_select_refuses_bad_options_before_anything_runs(tiny_dirs):
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("pick")
        before = engine.stats().messages
        for bad, says in (([], "distinct"), (["a", "a"], "distinct"), (["a", ""], "non-empty"),
                          ("ab", "distinct")):  # fmt: skip
            with pytest.raises(InvalidRequest, match=says):
                await engine.select(parents=[q], options=bad)
        with pytest.raises(InvalidRequest, match="by must be"):
            await engine.select(parents=[q], options=["a", "b"], by="mean")
        assert engine.stats().messages == before


async def test_a_replayed_constrained_decode_jumps_only_where_its_tokens_agree(tiny_dirs):
    """Forcing a constrained run's tokens replays it exactly, jumps included."""
    schema = {"type": "object", "properties": {"sure": {"enum": ["yes", "no"]}},
              "required": ["sure"], "additionalProperties": False}  # fmt: skip
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("decide")
        first = await engine.decode(parents=[q], json_schema=schema, max_tokens=20)
        again = await engine.decode(parents=[q], json_schema=schema, force=first.generated)
        assert again.generated == first.generated and again.text == first.text
        other = engine.tokenizer.encode('{"sure": "no"}', add_special_tokens=False)
        if first.text != '{"sure": "no"}':
            forced = await engine.decode(parents=[q], json_schema=schema, force=other)
            assert forced.generated == other


@pytest.mark.parametrize("mode", ["choreographed", "baseline", "hf"])
async def test_logprobs_are_the_models_own_log_probabilities_of_each_token(
    tiny_dirs, tiny_hf, mode
):
    """`logprobs=True`: each emitted token's log-probability under the model at its
    position (temperature 1, before top-p and any constraint) and the argmax there,
    as transformers computes them on the rendered prompt."""
    async with open_tiny(tiny_dirs, "llama", mode=mode) as engine:
        q = await engine.prefill("hello world")
        sampled = await engine.decode(
            parents=[q], max_tokens=6, ignore_eos=True, temperature=0.9, top_p=0.5, seed=3,
            logprobs=True,
        )  # fmt: skip
        forced = await engine.decode(parents=[q], force=[7, 8, 9], logprobs=True)
        plain = await engine.decode(parents=[q], max_tokens=3, ignore_eos=True)
        prompt = engine.chat.sink + q.tokens
    assert plain.logprobs == () and plain.greedy == ()
    hf = tiny_hf["llama"]
    for h in (sampled, forced):
        ids = prompt + h.tokens[: h.generated_from + len(h.generated)]
        with torch.no_grad():
            logits = hf(torch.tensor([ids], device=hf.device)).logits[0].double()  # (T, V)
        rows = torch.log_softmax(logits, -1)[len(ids) - len(h.generated) - 1 : -1]
        want = [float(r[t]) for r, t in zip(rows, h.generated, strict=True)]
        assert len(h.logprobs) == len(h.generated)
        assert h.logprobs == pytest.approx(want, abs=1e-4)
        assert list(h.greedy) == rows.argmax(-1).tolist()


async def test_a_constrained_decode_with_logprobs_takes_one_step_per_token(tiny_dirs):
    """Jump-forward would skip the logit rows of the tokens it appends: a call that
    asks for logprobs never jumps, so every token has its log-probability."""
    async with open_tiny(tiny_dirs, "llama") as engine:
        q = await engine.prefill("hello world")
        h = await engine.decode(parents=[q], choices=["alpha beta gamma"], logprobs=True)
    assert len(h.logprobs) == len(h.generated) == len(h.greedy) > 1
    assert all(lp <= 0 for lp in h.logprobs)


@pytest.mark.parametrize("mode", ["choreographed", "baseline", "hf", "static"])
async def test_closing_an_engine_gives_back_every_tensor_it_allocated(tiny_dirs, mode):
    """Once its block ends, the engine object (still held) holds no weights, KV memory,
    RoPE tables or static decode buffers: on a GPU their memory goes back at once
    (2.18 GB stayed allocated after an engine on a 1B model closed)."""
    kw = dict(graphs="static") if mode == "static" else dict(mode=mode, graphs="off")
    engine = open_tiny(tiny_dirs, "llama", **kw)
    async with engine:
        q = await engine.prefill("hello world")
        await engine.decode_many([dict(parents=[q], max_tokens=4) for _ in range(3)])
        assert (engine.stats().static_steps > 0) == (mode == "static")
        held = reachable_tensor_bytes(engine)
        weights = engine.stats().weight_bytes
    assert held >= weights > 0
    assert reachable_tensor_bytes(engine) < 0.01 * held
    assert engine.stats().weight_bytes == weights  # its figures stay readable
    assert (engine.stats().static_steps > 0) == (mode == "static")


@pytest.mark.parametrize("mode", ["choreographed", "baseline", "hf"])
async def test_top_logprobs_list_the_most_likely_tokens_at_each_position(tiny_dirs, mode):
    async with open_tiny(tiny_dirs, "llama", mode=mode) as engine:
        q = await engine.prefill("hello world")
        h = await engine.decode(parents=[q], max_tokens=6, temperature=0.8, seed=3,
                                logprobs=True, top_logprobs=4)  # fmt: skip
        assert len(h.top_logprobs) == len(h.generated) == len(h.logprobs)
        for top, tok, lp, greedy in zip(h.top_logprobs, h.generated, h.logprobs, h.greedy,
                                        strict=True):  # fmt: skip
            assert len(top) == 4 and top[0][0] == greedy
            values = [v for _, v in top]
            assert values == sorted(values, reverse=True)
            assert lp <= values[0] + 1e-6
            if tok in dict(top):
                assert dict(top)[tok] == pytest.approx(lp, abs=1e-5)
        with pytest.raises(InvalidRequest, match="top_logprobs needs logprobs"):
            await engine.decode(parents=[q], max_tokens=2, top_logprobs=2)


async def test_the_old_audit_names_warn_and_answer_as_the_new(tiny_dirs):
    """`Engine.audit()` (the access log) and `Engine.audited()` (the fidelity report)
    were renamed, "audit" meaning two things: the old names still answer, with a
    DeprecationWarning naming the new one."""
    async with open_tiny(tiny_dirs, "llama") as engine:
        with pytest.warns(DeprecationWarning, match="access_events"):
            assert engine.audit() == engine.access_events()
        with pytest.warns(DeprecationWarning, match="fidelity_report"):
            old = await engine.audited()
        assert old == await engine.fidelity_report()
