"""A GGUF's blocks run as they are: tiny GGUF files written with llama.cpp's own
`gguf` package from tiny models, read back against brute-force references (the
file's de-quantized values, a dense forward over them); choreography equal to the
baseline in every weight format; hostile files refused with a typed error."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import gguf
import numpy as np
import pytest
import torch

from corps.cache.kv import KVStore
from corps.engine.api.engine import Engine
from corps.engine.attention.views import open_view
from corps.engine.errors import BadWeights
from corps.engine.model.gguf_weights import GgufWeights
from corps.engine.model.names import GGUF_NAME
from corps.engine.model.quantized import Int4Linear
from corps.engine.model.runner import ForwardBatch, ModelRunner, SeqSpan
from corps.engine.model.weights import load_weights, read_spec

from helpers import hf_model, make_tokenizer, tiny_config

Q = gguf.GGMLQuantizationType
HF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's layout of a Llama q or k weight (its converter's permutation)."""
    n, k = w.shape
    return w.reshape(heads, 2, n // heads // 2, k).swapaxes(1, 2).reshape(n, k)


def write_gguf(model_dir: Path, out: Path, qtype=Q.Q4_1, embed=Q.Q8_0, **types) -> None:
    """The HF model at `model_dir` as a GGUF file: projections in `qtype` (or a type
    per GGUF name in `types`), the embedding in `embed`, norms in F32."""
    hf = hf_model(model_dir)
    cfg = hf.config
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_block_count(cfg.num_hidden_layers)

    def add(name: str, t: torch.Tensor, kind) -> None:
        data = t.detach().float().numpy()
        if kind != Q.F32:
            data = gguf.quants.quantize(data, kind)
        writer.add_tensor(name, data, raw_dtype=kind)

    add("token_embd.weight", hf.model.embed_tokens.weight, embed)
    for i, layer in enumerate(hf.model.layers):
        for ours, theirs in HF_NAMES.items():
            w = layer.get_submodule(theirs).weight.detach().float().numpy()
            if ours in ("attn_q", "attn_k"):
                heads = cfg.num_attention_heads if ours == "attn_q" else cfg.num_key_value_heads
                w = permute(w, heads)
            add(f"blk.{i}.{ours}.weight", torch.from_numpy(w), types.get(ours, qtype))
        add(f"blk.{i}.attn_norm.weight", layer.input_layernorm.weight, Q.F32)
        add(f"blk.{i}.ffn_norm.weight", layer.post_attention_layernorm.weight, Q.F32)
    add("output_norm.weight", hf.model.norm.weight, Q.F32)
    if not cfg.tie_word_embeddings:
        add("output.weight", hf.lm_head.weight, embed)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def dequantized_dir(model_dir: Path, out: Path) -> Path:
    """The model with every projection and the embedding replaced by the GGUF's own
    de-quantized values: the dense reference of a GGUF forward."""
    hf = hf_model(model_dir)
    src = GgufWeights(model_dir / GGUF_NAME, read_spec(model_dir))
    with torch.no_grad():
        for i, layer in enumerate(hf.model.layers):
            for ours, theirs in HF_NAMES.items():
                layer.get_submodule(theirs).weight.copy_(src.dense(f"blk.{i}.{ours}.weight"))
        hf.model.embed_tokens.weight.copy_(src.dense("token_embd.weight"))
    hf.save_pretrained(str(out))
    for f in model_dir.glob("tokenizer*"):
        shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="module")
