"""Tiny models and tokenizers built from configs (no download), and an HF oracle."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import anyio
import torch

SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "what is seven times six",
    "you are a careful solver",
    "hello world, how are you today?",
]


def make_tokenizer(path: Path, *, bos_sink: bool = False, template: str = SMOL_TEMPLATE):
    """A byte-level BPE tokenizer (~300 ids) with ChatML specials; optionally adds BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    kwargs = dict(eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=template)
    if bos_sink:
        bos = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
        )
        kwargs["bos_token"] = "<s>"
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)
    fast.save_pretrained(str(path))
    return fast


def tiny_config(arch: str, vocab: int):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=None,
    )
    if arch == "llama":
        return LlamaConfig(**common, architectures=["LlamaForCausalLM"])
    if arch == "llama3-scaled":
        scaling = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        return LlamaConfig(**common, rope_scaling=scaling, architectures=["LlamaForCausalLM"])
    if arch == "mistral":
        return MistralConfig(**common, architectures=["MistralForCausalLM"])
    if arch == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=False, architectures=["Qwen2ForCausalLM"])
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim=32, architectures=["Qwen3ForCausalLM"])
    raise ValueError(arch)


def make_model_dir(path: Path, arch: str, *, bos_sink: bool = False, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(path, bos_sink=bos_sink)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, len(tok)))
    with torch.no_grad():  # larger weights than init so that logits differ visibly
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    model.save_pretrained(str(path))
    return path


def hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


class Oracle:
    """Brute-force reference for choreographies, built on HF's own attention.

    Each message is encoded by HF with a DynamicCache holding exactly the K/V of
    the call's context: the parents' keys as HF rotated them when encoding them,
    moved to the call's offsets by a float64 delta rotation (the paper's method,
    independent of corps, which stores keys unrotated).
    """

    def __init__(self, hf) -> None:
        self.hf = hf
        self.inv_freq = hf.model.rotary_emb.inv_freq.double()  # (D/2,)
        self.enc: dict[int, tuple[list[torch.Tensor], list[torch.Tensor], int]] = {}

    def encode(
        self, mid: int, tokens: list[int], parents: list[tuple[int, int]], new_offset: int
    ) -> torch.Tensor:
        """Encode message mid with parents [(id, start)]; returns its logits (t, V)."""
        from transformers import DynamicCache

        cache = DynamicCache()
        n = 0
        if parents:
            for layer in range(len(self.hf.model.layers)):
                ks, vs = [], []
                for pid, start in parents:
                    k, v, enc_start = (
                        self.enc[pid][0][layer],
                        self.enc[pid][1][layer],
                        self.enc[pid][2],
                    )
                    ks.append(self.shift(k, start - enc_start))
                    vs.append(v)
                cache.update(torch.cat(ks, 2), torch.cat(vs, 2), layer)
            n = cache.get_seq_length()
        t = len(tokens)
        with torch.no_grad():
            out = self.hf(
                input_ids=torch.tensor([tokens], device=self.hf.device),
                position_ids=torch.arange(new_offset, new_offset + t, device=self.hf.device)[None],
                cache_position=torch.arange(n, n + t, device=self.hf.device),
                past_key_values=cache,
                use_cache=True,
            )
        keys = [layer.keys[:, :, n:].clone() for layer in out.past_key_values.layers]
        values = [layer.values[:, :, n:].clone() for layer in out.past_key_values.layers]
        self.enc[mid] = (keys, values, new_offset)
        return out.logits[0]

    def shift(self, k: torch.Tensor, delta: int) -> torch.Tensor:
        """Rotate keys (1, H, n, D) by delta positions, in float64."""
        if delta == 0:
            return k
        ang = delta * torch.cat([self.inv_freq, self.inv_freq])  # (D,)
        kd = k.double()
        half = k.shape[-1] // 2
        rot = torch.cat([-kd[..., half:], kd[..., :half]], dim=-1)
        return (kd * torch.cos(ang) + rot * torch.sin(ang)).to(k.dtype)


