"""Position maps: where a shard's local keys sit in the whole sequence.

Decode context parallelism spreads each sequence's cache over the N ranks of a group by token.
A rank's cache holds only its share of the keys, at local indices ``j = 0, 1, ...``; masks and
score mods must still see GLOBAL positions (a causal mask compares the query's global position
with the key's), and the query positions stay global too (``q_pos = L - nq + i`` with ``L`` the
sequence's global length). Both layouts in use are affine:

- interleaved (vLLM's decode context parallel): global key ``j * N + r`` on rank r of N;
- contiguous blocks of C tokens: global key ``j + r * C`` on rank r, at most C of them.

``PositionMap(stride, offset, capacity)`` says: local key j is global key ``j * stride +
offset``, and of a sequence of L global keys the shard holds ``local_count(L)`` =
``clamp(ceil((L - offset) / stride), 0, capacity)`` (no cap when ``capacity`` is None).

The map is a compile-time constant of a kernel: ``device_functions`` wraps the mask and score
mod device functions the factory compiles in so that they take LOCAL key indices (a tile of
local keys ``[j0, j1)`` is classified over its global span, which covers every key it holds, so
the answer stays sound and tile skipping still skips; the mask's global key range becomes a
local index range), and adds ``key_count``, which the tile walk uses to cut the keys to the
shard (kernels/common.py). The identity map is never compiled in: a cache without a map takes
exactly the kernels' ordinary code.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import _compat  # noqa: F401  (NumPy shim before numba.cuda)
from .mods import KEY_MAX
from numba import cuda


@dataclass(frozen=True)
class PositionMap:
    """Local key j of a shard is global key ``j * stride + offset``; at most ``capacity`` local
    keys (None: no cap)."""

    stride: int = 1
    offset: int = 0
    capacity: Optional[int] = None

    def __post_init__(self):
        for name in ("stride", "offset"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
        if self.stride < 1:
            raise ValueError(f"stride: expected a positive int, got {self.stride}")
        if self.offset < 0:
            raise ValueError(f"offset: expected an int >= 0, got {self.offset}")
        if self.capacity is not None and (isinstance(self.capacity, bool) or self.capacity < 0):
            raise ValueError(f"capacity: expected None or an int >= 0, got {self.capacity}")
        # Plain ints (NumPy ints would make different, equal-looking kernel keys)
        object.__setattr__(self, "stride", int(self.stride))
        object.__setattr__(self, "offset", int(self.offset))
        if self.capacity is not None:
            object.__setattr__(self, "capacity", int(self.capacity))

    @classmethod
    def interleaved(cls, rank, world):
        """Token t on rank ``t % world``: local key j of ``rank`` is global ``j * world + rank``."""
        _check_rank(rank, world)
        return cls(int(world), int(rank), None)

    @classmethod
    def blocks(cls, rank, block):
        """Tokens ``[rank * block, (rank + 1) * block)`` on ``rank``."""
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
            raise ValueError(f"block: expected a positive int, got {block!r}")
        return cls(1, int(rank) * int(block), int(block))

    @property
    def identity(self):
        return self.stride == 1 and self.offset == 0 and self.capacity is None

    def cache_key(self):
        return ("positions", self.stride, self.offset, self.capacity)

    # -- host forms ------------------------------------------------------------------------
    def local_count(self, lengths):
        """Local keys of sequences of ``lengths`` global keys (int64 array, or int)."""
        L = np.asarray(lengths, np.int64)
        n = (np.maximum(L - self.offset, 0) + self.stride - 1) // self.stride
        if self.capacity is not None:
            n = np.minimum(n, self.capacity)
        return n if n.ndim else int(n)

    def global_keys(self, n):
        """[n] global positions of local keys 0..n-1."""
        return np.arange(n, dtype=np.int64) * self.stride + self.offset

    def global_capacity(self, local_capacity):
        """The longest global sequence whose share fits ``local_capacity`` local keys."""
        if self.capacity is not None and local_capacity >= self.capacity:
            return KEY_MAX  # the shard never holds more than its block, whatever L is
        return local_capacity * self.stride + self.offset

    # -- device forms ----------------------------------------------------------------------
    def device_functions(self, fns):
        """The factory's device functions (``_device_functions``) with local key indices in
        place of global ones, plus ``key_count(length)``; the others pass through."""
        s, off, cap = self.stride, self.offset, self.capacity
        apply, classify = fns["mask_apply"], fns["mask_classify"]
        key_range, score_mod = fns["mask_key_range"], fns["score_mod"]

        @cuda.jit(device=True)
        def key_count(length):
            n = (max(length - off, 0) + (s - 1)) // s
            if cap is not None:
                n = min(n, cap)
            return n

        @cuda.jit(device=True)
        def local_apply(x, b, h, i, q_pos, k, bias):
            return apply(x, b, h, i, q_pos, k * s + off, bias)

        @cuda.jit(device=True)
        def local_score_mod(x, b, h, q_pos, k):
            return score_mod(x, b, h, q_pos, k * s + off)

        @cuda.jit(device=True)
        def local_classify(k0, k1, q_lo, q_hi):
            # Local keys [k0, k1) lie in the global span [k0*s + off, (k1-1)*s + off]: what
            # holds for every key of the span holds for the tile's (sound, not always exact).
            g0 = k0 * s + off
            g1 = (k1 - 1) * s + off + 1 if k1 > k0 else g0
            return classify(g0, g1, q_lo, q_hi)

        @cuda.jit(device=True)
        def local_key_range(q_lo, q_hi):
            # Global [g0, g1) -> the local keys j with g0 <= j*s + off < g1.
            g0, g1 = key_range(q_lo, q_hi)
            j0 = (g0 - off + (s - 1)) // s if g0 > off else 0
            if g1 >= KEY_MAX:
                j1 = KEY_MAX
            else:
                j1 = (g1 - off + (s - 1)) // s if g1 > off else 0
            return j0, j1

        return dict(fns, mask_apply=local_apply, score_mod=local_score_mod,
                    mask_classify=local_classify, mask_key_range=local_key_range,
                    key_count=key_count)


def _check_rank(rank, world):
    for name, v in (("rank", rank), ("world", world)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if world < 1:
        raise ValueError(f"world: expected a positive int, got {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank: expected 0 <= rank < {world}, got {rank}")
