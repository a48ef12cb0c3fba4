"""engine/exec/grammars.py: constraints compiled once per engine, masks, and applying them."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from corps.engine.errors import InvalidConstraint
from corps.engine.exec.grammars import Grammars, apply
from corps.engine.request.constraint import constraint_of


@pytest.fixture(scope="module")
def grammars(tiny_dirs):
    tok = AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))
    g = Grammars(tok, [tok.convert_tokens_to_ids("<|im_end|>")])
    yield g
    g.close()


def _allowed(mask_row: torch.Tensor, vocab: int) -> set[int]:
    return {t for t in range(vocab) if (int(mask_row[t // 32]) >> (t % 32)) & 1}


def test_a_constraint_compiles_once_per_engine(grammars):
    c = constraint_of(regex="ab")
    grammars.compile(c)
    first = grammars.compile_seconds[c]
    grammars.compile(c)
    assert grammars.compile_seconds[c] == first and grammars.tokenizer_seconds > 0
    one, two = grammars.matcher(c), grammars.matcher(c)
    assert one is not two  # each call has its own state
    assert one.consume_token(grammars.tokenizer.tokenize_str("a")[0])
    after_a, fresh = grammars.masks([one, two])
    assert not torch.equal(after_a, fresh)  # one moved on, the other did not


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(regex="([0-9]+"),
        dict(grammar="start: undefined_rule"),
        dict(json_schema={"type": "no-such-type"}),
    ],
)
def test_what_does_not_compile_is_refused_with_the_reason(grammars, kwargs):
    with pytest.raises(InvalidConstraint, match="does not compile"):
        grammars.compile(constraint_of(**kwargs))


def test_the_mask_of_choices_allows_exactly_the_tokens_that_begin_one(grammars):
    tok = grammars._hf
    c = constraint_of(choices=["abc", "bca"])
    (row,) = grammars.masks_async([grammars.matcher(c)]).result()
    vocab = len(tok)
    allowed = _allowed(row, vocab)
    texts = {t: tok.decode([t]) for t in range(vocab)}
    expect = {t for t, s in texts.items() if s and ("abc".startswith(s) or "bca".startswith(s))}
    assert allowed == expect


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_apply_sets_exactly_the_disallowed_logits_to_minus_inf(data):
    """Against a brute-force reading of the bitmask: each listed row keeps the
    tokens whose bit is set, others rows are untouched, tokens past the mask's
    width are disallowed."""
    n, v = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 100))
    width = data.draw(st.integers(max(1, (v - 1) // 32), (v + 31) // 32 + 1))
    rows = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    bits = data.draw(
        st.lists(st.integers(-(2**31), 2**31 - 1), min_size=len(rows) * width,
                 max_size=len(rows) * width)
    )  # fmt: skip
    mask = torch.tensor(bits, dtype=torch.int32).view(len(rows), width)
    logits = torch.randn(n, v)
    before = logits.clone()
    apply(logits, rows, mask)
    for i in range(n):
        if i not in rows:
            assert torch.equal(logits[i], before[i])
            continue
        keep = _allowed(mask[rows.index(i)], min(v, 32 * width))
        for t in range(v):
            assert logits[i, t] == (before[i, t] if t in keep else float("-inf"))


def _threads() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_masks_start_no_thread_of_their_own_however_many_calls(grammars):
    # A large bitmask is filled by torch in parallel; from the mask thread that opens a
    # second OpenMP team for as long as the thread lives, and with more OpenMP threads
    # than cores every parallel op of the forward sleeps at its barriers (a lone decode
    # of the default model 25 -> 50 ms). So the mask is allocated by the caller.
    g = Grammars(grammars._hf, grammars._stops)
    c = constraint_of(regex="[a-z]+")
    try:
        g.masks_async([g.matcher(c)]).result()  # the pool's thread and llguidance's start
        before = _threads()
        width = -(-g.tokenizer.vocab_size // 32)
        many = 2 * (1 << 15) // width + 1  # over torch's grain size of 32768 elements
        rows = g.masks_async([g.matcher(c) for _ in range(many)]).result()
        assert rows.shape == (many, width)
        assert torch.equal(rows, rows[:1].expand_as(rows))  # fresh matchers, same mask
        assert _threads() <= before
    finally:
        g.close()


def test_a_tokenizer_built_in_the_background_masks_as_one_built_on_first_use(tiny_dirs):
    """`warm` (what an engine does when it opens) builds the llguidance tokenizer on the
    worker thread from the tokenizer's JSON; it masks exactly as one built on first use."""
    tok = AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))
    stops = [tok.convert_tokens_to_ids("<|im_end|>")]
    warm, cold = Grammars(tok, stops), Grammars(tok, stops)
    warm.warm()
    c = constraint_of(json_schema={"type": "object", "properties": {"a": {"type": "integer"}}})
    try:
        masks = [g.masks([g.matcher(c)]) for g in (warm, cold)]
        assert torch.equal(*masks)
        assert warm.tokenizer_seconds > 0 and warm.tokenizer.vocab_size == cold.tokenizer.vocab_size
    finally:
        warm.close()
        cold.close()