def build_mask(
    query_msgs: torch.Tensor,
    query_parents: Sequence[set[int]],
    query_pos: torch.Tensor,
    slot_msgs: torch.Tensor,
    slot_pos: torch.Tensor,
) -> torch.Tensor:
    """Reference mask over store slots (the engine attends through views; this is the oracle).

    Query q (in message query_msgs[q] at logical position query_pos[q]) may see slot s
    iff s belongs to one of q's parents, or to q's own message at an earlier or equal
    position. Returns (Q, S) bool.
    """
    rows = []
    for q in range(query_msgs.shape[0]):
        allowed = torch.tensor(sorted(query_parents[q]), dtype=slot_msgs.dtype)
        parent = torch.isin(slot_msgs, allowed)  # (S,)
        own = (slot_msgs == query_msgs[q]) & (slot_pos <= query_pos[q])  # (S,)
        rows.append(parent | own)
    return torch.stack(rows)  # (Q, S)


def run_calls(core, requests, *, want_logits: bool = False, on_token=None):
    """Run requests to their end through the real batching loop (a `Scheduler` over
    `core`, started here and closed after); all or nothing. Returns (handles, each
    call's logits over its own tokens if `want_logits`, else None). `on_token(i, tok)`
    runs on the event loop between steps, as a stream's callback does."""
    return anyio.run(partial(_run_calls, core, list(requests), want_logits, on_token))


async def _run_calls(core, requests, want_logits, on_token):
    from corps.engine.exec.call import Call
    from corps.engine.sched.scheduler import Scheduler

    sched = Scheduler(core, step_tokens=1 << 30)  # one step takes every ready token
    calls = [Call.queued(r, want_logits=want_logits) for r in requests]
    async with anyio.create_task_group() as tg:
        sched.started = True
        tg.start_soon(sched.run)
        for i, call in enumerate(calls):
            if on_token is not None:
                call.on_token = partial(on_token, i)
            sched.submit_nowait(call)
        try:
            handles = [await call.wait() for call in calls]
        except BaseException:
            for call in calls:
                call.cancelled = True
            for call in calls:
                await call.ended.wait()
                if call.handle is not None:
                    core.free(call.handle)
            raise
        finally:
            await sched.close()
    logits = [torch.cat(call.logits) for call in calls] if want_logits else None
    return handles, logits


def shared_views(extra: int = 1, head_dim: int = 64):
    """Views over one arena from a random store: two contexts each read by two calls
    (the second reader of each is split in two parts), one call with no context.
    The arena starts zeroed, so tests may compare it whole. Returns (arena, pool,
    views, generator)."""
    from corps.cache.arena import ViewArena
    from corps.cache.context import ContextPool
    from corps.cache.kv import KVStore
    from corps.cache.rope import RopeTables
    from corps.engine.attention.views import open_view

    g = torch.Generator().manual_seed(0)
    dims = dict(num_layers=1, num_kv_heads=2, head_dim=head_dim, dtype=torch.float32)
    store = KVStore(capacity=64, **dims)
    store.k.copy_(torch.randn(store.k.shape, generator=g))
    store.v.copy_(torch.randn(store.v.shape, generator=g))
    cos, sin = torch.randn(128, head_dim, generator=g), torch.randn(128, head_dim, generator=g)
    rope = RopeTables(cos, sin)
    arena = ViewArena(capacity=256, **dims)
    arena.k.zero_(), arena.v.zero_()
    pool = ContextPool()
    short, long = (list(range(5)), list(range(5))), (list(range(20, 37)), list(range(10, 27)))
    views = []
    for slots, pos in (short, long, ([], []), short, long):
        s, p = torch.tensor(slots, dtype=torch.long), torch.tensor(pos, dtype=torch.long)
        views.append(open_view(store, rope, s, p, extra, arena, pool=pool))
    return arena, pool, views, g


def peft_adapter(model_dir, out, *, rank: int = 4, seed: int = 0):
    """An adapter made with peft alone, its B not zero (so it changes the model)."""
    torch.manual_seed(seed)
    from corps.engine.model.adapter_files import trainable

    lora = trainable(hf_model(model_dir), rank=rank, alpha=8, dropout=0.0)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    lora.save_pretrained(str(out))
    return lora.eval()


LOGPROBS = dict(logprobs=True, temperature=1.0, max_tokens=5, ignore_eos=True)