def gguf_dirs(tmp_path_factory) -> dict[str, Path]:
    """A tied tiny Llama (as the default model is) with its GGUF beside it, Q4_1
    projections and a Q8_0 embedding; others with Q4_0 and Q5_1; their dense references."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("gguf")
    dirs = {}
    for name, qtype in (("q4_1", Q.Q4_1), ("q4_0", Q.Q4_0), ("q5_1", Q.Q5_1)):
        path = root / name
        path.mkdir()
        tok = make_tokenizer(path)
        torch.manual_seed(1)
        config = tiny_config("llama", len(tok))
        config.tie_word_embeddings = True
        model = AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0, 0.2)
        model.save_pretrained(str(path))
        write_gguf(path, path / GGUF_NAME, qtype)
        dirs[name] = path
        dirs[f"{name}-dense"] = dequantized_dir(path, root / f"{name}-dense")
    return dirs


def gguf_copy(src: Path, dst: Path, **write) -> Path:
    """The model directory at `src` with a GGUF written by `write_gguf(**write)`."""
    shutil.copytree(src, dst)
    (dst / GGUF_NAME).unlink()
    write_gguf(src, dst / GGUF_NAME, **write)
    return dst


@pytest.mark.parametrize("name", ["q4_1", "q4_0", "q5_1"])
def test_the_files_blocks_are_kept_as_they_are(gguf_dirs, name):
    """Every projection is 4-bit codes whose de-quantized values are the file's own
    (up to the kernel's bfloat16 scales: 2^-8 of a group's scale and zero)."""
    path = gguf_dirs[name]
    w = load_weights(path, dtype=torch.float32, device="cpu", weights="auto")
    src = GgufWeights(path / GGUF_NAME, read_spec(path))
    assert w.quantized and all(isinstance(p, Int4Linear) for p in w.projections)
    assert w.embed is w.lm_head and w.lm_head.split  # the tied Q8_0 table, once
    for i, lw in enumerate(w.layers):
        want = torch.cat([src.dense(f"blk.{i}.{m}.weight") for m in ("attn_q", "attn_k", "attn_v")])
        got = lw.qkv.dense()
        assert torch.allclose(got, want, rtol=0, atol=2**-7 * want.abs().max().item())
    table = src.dense("token_embd.weight")
    assert torch.allclose(w.embedding(torch.arange(len(table))), table, rtol=2**-8, atol=1e-6)


@pytest.mark.parametrize("name", ["q4_1", "q4_0", "q5_1"])
def test_logits_stay_within_the_stated_tolerance_of_a_dense_forward(gguf_dirs, name):
    """The GGUF's blocks against transformers over the same de-quantized weights: the
    int4 kernel rounds inputs, outputs and each group's scale and zero to bfloat16, so
    logits are within 3% of the logits' largest magnitude (1.5% measured on this
    model, 1.0% with float32 products over the same bfloat16 scales), and a greedy
    token differs only where the reference's top two are within that of each other."""
    dense = hf_model(gguf_dirs[f"{name}-dense"])
    ids = [1, 5, 9, 12, 3, 7, 2, 11, 4, 30, 17]
    want = dense(torch.tensor([ids])).logits[0]  # (T, V)
    w = load_weights(gguf_dirs[name], dtype=torch.float32, device="cpu", weights="auto")
    assert w.quantized
    got = logits_of(w, ids)
    tol = 0.03 * want.abs().max()
    assert (got - want).abs().max() <= tol
    chosen = want.gather(1, got.argmax(-1, keepdim=True))[:, 0]  # (T,)
    assert (chosen >= want.amax(-1) - 2 * tol).all()


def logits_of(w, ids: list[int]) -> torch.Tensor:
    """Our forward's logits (T, V) over `ids` in one prefill step."""
    store = KVStore(
        num_layers=w.spec.num_layers,
        num_kv_heads=w.spec.num_kv_heads,
        head_dim=w.spec.head_dim,
        capacity=len(ids),
        dtype=w.dtype,
    )
    empty = torch.empty(0, dtype=torch.long)
    view = open_view(store, w.rope, empty, empty, len(ids))
    n = torch.arange(len(ids))
    batch = ForwardBatch(torch.tensor(ids), n, n, (SeqSpan(0, len(ids), view),), n)
    return ModelRunner(w, store).forward(batch)


async def chain(path: Path, mode: str, weights: str) -> list[int]:
    """The chain test: a question, 40 greedy tokens, a follow-up over both, 40 more."""
    async with Engine.open(str(path), mode=mode, weights=weights, capacity=1024) as e:
        q = await e.prefill("Once upon a time")
        a = await e.decode(parents=[q], max_tokens=40, temperature=0.0, ignore_eos=True)
        f = await e.prefill("And then?", parents=[q, a])
        b = await e.decode(parents=[q, a, f], max_tokens=40, temperature=0.0, ignore_eos=True)
        return [*a.generated, *b.generated]


