"""RoPE tables and (re)positioning.

Keys are stored *unrotated* in the global store and rotated when a call reads
them, at whatever logical position that call gives them. Repositioning a
message is therefore not a mutation but part of reading it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class RopeTables:
    """cos/sin for every logical position the model supports."""

    cos: Tensor  # (P, D)
    sin: Tensor  # (P, D)

    @property
    def max_positions(self) -> int:
        return self.cos.shape[0]

    @classmethod
    def from_hf_rotary(cls, rotary_emb, max_positions: int, dtype: torch.dtype) -> RopeTables:
        """Tabulate an HF rotary module (any rope_type it implements, scaling included)."""
        pos = torch.arange(max_positions, dtype=torch.long)[None]  # (1, P)
        probe = torch.zeros(1, dtype=torch.float32)
        with torch.no_grad():
            cos, sin = rotary_emb(probe, pos)  # (1, P, D) each, attention scaling applied
        return cls(cos=cos[0].to(dtype).contiguous(), sin=sin[0].to(dtype).contiguous())

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate x (..., T, H, D) to positions (T,) as HF does (rotate_half convention)."""
        cos = self.cos[positions].unsqueeze(-2)  # (T, 1, D)
        sin = self.sin[positions].unsqueeze(-2)  # (T, 1, D)
        return apply_rope(x, cos, sin)

    def rotate_into(self, x: Tensor, positions: Tensor, out: Tensor, token_dim: int = -3) -> None:
        """Write `rotate(x, positions)` into out (x's shape, any strides), bit for bit,
        in four passes over the data instead of seven (no concatenated copy of x):
        first half x1 cos - x2 sin, second half x2 cos + x1 sin, as rotate_half has it.

        x is (..., T, H, D) by default; `token_dim=-2` takes head-major (..., H, T, D).
        """
        cos, sin = self.cos[positions], self.sin[positions]  # (T, D)
        if token_dim == -3:
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # (T, 1, D)
        elif token_dim != -2:
            raise ValueError(f"token_dim must be -3 or -2, got {token_dim}")
        rope_into(x, cos, sin, out)


def rope_into(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor) -> None:
    """out = x rotated by tables already picked for its tokens (broadcast against x),
    bit for bit as `apply_rope`, in four passes: first half x1 cos - x2 sin, second
    half x2 cos + x1 sin, as rotate_half has it."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    torch.mul(x, cos, out=out)
    out[..., :half].sub_(x2 * sin[..., :half])  # x1 c + (-x2) s == x1 c - x2 s exactly
    out[..., half:].add_(x1 * sin[..., half:])


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x rotated by tables already picked for its tokens (broadcast against x), as HF
    does: x cos + rotate_half(x) sin. The forward uses it with one step's tables."""
    return x * cos + rotate_half(x) * sin


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
