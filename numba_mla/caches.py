"""KV caches: where token ``t`` of sequence ``b`` lives (SPEC.md, "KV caches").

Each row is 576 wide: 512 latent ("nope") dims, which double as V, then 64 rope dims. Both
caches are validated on construction; lengths and block tables are also kept as small host
copies (int32) so every later check is free of device round trips.

On the device both caches are read through one function, ``locate(block_table, page_size, b,
t) -> (page, slot)``, with the row at ``storage[page, slot, :]``: for a contiguous cache the
"page" is the sequence and the page size is the capacity.
"""
from typing import Any, Optional

import numpy as np

from . import _compat  # noqa: F401
from .arrays import (IO_DTYPES, dtype_of, is_array, is_device, last_axis_contiguous, shape_of,
                     to_host)
from .constants import D_LATENT, D_QK, D_ROPE, D_V  # noqa: F401  (re-exported)


def _check_storage(name, x):
    if not is_array(x):
        raise TypeError(f"{name}: expected an array, got {type(x).__name__}")
    shape, dt = shape_of(x), dtype_of(x)
    if len(shape) != 3 or shape[2] != D_QK:
        raise ValueError(f"{name}: expected shape [*, *, {D_QK}] (512 latent + 64 rope), got {list(shape)}")
    if dt not in IO_DTYPES:
        raise TypeError(f"{name}: expected dtype bfloat16, float16 or float32, got {dt}")
    if not last_axis_contiguous(x):
        # The kernels copy a cache row as one run of bytes from its start.
        raise ValueError(f"{name}: its rows (the last axis, {D_QK} values) must be contiguous "
                         f"in memory; got a device array whose last axis is strided")
    return shape, dt


def _host_int32(name, x, ndim):
    """Validated host int32 copy of a small integer array (lengths, block table)."""
    if not is_array(x):
        raise TypeError(f"{name}: expected an int32 array, got {type(x).__name__}")
    dt = dtype_of(x)
    if dt is None or dt.kind not in "iu":
        raise TypeError(f"{name}: expected an int32 array, got dtype {dt}")
    if is_device(x) and dt != np.int32:
        raise TypeError(f"{name}: a device array must have dtype int32, got {dt}")
    if len(shape_of(x)) != ndim:
        raise ValueError(f"{name}: expected {ndim} dimension(s), got shape {list(shape_of(x))}")
    h = np.asarray(to_host(x))
    if h.size and (h.min() < np.iinfo(np.int32).min or h.max() > np.iinfo(np.int32).max):
        raise ValueError(f"{name}: values do not fit int32")
    return np.ascontiguousarray(h, dtype=np.int32)


def check_lengths(lengths, batch, capacity, name="lengths"):
    """Validated host int32 copy of per-sequence lengths: [batch], 0 <= length <= capacity."""
    lh = _host_int32(name, lengths, 1)
    if lh.shape[0] != batch:
        raise ValueError(f"{name}: expected shape [{batch}] (one per sequence), got {list(lh.shape)}")
    if lh.size and lh.min() < 0:
        b = int(np.argmin(lh))
        raise ValueError(f"{name}: expected values >= 0, got {name}[{b}] = {lh[b]}")
    if lh.size and lh.max() > capacity:
        b = int(np.argmax(lh))
        raise ValueError(
            f"{name}: {name}[{b}] = {lh[b]} exceeds the cache capacity of {capacity} tokens"
        )
    return lh


class KVCache:
    """Common interface. ``storage`` is 3-D ``[pages, page_size, 576]``; ``lengths_host`` int32."""

    kind: Optional[str] = None
    storage: Any
    lengths: Any
    lengths_host: np.ndarray
    block_table: Any
    page_size: int

    @property
    def batch(self):
        return self.lengths_host.shape[0]

    @property
    def dtype(self):
        return dtype_of(self.storage)

    @property
    def capacity(self):
        """Tokens each sequence can hold."""
        raise NotImplementedError

    def rows(self, b: int, n: int) -> np.ndarray:
        """NumPy [n, 576] copy of tokens 0..n-1 of sequence b (host path, for the reference)."""
        raise NotImplementedError

    @staticmethod
    def device_locate():
        raise NotImplementedError