@pytest.mark.parametrize("weights", ["dense", "gguf", "int8", "int4"])
def test_choreography_and_baseline_agree_token_for_token_in_every_format(gguf_dirs, weights):
    path = gguf_dirs["q4_1"]
    chor = anyio.run(chain, path, "choreographed", weights)
    base = anyio.run(chain, path, "baseline", weights)
    assert len(chor) == 80 and chor == base


def test_quantize_on_load_holds_fewer_bytes(gguf_dirs):
    path = gguf_dirs["q4_1-dense"]
    sizes = {
        f: load_weights(path, dtype=torch.float32, device="cpu", weights=f).nbytes
        for f in ("dense", "int8", "int4")
    }
    assert sizes["int4"] < sizes["int8"] < sizes["dense"]


def test_auto_keeps_a_model_without_a_gguf_dense(gguf_dirs):
    w = load_weights(gguf_dirs["q4_1-dense"], dtype=torch.float32, device="cpu")
    assert not w.quantized


def test_a_mix_of_block_types_in_one_projection_is_dequantized(gguf_dirs, tmp_path):
    """q in Q4_1 but k in Q8_0: qkv cannot be one kernel's codes, so it stays dense
    (the directory's own values); every other projection keeps its blocks."""
    path = gguf_copy(gguf_dirs["q4_1"], tmp_path / "mix", attn_k=Q.Q8_0)
    w = load_weights(path, dtype=torch.float32, device="cpu", weights="gguf")
    assert not isinstance(w.layers[0].qkv, Int4Linear)
    assert isinstance(w.layers[0].gate_up, Int4Linear)


def test_gguf_weights_without_a_file_say_what_to_do(gguf_dirs):
    with pytest.raises(BadWeights, match=r"holds no GGUF file.*int4"):
        load_weights(gguf_dirs["q4_1-dense"], dtype=torch.float32, device="cpu", weights="gguf")


