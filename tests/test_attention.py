"""engine/attention.py: backend selection (by name or device) and the decode plan."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corps.cache import InvalidRequest
from corps.engine.attention import (
    FlexAttention,
    SdpaAttention,
    TritonAttention,
    TritonFlexAttention,
    select_backend,
)

from conftest import open_tiny
from helpers import shared_views


def test_cpu_defaults_to_the_torch_reference():
    assert type(select_backend("cpu")) is SdpaAttention


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("torch", SdpaAttention),
        ("triton", TritonAttention),
        ("flex", FlexAttention),
        (" Triton+Flex ", TritonFlexAttention),
    ],
)
def test_a_named_backend_is_used(monkeypatch, name, cls):
    """By name, and by `CORPS_ATTENTION` through the engine's config."""
    from corps.engine.config import EngineConfig

    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton on a CPU (set by conftest there)
    assert type(select_backend("cpu", name)) is cls
    monkeypatch.setenv("CORPS_ATTENTION", name)
    assert type(select_backend("cpu", EngineConfig.of().attention)) is cls


def test_unknown_backend_is_refused_before_loading(tiny_dirs, monkeypatch):
    monkeypatch.setenv("CORPS_ATTENTION", "cudnn")
    with pytest.raises(InvalidRequest, match="CORPS_ATTENTION must be one of torch, triton"):
        open_tiny(tiny_dirs)


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # unset on a GPU machine
    with pytest.raises(InvalidRequest, match="TRITON_INTERPRET=1"):
        select_backend("cpu", "triton")


def test_triton_missing_says_what_to_install(monkeypatch):
    from corps.engine.attention import backend

    monkeypatch.setattr(backend, "triton_available", lambda: False)
    with pytest.raises(InvalidRequest, match=r"pip install 'corps\[cuda\]'"):
        select_backend("cpu", "triton")
    assert type(select_backend("cuda")) is SdpaAttention  # no Triton: the reference


async def test_the_engine_decodes_the_same_tokens_on_every_backend(tiny_dirs, monkeypatch):
    """The whole engine (scheduler, batching, arena views) on each backend: the same
    greedy tokens for concurrent decodes over shared, repositioned parents."""
    pytest.importorskip("triton")
    got = {}
    for name in ("torch", "triton", "flex", "triton+flex"):
        monkeypatch.setenv("CORPS_ATTENTION", name)
        async with open_tiny(tiny_dirs, "qwen3") as engine:
            assert engine.executor.runner.attention.name == name
            sys = await engine.prefill("you are a careful solver", role="system")
            q = await engine.prefill("what is seven times six", parents=[sys], new_offset=40)
            outs = await engine.decode_many(
                [
                    dict(parents=[sys, q], max_tokens=6, temperature=0.0, ignore_eos=True),
                    dict(parents=[q, sys], offsets=[0, 30], max_tokens=5, temperature=0.0),
                ]
            )
            got[name] = [h.tokens for h in outs]
    assert got["triton"] == got["flex"] == got["triton+flex"] == got["torch"]


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("t", [1, 2, 9])
def test_causal_mask_is_the_bottom_right_causal_bias(contiguous, t):
    """The per-step span mask is what SDPA's causal_lower_right bias says: row i of t
    new rows sees the view so far and its own rows up to i (over the own part only
    when the context is a separate, fully visible range)."""
    from types import SimpleNamespace

    import torch
    from torch.nn.attention.bias import causal_lower_right

    from corps.engine.attention import causal_mask

    view = SimpleNamespace(length=7, own_length=3, contiguous=contiguous, own_k=torch.empty(0))
    got = causal_mask(t, view)
    if t == 1:
        assert got is None
        return
    n = (7 if contiguous else 3) + t
    visible = causal_lower_right(t, n)._materialize()
    assert torch.equal(got == 0, visible) and torch.equal(got.isneginf(), ~visible)


@settings(max_examples=30, deadline=None)
@given(
    rows=st.lists(st.integers(1, 6), min_size=5, max_size=5),
    filled=st.lists(st.integers(0, 3), min_size=5, max_size=5),
    grouped=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_spans_of_several_rows_batch_like_each_call_alone(rows, filled, grouped, seed):
    """The torch backend's batched plan over calls adding 1-6 rows each (decodes and
    short prefill spans, shared contexts read once or gathered whole) gives every row
    what the per-call path gives it, and writes the same arena entries."""
    import torch

    from corps.engine.attention import DecodePlan, SdpaAttention

    arena, _, views, _ = shared_views(extra=12, head_dim=16)
    g = torch.Generator().manual_seed(seed)
    for view, f in zip(views, filled, strict=True):  # some own tokens already there
        if f:
            view.append(0, torch.randn(f, 2, 16, generator=g), torch.randn(f, 2, 16, generator=g))
            view.advance(f)
    total = sum(rows)
    q, k, v = (torch.randn(total, h, 16, generator=g) for h in (6, 2, 2))
    plan = DecodePlan.of(views, min_saved=1 if grouped else None, rows=rows)
    assert bool(plan.groups) == grouped and plan.t == max(rows)
    att = SdpaAttention()
    got = att.attend_decode(0, q, k, v, plan, 0.25)  # (T, Hq, D)
    batched_k = arena.k.clone()
    start = 0
    for view, r in zip(views, rows, strict=True):
        sl = slice(start, start + r)
        view.append(0, k[sl], v[sl])
        want = att.attend(0, q[sl], view, 0.25)
        assert torch.allclose(got[sl], want, atol=1e-5), (rows, view.ctx_len)
        start += r
    assert torch.equal(arena.k, batched_k)  # the plan wrote each row where the call does