class ContiguousKVCache(KVCache):
    """``kv [B, S_max, 576]``: token t of sequence b at ``kv[b, t]``."""

    kind = "contiguous"

    def __init__(self, kv: Any, lengths: Any):
        shape, _ = _check_storage("kv", kv)
        self.storage = self.kv = kv
        self.lengths_host = check_lengths(lengths, shape[0], shape[1])
        self.lengths = lengths if is_device(lengths) else self.lengths_host
        self.block_table = None
        self.page_size = shape[1]

    @property
    def capacity(self):
        return shape_of(self.storage)[1]

    def rows(self, b, n):
        return np.asarray(to_host(self.storage)[b, :n])

    @staticmethod
    def device_locate():
        from numba import cuda  # here, not at the top: the reference builds caches without Numba

        @cuda.jit(device=True)
        def locate(block_table, page_size, b, t):
            return b, t

        return locate

    def __repr__(self):
        return f"ContiguousKVCache(kv {list(shape_of(self.storage))} {self.dtype}, B={self.batch})"


class PagedKVCache(KVCache):
    """``pages [P, page_size, 576]``, ``block_table [B, max_pages] int32``: token t of
    sequence b at ``pages[block_table[b, t // page_size], t % page_size]``. Entries past a
    sequence's last used page are never read (and may hold anything)."""

    kind = "paged"

    def __init__(self, pages: Any, block_table: Any, lengths: Any):
        if is_array(pages) and len(shape_of(pages)) == 3 and shape_of(pages)[1] <= 0:
            raise ValueError(f"page_size: expected a positive page size (pages.shape[1]), got {shape_of(pages)[1]}")
        shape, _ = _check_storage("pages", pages)
        num_pages, page_size = shape[0], shape[1]
        bt = _host_int32("block_table", block_table, 2)
        batch, max_pages = bt.shape
        self.storage = self.pages = pages
        self.block_table = block_table if is_device(block_table) else bt
        self.block_table_host = bt
        self.page_size = page_size
        self.num_pages = num_pages
        self.lengths_host = check_lengths(lengths, batch, max_pages * page_size)
        self.lengths = lengths if is_device(lengths) else self.lengths_host
        # Pages each sequence reads (int64: a length near 2^31 plus page_size - 1 overflows int32)
        used = (self.lengths_host.astype(np.int64) + page_size - 1) // page_size
        for b in range(batch):
            row = bt[b, : used[b]]
            bad = np.nonzero((row < 0) | (row >= num_pages))[0]
            if bad.size:
                j = int(bad[0])
                raise ValueError(
                    f"block_table: block_table[{b}, {j}] = {row[j]} is outside [0, {num_pages}) "
                    f"(page {j} of sequence {b} holds tokens it uses)"
                )

    @property
    def capacity(self):
        return self.block_table_host.shape[1] * self.page_size

    def rows(self, b, n):
        pages = to_host(self.storage)
        t = np.arange(n)
        return np.asarray(pages[self.block_table_host[b, t // self.page_size], t % self.page_size])

    @staticmethod
    def device_locate():
        from numba import cuda  # here, not at the top: the reference builds caches without Numba

        from .ptx import divmod_u32

        @cuda.jit(device=True)
        def locate(block_table, page_size, b, t):
            page, slot = divmod_u32(t, page_size)
            return block_table[b, page], slot

        return locate

    def __repr__(self):
        return (
            f"PagedKVCache(pages {list(shape_of(self.storage))} {self.dtype}, "
            f"block_table {list(self.block_table_host.shape)}, B={self.batch})"
        )
