"""Next-token draws from logit rows: greedy, temperature, top-k, top-p, seeded, forced.

Pure tensor functions over `SamplingParams`; the per-call logic around them
(forced tokens, stops, footers, constraints) is `corps.engine.exec.sampler`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from corps.engine.errors import NonFiniteLogits
from corps.engine.request.sampling_params import SamplingParams

#: Nucleus sampling first looks for the nucleus among this many most likely tokens
#: (a `topk`), and sorts the whole vocabulary only when it is wider: the sort of
#: 49k probabilities cost ~2.5 ms per sampled token here, more than a decode step's
#: share of the model for a call.
NUCLEUS_FIRST = 64


def sample(
    logits: Tensor, params: SamplingParams, generator: torch.Generator | None, index: int = 0
) -> int:
    """One token id from logits (V,).

    A forced call does all the same work, then emits its `index`-th forced token, so
    a benchmark replaying tokens times decoding as it is (not minus the sampling).
    Raises NonFiniteLogits when the logits hold NaN or inf.
    """
    if params.greedy:
        return forced(params, index, int(torch.argmax(logits)))
    (token,) = sample_rows(logits[None], [params], [generator])
    if token is None:
        raise NonFiniteLogits(
            "the model's next-token scores are not finite (NaN or inf), so nothing can be "
            "sampled: a 16-bit overflow? open the engine with dtype='float32'"
        )
    return forced(params, index, token)


@torch.inference_mode()  # the logits are the forward's inference tensors
def bias(logits: Tensor, rows: Sequence[tuple[int, SamplingParams]]) -> None:
    """Add each row's `logit_bias` to its logits (N, V) in place, in one indexed write
    for all of them: -100 bans a token (-inf), 100 leaves it the only choice."""
    at, ids, values, only = [], [], [], []
    for r, p in rows:
        for t, b in p.logit_bias:
            if b >= 100:
                only.append((r, t))
            at.append(r)
            ids.append(t)
            values.append(float("-inf") if b <= -100 else b)
    if not at:
        return
    index = (torch.tensor(at, device=logits.device), torch.tensor(ids, device=logits.device))
    logits.index_put_(index, torch.tensor(values, dtype=logits.dtype, device=logits.device),
                      accumulate=True)  # fmt: skip
    if only:  # +100: only the tokens biased so may be drawn in that row
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep[[r for r, _ in only], [t for _, t in only]] = True
        rows_only = sorted({r for r, _ in only})
        logits[rows_only] = logits[rows_only].masked_fill(~keep[rows_only], float("-inf"))


def forced(params: SamplingParams, index: int, token: int) -> int:
    """The token a call emits: its `index`-th forced token if forced, else `token`."""
    return params.force[index] if params.force else token


def sample_rows(
    logits: Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[int | None]:
    """The tokens drawn by B sampled calls (forcing not applied), one row of logits
    (B, V) each; None for a row whose logits are not finite.

    Calls with the same top-k and top-p share one softmax and one topk over their
    rows (one call alone is the case B = 1, through the same ops), and each draws
    from its own generator, so a call draws what it would draw alone.
    """
    out: list[int | None] = [None] * len(params)
    groups: dict[tuple[int, float], list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault((p.top_k, p.top_p), []).append(i)
    for (top_k, top_p), ix in groups.items():
        rows = logits if len(ix) == len(params) else logits[ix]  # (Bg, V)
        temps = torch.tensor([[params[i].temperature] for i in ix], device=rows.device)
        probs = torch.softmax(rows.float() / temps, dim=-1)  # (Bg, V)
        ids, weights = candidates(probs, top_k, top_p)
        gens = [generators[i] for i in ix]
        for i, token in zip(ix, draw(ids, weights, gens), strict=True):
            out[i] = token
    return out


def candidates(probs: Tensor, top_k: int, top_p: float) -> tuple[Tensor | None, Tensor]:
    """The tokens each row may draw and their weights, from its probabilities (B, V):
    the `top_k` most likely (ties in any order), then of those the nucleus, the fewest
    most likely whose probability reaches `top_p` (the token that crosses it
    included). Returns (B, K) ids and (B, K) weights, most likely first and 0 past a
    row's candidates; or None and the probabilities when every token is a candidate."""
    v = probs.shape[-1]
    if not top_k and top_p >= 1.0:
        return None, probs
    if top_k:  # the k most likely bound the work: no need to look further
        vals, ids = torch.topk(probs, min(top_k, v))  # (B, k) most likely first
        if top_p >= 1.0:
            return ids, vals
        keep = _nucleus(vals, top_p, vals.sum(-1, keepdim=True))  # over the top k renormalised
        return ids, vals * keep
    vals, ids = torch.topk(probs, min(v, NUCLEUS_FIRST))  # (B, F) most likely first
    if vals.shape[-1] < v:
        wide = _nucleus(vals, top_p, None)[:, -1]  # (B,) the nucleus may go on
        if bool(wide.any()):
            vals, ids = _widened(probs, vals, ids, wide)
    keep = _nucleus(vals, top_p, None)  # (B, K), a prefix of each row
    return ids, vals * keep


