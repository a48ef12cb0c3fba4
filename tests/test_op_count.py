"""engine/kernels/op_count.py: what counts as a kernel (computing calls, in-place
writes, FlexAttention once) and what does not (views, metadata, no-op casts), host
syncs apart."""

from __future__ import annotations

import torch

from corps.engine.kernels.flex_prefill import PrefillMask, flex_prefill
from corps.engine.kernels.op_count import OpCounts


def test_views_and_metadata_are_not_kernels_and_computing_calls_are():
    x = torch.randn(4, 6)
    with OpCounts() as c:
        y = x.view(2, 12).transpose(0, 1)[1:]  # views
        _ = x.shape, x.size(0), x.float()  # metadata, a no-op cast
        z = torch.nn.functional.linear(x, torch.ones(3, 6))  # one GEMM
        z.add_(1.0)  # in place
        x[0] = 0.0  # a write
        _ = z.argmax(-1).tolist()  # a kernel, then a sync
    assert y.shape == (11, 2) and z.shape == (4, 3)
    assert dict(c.ops) == {"ones": 1, "linear": 1, "add_": 1, "__setitem__": 1, "argmax": 1}
    assert c.kernels == 5 and dict(c.syncs) == {"tolist": 1}


def test_flex_prefill_counts_once_as_its_compiled_kernel():
    q, ak, av = torch.randn(5, 4, 8), torch.randn(2, 12, 8), torch.randn(2, 12, 8)
    lo, hi = torch.zeros(5, dtype=torch.long), torch.arange(8, 13)
    mask = PrefillMask.build(lo, hi)
    with OpCounts() as c:
        out = flex_prefill(q, ak, av, mask, 0.3)
    assert out.shape == (5, 4, 8) and c.ops["flex_attention"] == 1


def test_a_compile_under_the_counter_is_traced_not_counted():
    f = torch.compile(lambda x: torch.nn.functional.silu(x * 2) + 1, backend="eager",
                      fullgraph=True)  # fmt: skip
    x = torch.ones(4)
    with OpCounts() as c:
        got = f(x)
    assert torch.equal(got, torch.nn.functional.silu(x * 2) + 1)
    assert c.kernels == 3  # mul, silu, add, run by the eager backend
