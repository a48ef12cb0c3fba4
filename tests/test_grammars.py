"""engine/grammars.py: constraints compiled once per engine, masks, and applying them."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from corps.engine.constraint import constraint_of
from corps.engine.errors import InvalidConstraint
from corps.engine.grammars import Grammars, apply


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
    grammars.check(c)
    first = grammars.compile_seconds[c]
    grammars.check(c)
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
        grammars.check(constraint_of(**kwargs))


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