def test_a_truncated_file_is_refused_and_nothing_loads(gguf_dirs, tmp_path):
    path = shutil.copytree(gguf_dirs["q4_1"], tmp_path / "cut")
    data = (path / GGUF_NAME).read_bytes()
    (path / GGUF_NAME).write_bytes(data[: len(data) // 2])
    with pytest.raises(BadWeights, match="not a readable GGUF file"):
        load_weights(path, dtype=torch.float32, device="cpu")


def test_a_file_that_is_not_a_gguf_is_refused(gguf_dirs, tmp_path):
    path = shutil.copytree(gguf_dirs["q4_1"], tmp_path / "junk")
    (path / GGUF_NAME).write_bytes(b"\xff\xfe not a gguf at all" * 10)
    with pytest.raises(BadWeights, match="not a readable GGUF"):
        Engine.load(str(path), capacity=64)


def test_a_tensor_of_the_wrong_shape_is_named(gguf_dirs, tmp_path):
    """A GGUF of another model beside this config: the tensor and what is wrong."""
    from transformers import AutoModelForCausalLM

    other = tmp_path / "other"
    other.mkdir()
    config = tiny_config("llama", 64)
    config.intermediate_size = 96
    AutoModelForCausalLM.from_config(config).save_pretrained(str(other))
    path = shutil.copytree(gguf_dirs["q4_1"], tmp_path / "wrong")
    write_gguf(other, path / GGUF_NAME)
    with pytest.raises(BadWeights, match=r"blk\.0\.ffn_gate\.weight.*different models"):
        load_weights(path, dtype=torch.float32, device="cpu")


def test_a_missing_tensor_is_named(gguf_dirs, tmp_path, monkeypatch):
    path = gguf_copy(gguf_dirs["q4_1"], tmp_path / "missing")
    original = GgufWeights.__init__

    def drop(self, *args, **kwargs):
        original(self, *args, **kwargs)
        del self.tensors["blk.1.ffn_down.weight"]

    monkeypatch.setattr(GgufWeights, "__init__", drop)
    with pytest.raises(BadWeights, match=r"no tensor blk\.1\.ffn_down\.weight"):
        load_weights(path, dtype=torch.float32, device="cpu")


def test_a_block_type_nothing_decodes_is_named(gguf_dirs, tmp_path):
    """Q8_1 (llama.cpp's activation format) in a weight: no kernel, no decoder."""
    path = shutil.copytree(gguf_dirs["q4_1"], tmp_path / "q8_1")
    (path / GGUF_NAME).unlink()
    hf = hf_model(path)
    w = hf.model.layers[0].mlp.down_proj.weight.detach().numpy()
    writer = gguf.GGUFWriter(str(path / GGUF_NAME), "llama")
    size = gguf.GGML_QUANT_SIZES[Q.Q8_1][1]
    raw = np.zeros((w.shape[0], w.shape[1] // 32 * size), dtype=np.uint8)
    writer.add_tensor("blk.0.ffn_down.weight", raw, raw_dtype=Q.Q8_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    src = GgufWeights(path / GGUF_NAME, read_spec(path))
    with pytest.raises(BadWeights, match=r"blk\.0\.ffn_down\.weight is of block type Q8_1"):
        src.projection("layers.0.down", tuple(w.shape), None)


def test_the_default_models_weights_are_its_own_file(real_dir):
    """The embedded default runs its GGUF as it is: resident weights within 1.2x the
    file's size (the dense float32 copy was 6.6x)."""
    w = load_weights(real_dir, dtype=torch.float32, device="cpu", weights="auto")
    size = (real_dir / GGUF_NAME).stat().st_size
    assert w.quantized and w.nbytes <= 1.2 * size


def raw_gguf(path: Path, tensors: dict[str, tuple[object, int, int]]) -> Path:
    """A GGUF holding only `tensors`: name -> (block type, N, K), random blocks."""
    from test_gguf_blocks import random_blocks

    writer = gguf.GGUFWriter(str(path), "llama")
    for i, (name, (kind, n, k)) in enumerate(tensors.items()):
        if kind.name == "Q6_K":  # no kernel: never decoded here, any bytes do
            per, size = gguf.GGML_QUANT_SIZES[kind]
            data = np.random.default_rng(i).integers(0, 256, (n, k // per * size), np.uint8)
        else:
            data = random_blocks(kind.name, n, k, seed=i).reshape(n, -1)
        writer.add_tensor(name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("kind", [Q.Q4_K, Q.Q5_K, Q.Q5_0, Q.Q5_1])
def test_k_quants_and_five_bit_blocks_keep_their_codes(gguf_dirs, tmp_path, kind):
    """A K-quant or 5-bit projection of a file runs on its codes (Q4_K as 4-bit groups,
    the 5-bit types as two 4-bit halves), its values the file's own."""
    path = raw_gguf(tmp_path / "k.gguf", {"blk.0.ffn_down.weight": (kind, 64, 512)})
    src = GgufWeights(path, read_spec(gguf_dirs["q4_1"]))
    lin = src.projection("layers.0.down", (64, 512), None)
    assert isinstance(lin, Int4Linear) and lin.split == (kind != Q.Q4_K)
    want = src.dense("blk.0.ffn_down.weight")
    assert torch.allclose(lin.dense(), want, rtol=0, atol=2**-7 * want.abs().max().item())


def test_fused_members_keep_codes_only_in_one_family(gguf_dirs, tmp_path):
    """Q8_0 beside Q5_K are both split halves: fused as they are; Q4_K beside Q5_K
    (4-bit groups beside halves) and anything beside Q6_K (groups of 16) are dense."""
    spec = read_spec(gguf_dirs["q4_1"])
    rows = 64 * spec.num_heads  # divisible by the heads' halves (q's row order)

    def qkv(q, k, v):
        tensors = {
            f"blk.0.attn_{m}.weight": (t, rows, 256) for m, t in zip("qkv", (q, k, v), strict=True)
        }
        src = GgufWeights(raw_gguf(tmp_path / "f.gguf", tensors), spec)
        return src.projection("layers.0.qkv", (3 * rows, 256), None)

    assert isinstance(qkv(Q.Q8_0, Q.Q5_K, Q.Q5_0), Int4Linear)
    assert isinstance(qkv(Q.Q4_K, Q.Q4_0, Q.Q4_1), Int4Linear)
    assert qkv(Q.Q4_K, Q.Q5_K, Q.Q4_K) is None
    assert qkv(Q.Q4_K, Q.Q4_K, Q.Q6_K) is None