def _widened(probs: Tensor, vals: Tensor, ids: Tensor, wide: Tensor) -> tuple[Tensor, Tensor]:
    """vals, ids (B, F) padded with zeros to (B, V), the `wide` rows' replaced by a sort
    of the whole row."""
    pad = probs.shape[-1] - vals.shape[-1]
    vals = torch.nn.functional.pad(vals, (0, pad))  # (B, V)
    ids = torch.nn.functional.pad(ids, (0, pad))
    vals[wide], ids[wide] = torch.sort(probs[wide], dim=-1, descending=True)  # (W, V)
    return vals, ids


def _nucleus(sorted_probs: Tensor, top_p: float, norm: Tensor | None) -> Tensor:
    """(B, K) bool: which of these most-likely-first probabilities (divided by `norm`,
    the top-k mass, when top-k renormalises them) are in the nucleus: those before
    which less than top_p is gathered. The most likely always is."""
    p = sorted_probs / norm if norm is not None else sorted_probs
    return torch.cumsum(p, -1) - p < top_p


def draw(
    ids: Tensor | None, weights: Tensor, generators: Sequence[torch.Generator | None]
) -> list[int | None]:
    """One token per row: one of its `ids` (or, when None, a token id: an index of its
    weights) with probability proportional to its weight (B, K), by inverting the
    cumulative weights at one uniform draw from the row's generator: ~60 us over a
    49k vocabulary, where `torch.multinomial` drew an exponential per token (~1.2 ms).
    The sums are in float64, so that even a token 1e-9 likely keeps its own share of
    [0, 1); a zero weight is never drawn. None for a row whose weights are not finite."""
    cdf = torch.cumsum(weights, -1, dtype=torch.float64)  # (B, K)
    total = cdf[:, -1:]  # (B, 1)
    r = torch.cat([torch.rand(1, generator=g, dtype=cdf.dtype) for g in generators])  # (B,)
    u = (1 - r.to(cdf.device))[:, None] * total  # (B, 1) in (0, total]
    at = torch.searchsorted(cdf, u).clamp_(max=cdf.shape[-1] - 1)  # (B, 1) first cdf >= u
    tokens = at if ids is None else ids.gather(-1, at)
    ok = (torch.isfinite(total) & (total > 0))[:, 0].tolist()
    return [t if good else None for t, good in zip(tokens[:, 0].tolist(), ok, strict=True)]


#: Columns per block of `first_argmax`'s first pass.
ARGMAX_BLOCK = 1024


def argmax_rows(logits: Tensor) -> list[int]:
    """Greedy tokens of logits (N, V), one per row, in one pass (a step's greedy calls
    together: a per-call argmax over the vocabulary cost ~60 us each)."""
    return first_argmax(logits).tolist()


def first_argmax(x: Tensor) -> Tensor:
    """`x.argmax(-1)` of x (N, V): the first index of each row's maximum (NaN counts
    as the maximum, as in torch), faster on a CPU, where torch's argmax is not
    vectorised (16 rows of a 49k vocabulary: 0.22 ms in float32, 1.28 ms in
    bfloat16; 2-core Zen 5). float32 goes through NumPy's SIMD argmax (0.035 ms
    alone, ~0.09 ms right after the matmul that wrote the logits); 16-bit rows,
    which NumPy has no fast argmax for, in two vectorised passes: each block of
    `ARGMAX_BLOCK` columns' maximum (amax), then the argmax inside the row's first
    block that holds the row's maximum (0.18 ms in bfloat16). On other devices,
    and for rows shorter than two blocks, torch's argmax as it is."""
    if x.device.type != "cpu":
        return x.argmax(-1)
    if x.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(x.detach().numpy().argmax(-1))
    n, v = x.shape
    blocks = v // ARGMAX_BLOCK
    if blocks < 2:
        return x.argmax(-1)
    whole = blocks * ARGMAX_BLOCK
    peaks = x[:, :whole].reshape(n, blocks, ARGMAX_BLOCK).amax(-1)  # (N, blocks)
    if whole < v:  # the last, shorter block
        peaks = torch.cat([peaks, x[:, whole:].amax(-1, keepdim=True)], -1)
    first = peaks.argmax(-1, keepdim=True) * ARGMAX_BLOCK  # (N, 1) its block's start
    cols = (first + torch.arange(ARGMAX_BLOCK)).clamp_(max=v - 1)  # (N, BLOCK)
    # a clamped column repeats column v-1 after it: never an earlier first maximum
    return cols.gather(-1, x.gather(-1, cols).argmax(-1, keepdim=True))[:, 0]  # (N,)


def take_rows(logits: Tensor, rows: list[int]) -> Tensor:
    """logits[rows] (len(rows), V): a view when the rows are one ascending run (a
    decode-only step whose every call samples), so the rows are not copied (64 rows
    of a 49k vocabulary: a 12 MB copy, ~1 ms on two cores), else a gathered copy."""
    first = rows[0]
    if rows[-1] - first == len(rows) - 1 and rows == list(range(first, first + len(rows))):
        return logits[first : first + len(rows)]
    return logits[rows]