async def choreographed_workflow(engine, seed: int = 0):
    """Repositioning, overlapping parents, parallel siblings and shared contexts."""
    system = await engine.prefill("you are a helpful assistant", role="system")
    at = system.offset + system.length
    q1, q2 = await engine.prefill_many(
        [
            dict(message="what is two plus two", parents=[system], new_offset=at),
            dict(message="name a colour", parents=[system], new_offset=at),
        ]
    )  # both at the same offset: they overlap
    end = at + max(q1.length, q2.length)
    # siblings decoded in one step over the same parents (a shared context)
    a1, a2 = await engine.decode_many(
        [
            dict(parents=[system, q1], offsets=[None, at], new_offset=end, seed=seed, **LOGPROBS),
            dict(parents=[system, q1, q2], offsets=[None, at, at], new_offset=end,
                 seed=seed + 1, **LOGPROBS),
        ]
    )  # fmt: skip
    # a later call reads them in another order, moved elsewhere (repositioning)
    final = await engine.decode(parents=[q2, a2, a1], header="so:", seed=seed + 2, **LOGPROBS)
    return [system, q1, q2, a1, a2, final]


def bare_call(feed=4, fed=0, pending=None, jumped=(), closing=(), first_spans=(), spans=()):
    """A decode call built by hand (no planner, no store) in a given step state."""
    from corps.engine.exec.call import Call, CallPlan
    from corps.engine.request.sampling_params import SamplingParams

    plan = CallPlan(
        kind="decode", role="assistant", offset=0, parents=(), parent_offsets=(),
        owner=None, visibility=None, own=feed, prefix=[1] * feed, sampling=SamplingParams(),
    )  # fmt: skip
    c = Call(plan, [], [], [1] * feed, 0, first_spans=tuple(first_spans))
    c.fed, c.pending, c.jumped, c.closing = fed, pending, list(jumped), list(closing)
    c.spans = list(spans)
    return c


def plan_shape(plan) -> list[tuple[int, int]]:
    """(start, n) of each entry of a StepPlan."""
    return [(e.start, e.n) for e in plan.entries]


_GROUPS = itertools.count(10_000)


class FakeCall(SimpleNamespace):
    """A call as the policies and admission read it (hashable by identity, as `Call`
    is); `unplan` as `Call.unplan` (back to queued)."""

    __hash__ = object.__hash__

    def unplan(self) -> None:
        self.plan, self.done = None, False


def fake_job(
    t, group=None, wf=None, objective="throughput", size=1, name="", critical=None, tenant=None
):  # fmt: skip
    """A waiting call as the policies and admission read it (no engine)."""
    return FakeCall(
        submitted=t, group=group if group is not None else next(_GROUPS), workflow=wf,
        objective=objective, request=SimpleNamespace(size=size, tenant=tenant),
        want_logits=False, keep=0, cancelled=False, plan=None, admitted=None, error=None,
        name=name, pins=[], critical=objective == "latency" if critical is None else critical,
        first_token=None, skipped=0, generated=[], done=False, rows=1, keys=0,
    )  # fmt: skip


async def stepping(engine, steps: int = 1) -> None:
    """Wait until the engine's loop has run `steps` more steps (its trace events, a
    public sink): a call made after this joins a batch that is already running."""
    from corps.engine.trace.events import Step

    ran = anyio.Event()
    seen = 0

    def sink(event) -> None:
        nonlocal seen
        if isinstance(event, Step):
            seen += 1
            if seen >= steps:
                ran.set()

    engine.recorder.add(sink)
    try:
        await ran.wait()
    finally:
        engine.recorder.remove(sink)


def reachable_tensor_bytes(root) -> int:
    """Bytes of the distinct tensor storages reachable from `root` through object
    references (not through modules, classes or functions: what `root` itself holds)."""
    import gc
    import types

    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    seen: set[int] = set()
    storages: dict[int, int] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.is_mkldnn:  # oneDNN's packed weights: opaque, no storage to read
                storages[id(obj)] = obj.numel() * obj.element_size()
            elif obj.device.type != "meta":
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
            continue
        todo.extend(gc.get_referents(obj))
    return sum(storages.values())


def order(calls, budget=None):
    """A step's order of these calls within `budget` tokens (None: no bound), as the
    loop hands one to `Executor.step`."""
    from corps.engine.exec.step_plan import StepPlan

    return StepPlan(calls=tuple(calls), budget=budget)


def park_decodes(engine, monkeypatch, release) -> None:
    """`engine.decode_many` waits until `release` (a threading.Event) is set: a server's
    non-streamed requests stay inside it until then."""
    real = engine.decode_many

    async def waits(requests):
        await anyio.to_thread.run_sync(release.wait, abandon_on_cancel=True)
        return await real(requests)

    monkeypatch.setattr(engine, "decode_many", waits)
