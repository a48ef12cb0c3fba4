"""Our forward (corps.engine.model.runner) against HF: tiny random models and the real one."""

from __future__ import annotations

import pytest
import torch

from corps.cache.kv import KVStore
from corps.engine.attention.views import open_view
from corps.engine.model.runner import ForwardBatch, ModelRunner, SeqSpan
from corps.engine.model.spec import ModelSpec
from corps.engine.model.weights import weights_from_hf

from conftest import DEVICE, open_tiny


def run_ours(hf, ids: list[int], chunks: list[int]) -> torch.Tensor:
    """Our logits for ids, encoded in the given chunk sizes through one view."""
    spec = ModelSpec.from_config(hf.config)
    w = weights_from_hf(hf, spec)
    store = KVStore(
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        capacity=len(ids),
        dtype=w.dtype,
    )
    runner = ModelRunner(w, store)
    empty = torch.empty(0, dtype=torch.long)
    view = open_view(store, w.rope, empty, empty, len(ids))
    out, start = [], 0
    for n in chunks:
        idx = torch.arange(start, start + n)
        batch = ForwardBatch(
            torch.tensor(ids[start : start + n]), idx, idx, (SeqSpan(0, n, view),), torch.arange(n)
        )
        out.append(runner.forward(batch))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("arch", ["llama", "llama3-scaled", "mistral", "qwen2", "qwen3"])
def test_tiny_logits_match_hf(tiny_hf, arch):
    hf = tiny_hf[arch]
    ids = torch.randint(5, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = hf(torch.tensor([ids])).logits[0]
    for chunks in ([40], [17, 1, 1, 21]):
        assert (run_ours(hf, ids, chunks) - ref).abs().max().item() <= 1e-4


def test_unsupported_architecture_from_config():
    from transformers import GPT2Config

    from corps.engine.errors import UnsupportedModel

    with pytest.raises(UnsupportedModel):
        ModelSpec.from_config(GPT2Config())


@pytest.mark.real_model
def test_real_model_logits_match_hf(real_engine, real_hf):
    fmt = real_engine.chat
    ids = fmt.encode(
        fmt.render("system", "You are a careful solver.")
        + fmt.render("user", "What is 7*6? Explain step by step.")
    )
    ref = real_hf(torch.tensor([ids])).logits[0]
    ours = run_ours(real_hf, ids, [len(ids) - 5, 1, 4])
    assert (ours - ref).abs().max().item() <= 1e-3


@pytest.mark.real_model
async def test_real_model_greedy_matches_hf_generate(real_dir, real_hf):
    """64 greedy tokens, both sides with their default end-of-turn handling."""
    from corps.engine.api.engine import Engine

    # float32 and dense weights: exact against transformers (16-bit kernels differ by
    # row count; the GGUF's own 4-bit blocks are within their rounding)
    async with Engine.load(
        str(real_dir), capacity=4096, dtype="float32", weights="dense"
    ) as engine:
        sys = await engine.prefill("You are a storyteller.", role="system")
        q = await engine.prefill(
            "Write a long story about a dragon and a lighthouse.", parents=[sys]
        )
        ans = await engine.decode(parents=[sys, q], max_tokens=64)
        header = engine.chat.encode(engine.chat.frame("assistant")[0])
        fmt_footer = engine.chat.encode(engine.chat.frame("assistant")[1])
    prompt = sys.tokens + q.tokens + header
    out = real_hf.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)
    assert ans.generated == out[0, len(prompt) :].tolist()
    assert len(ans.generated) == 64  # the answer really ran 64 tokens
    assert ans.tokens == header + ans.generated + fmt_footer  # cut, then closed


@pytest.mark.real_model
async def test_real_model_modes_agree_and_stop_at_end_of_turn(real_dir):
    from corps.engine.api.engine import Engine

    texts = []
    for mode in ("choreographed", "baseline"):
        # float32, dense: the two modes' attention differs in float32 rounding, which 16-bit
        # products (the default dtype's, and the int4 kernel's bfloat16 inputs) can turn
        # into a different token at a near-tie (AVX2, mixed; Zen 4, the GGUF: token 47)
        async with Engine.load(
            str(real_dir), mode=mode, capacity=4096, dtype="float32", weights="dense"
        ) as engine:
            sys = await engine.prefill("You are a careful solver.", role="system")
            q = await engine.prefill("What is 7*6?", parents=[sys])
            ans = await engine.decode(parents=[sys, q], max_tokens=96)
            texts.append((ans.tokens, ans.generated))
    assert texts[0] == texts[1]
    tokens, generated = texts[0]
    assert generated[-1] == 2 or len(generated) == 96  # stopped on <|im_end|> or ran to the limit
    assert tokens[-2:] == [2, 198]  # closed with the template's footer, "<|im_end|>\n", once


@pytest.mark.skipif(DEVICE != "cuda", reason="the fused 16-bit kernels: pytest --device cuda")
async def test_bf16_on_cuda_reads_the_same_through_the_fused_kernels(tiny_dirs, monkeypatch):
    """In 16 bits on CUDA, RMSNorm and RoPE are one Triton launch each: a prompt's
    logits through them are those of the torch ops they replace, within bfloat16."""
    from corps.engine.model import runner

    logits = []
    for fused in (True, False):
        monkeypatch.setattr(runner, "triton_available", lambda f=fused: f)
        async with open_tiny(tiny_dirs, "qwen3", dtype="bfloat16") as engine:  # q/k norms too
            q = await engine.prefill("the quick brown fox jumps over the lazy dog")
            h = await engine.decode(parents=[q], max_tokens=1, ignore_eos=True, logprobs=True)
            logits.append(torch.tensor(h.logprobs))
    torch.testing.assert_close(logits[0], logits[1], rtol=0.0, atol=0.05)
