"""KV caches: where token ``t`` of sequence ``b`` lives (SPEC.md, "KV caches").

Each row is 576 wide: 512 latent ("nope") dims, which double as V, then 64 rope dims. The
caches (contiguous, paged, ragged) are validated on construction; lengths and block tables are also kept as small host
copies (int32) so every later check is free of device round trips.

On the device every cache is read through one function, ``locate(block_table, page_size,
npages, b, t) -> (page, slot)``, with the row at ``storage[page, slot, :]``: for a contiguous
cache the "page" is the sequence and the page size is the capacity. It clamps what it reads to
the arrays' extents (values may change in device memory after the checks).

FP8 storage (fp8.py): the same caches over rows of float8_e4m3fn codes, ``kv_scale=`` the
per-tensor scale (layout ``"e4m3"``, 576 bytes a token) or ``fp8_layout="v32"`` (FlashMLA's
656-byte rows, their scales inside). ``rows()`` then returns the exact dequantized values.
"""
from typing import Any, Optional

import numpy as np

from . import _compat  # noqa: F401
from . import fp8
from .arrays import (IO_DTYPES, dtype_of, is_array, is_device, is_torch, last_axis_contiguous,
                     shape_of, to_host)
from .constants import D_LATENT, D_QK, D_ROPE, D_V  # noqa: F401  (re-exported)


def _check_storage(name, x, kv_scale=None, fp8_layout=None):
    """Shape, dtype and row contiguity of the storage; for FP8 storage (a float8_e4m3fn or
    uint8 dtype, or an FP8 argument given) also the layout's width and the scale. Returns
    (shape, fp8 layout or None, kv_scale or None)."""
    if not is_array(x):
        raise TypeError(f"{name}: expected an array, got {type(x).__name__}")
    shape, dt = shape_of(x), dtype_of(x)
    layout = None
    if fp8.is_fp8_dtype(dt) or kv_scale is not None or fp8_layout is not None:
        layout = fp8.check_layout(fp8_layout)
        fp8.check_fp8_storage(name, x, layout)
        kv_scale = fp8.check_kv_scale(kv_scale, layout)
    elif len(shape) != 3 or shape[2] != D_QK:
        raise ValueError(f"{name}: expected shape [*, *, {D_QK}] (512 latent + 64 rope), got {list(shape)}")
    if layout is None and dt not in IO_DTYPES:
        raise TypeError(f"{name}: expected dtype bfloat16, float16 or float32 (or float8_e4m3fn "
                        f"/ uint8 with kv_scale or fp8_layout), got {dt}")
    if not last_axis_contiguous(x):
        # The kernels copy a cache row as one run of bytes from its start.
        raise ValueError(f"{name}: its rows (the last axis, {shape[2]} values) must be "
                         f"contiguous in memory; got a device array whose last axis is strided")
    return shape, layout, kv_scale


def _host_int32(name, x, ndim):
    """Validated host int32 copy of a small integer array (lengths, block table)."""
    if not is_array(x):
        raise TypeError(f"{name}: expected an integer array, got {type(x).__name__}")
    dt = dtype_of(x)
    if dt is None or dt.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array (int32, or any integer dtype on "
                        f"the host), got dtype {dt}")
    if is_device(x) and dt != np.int32:
        raise TypeError(f"{name}: a device array must have dtype int32, got {dt}")
    if len(shape_of(x)) != ndim:
        raise ValueError(f"{name}: expected {ndim} dimension(s), got shape {list(shape_of(x))}")
    h = np.asarray(to_host(x))
    if h.size and h.dtype != np.int32 and (h.min() < np.iinfo(np.int32).min
                                           or h.max() > np.iinfo(np.int32).max):
        raise ValueError(f"{name}: values do not fit int32")
    return np.ascontiguousarray(h, dtype=np.int32)


def to_device_like(like, host):
    """A device copy of a small host array, made the way ``like``'s kind allows: for torch
    tensors by torch's caching allocator (no cudaMalloc a step) from pinned memory, so the copy
    is enqueued on the current stream (the one the kernels run on) and the call returns at
    once (a pageable copy would wait for the GPU to drain first; torch keeps the pinned block
    until the copy is done); else by Numba."""
    if is_torch(like):
        import torch

        h = torch.from_numpy(np.ascontiguousarray(host))
        if like.is_cuda:
            h = h.pin_memory()
        return h.to(like.device, non_blocking=True)
    from numba import cuda

    return cuda.to_device(host)


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


def _readable_pages(bt, num_pages):
    """Per sequence, how many leading block-table entries name a page in [0, num_pages)."""
    ok = (bt >= 0) & (bt < num_pages)
    return np.where(ok.all(axis=1), bt.shape[1], np.argmin(ok, axis=1))


def _check_pages(bt, lengths, page_size, num_pages, readable):
    """Every block-table entry a sequence reads (its first ceil(length / page_size)) names a
    page in [0, num_pages) (``readable``: ``_readable_pages(bt, num_pages)``); the others may
    hold anything."""
    # Pages each sequence reads (int64: a length near 2^31 plus page_size - 1 overflows int32)
    used = (lengths.astype(np.int64) + page_size - 1) // page_size
    bad = np.flatnonzero(used > readable)
    if bad.size:  # the first sequence that reads a bad entry, and its first bad entry
        b = int(bad[0])
        j = int(readable[b])
        raise ValueError(
            f"block_table: block_table[{b}, {j}] = {bt[b, j]} is outside [0, {num_pages}) "
            f"(page {j} of sequence {b} holds tokens it uses)"
        )


class KVCache:
    """Common interface. ``storage`` is 3-D ``[pages, page_size, 576]``; ``lengths_host`` int32.

    The values of lengths and block table are checked once, when the cache is built (device
    arrays are copied to the host for it, once); later calls use those host copies. Changing
    a device array's values in place afterwards is allowed (a decode loop may bump lengths in
    place): the kernels clamp every length to the capacity and every page index to the
    pages, so no value makes them read outside the arrays (see README, "Bad input"). The
    split-K heuristic then still sees the lengths of construction time; ``with_lengths``
    makes a new cache over the same storage at host cost only."""

    kind: Optional[str] = None
    storage: Any
    lengths: Any
    lengths_host: np.ndarray
    block_table: Any
    page_size: int
    fp8_layout: Optional[str] = None  # FP8 storage: "e4m3" (per-tensor scale) or "v32"
    kv_scale: Optional[float] = None  # the "e4m3" layout's per-tensor scale

    def _finish(self, arrays_key=None):
        """What every call reads of the cache, computed once: the layout key of its arrays
        (plans.py) and the device copies of host lengths / block table (made on first use).
        ``arrays_key``: the key's part for storage and block table, when the caller has it
        (``with_lengths``: the same arrays)."""
        from .plans import layout

        self._device = {}
        self._memo = {}
        self._plans = {}  # api._call_key -> (generation, weakref to the plan): plans.kept
        if arrays_key is None:
            arrays_key = (self.kind, self.page_size, layout(self.storage),
                          layout(self.block_table) if is_device(self.block_table) else
                          ("host", getattr(self, "block_table_host", np.empty(0)).shape))
        self._arrays_key = arrays_key
        self.layout_key = arrays_key + (layout(self.lengths) if is_device(self.lengths)
                                        else "host",)
        if self.fp8_layout:  # (the scale is a kernel argument: plans differ by it)
            self.layout_key += ((self.fp8_layout, self.kv_scale),)

    def _device_copy(self, name, given, host):
        if is_device(given):
            return given
        d = self._device.get(name)
        if d is None:
            d = self._device[name] = to_device_like(self.storage, host)
        return d

    def device_lengths(self):
        """The lengths the kernels read: the caller's device array, or a device copy of host
        lengths made once."""
        return self._device_copy("lengths", self.lengths, self.lengths_host)

    def device_block_table(self):
        return self._device_copy("block_table", self.block_table, self.block_table_host)

    def aligned16(self):
        """Whether the storage starts 16-byte aligned (device storage; once per object)."""
        from .plans import aligned16

        return self.memo("aligned16", lambda: aligned16(self.storage))

    def memo(self, key, compute):
        """A value derived from this cache's (immutable) host copies, computed once per key."""
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = compute()
        return v

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

    def _stored_rows(self, b: int, n: int) -> np.ndarray:
        raise NotImplementedError

    def rows(self, b: int, n: int) -> np.ndarray:
        """NumPy [n, 576] copy of tokens 0..n-1 of sequence b (host path, for the reference):
        for FP8 storage their exact values in float64 (fp8.dequantize)."""
        r = self._stored_rows(b, n)
        return fp8.dequantize(r, self.fp8_layout, self.kv_scale) if self.fp8_layout else r

    def with_lengths(self, lengths):
        """The same storage (and block table) with new lengths: the fast way to advance a decode
        step (the block table is not checked again; lengths are, on the host)."""
        raise NotImplementedError

    @staticmethod
    def device_locate():
        raise NotImplementedError

    def _fp8_repr(self):
        if not self.fp8_layout:
            return ""
        return (f" fp8 {self.fp8_layout}" + (f" kv_scale={self.kv_scale:g}"
                                            if self.kv_scale is not None else ""))


class ContiguousKVCache(KVCache):
    """``kv [B, S_max, 576]``: token t of sequence b at ``kv[b, t]``."""

    kind = "contiguous"

    def __init__(self, kv: Any, lengths: Any, *, kv_scale: Optional[float] = None,
                 fp8_layout: Optional[str] = None):
        shape, self.fp8_layout, self.kv_scale = _check_storage("kv", kv, kv_scale, fp8_layout)
        self.storage = self.kv = kv
        self.lengths_host = check_lengths(lengths, shape[0], shape[1])
        self.lengths = lengths if is_device(lengths) else self.lengths_host
        self.block_table = None
        self.page_size = shape[1]
        self._finish()

    def with_lengths(self, lengths):
        return ContiguousKVCache(self.storage, lengths, kv_scale=self.kv_scale,
                                 fp8_layout=self.fp8_layout)

    @property
    def capacity(self):
        return shape_of(self.storage)[1]

    def _stored_rows(self, b, n):
        return np.asarray(to_host(self.storage)[b, :n])

    @staticmethod
    def device_locate():
        from numba import cuda  # here, not at the top: the reference builds caches without Numba

        @cuda.jit(device=True)
        def locate(block_table, page_size, npages, b, t):
            # t is clamped to the capacity (page_size here): a length raised past it in
            # device memory after the checks reads a wrong row, never outside kv
            return b, min(t, page_size - 1)

        return locate

    def __repr__(self):
        return (f"ContiguousKVCache(kv {list(shape_of(self.storage))} {self.dtype}"
                f"{self._fp8_repr()}, B={self.batch})")


class PagedKVCache(KVCache):
    """``pages [P, page_size, 576]``, ``block_table [B, max_pages] int32``: token t of
    sequence b at ``pages[block_table[b, t // page_size], t % page_size]``. Entries past a
    sequence's last used page are never read (and may hold anything)."""

    kind = "paged"

    def __init__(self, pages: Any, block_table: Any, lengths: Any, *,
                 kv_scale: Optional[float] = None, fp8_layout: Optional[str] = None):
        if is_array(pages) and len(shape_of(pages)) == 3 and shape_of(pages)[1] <= 0:
            raise ValueError(f"page_size: expected a positive page size (pages.shape[1]), got {shape_of(pages)[1]}")
        shape, self.fp8_layout, self.kv_scale = _check_storage("pages", pages, kv_scale,
                                                               fp8_layout)
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
        # (kept: a new length is checked against it, not the whole table again: with_lengths)
        self._readable_pages = _readable_pages(bt, num_pages)
        _check_pages(bt, self.lengths_host, page_size, num_pages, self._readable_pages)
        self._finish()

    def with_lengths(self, lengths):
        new = object.__new__(type(self))  # (a shard's cache class keeps its position map)
        new.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("_memo", "_device")})
        new.lengths_host = check_lengths(lengths, self.batch, self.capacity)
        new.lengths = lengths if is_device(lengths) else new.lengths_host
        _check_pages(self.block_table_host, new.lengths_host, self.page_size, self.num_pages,
                     self._readable_pages)
        new._finish(self._arrays_key)  # (the same storage and table: only the lengths' part)
        if "block_table" in self._device:  # the device copy of a host block table is shared
            new._device["block_table"] = self._device["block_table"]
        return new

    @property
    def capacity(self):
        return self.block_table_host.shape[1] * self.page_size

    def _stored_rows(self, b, n):
        pages = to_host(self.storage)
        t = np.arange(n)
        return np.asarray(pages[self.block_table_host[b, t // self.page_size], t % self.page_size])

    @staticmethod
    def device_locate():
        from numba import cuda  # here, not at the top: the reference builds caches without Numba

        from numba import int32, uint32

        from .ptx import divmod_u32

        @cuda.jit(device=True)
        def locate(block_table, page_size, npages, b, t):
            page, slot = divmod_u32(t, page_size)
            # Clamped, so that values changed in device memory after the checks (a length past
            # the capacity, a page outside [0, npages)) read a wrong row, never outside arrays
            # (as unsigned, a negative page is past the last: one comparison for both ends)
            page = min(uint32(page), uint32(block_table.shape[1] - 1))
            return int32(min(uint32(block_table[b, page]), uint32(npages - 1))), slot

        return locate

    def __repr__(self):
        return (
            f"PagedKVCache(pages {list(shape_of(self.storage))} {self.dtype}{self._fp8_repr()}, "
            f"block_table {list(self.block_table_host.shape)}, B={self.batch})"
        )


def host_offsets(name, offsets, rows):
    """Validated host int32 copy of ``B+1`` row offsets into ``rows`` rows: int32 or uint32
    (MAX's dtype; on the device too), non-decreasing, from >= 0 to <= rows, each below 2^31."""
    if not is_array(offsets):
        raise TypeError(f"{name}: expected an integer array, got {type(offsets).__name__}")
    dt = dtype_of(offsets)
    if is_device(offsets) and dt not in (np.dtype(np.int32), np.dtype(np.uint32)):
        raise TypeError(f"{name}: a device array must have dtype int32 or uint32, got {dt}")
    if is_device(offsets):  # read once, as every check does (uint32 is not a kernel's type)
        offsets = np.asarray(to_host(offsets))
    off = _host_int32(name, offsets, 1)
    if off.shape[0] < 1:
        raise ValueError(f"{name}: expected B+1 >= 1 offsets, got shape {list(off.shape)}")
    steps = np.diff(off)
    if steps.size and steps.min() < 0:
        b = int(np.argmin(steps))
        raise ValueError(f"{name}: expected non-decreasing offsets, got {name}[{b}] = "
                         f"{off[b]} then {name}[{b + 1}] = {off[b + 1]}")
    if off[0] < 0 or off[-1] > rows:
        raise ValueError(f"{name}: expected offsets within [0, {rows}] (the tensor's rows), "
                         f"got {off[0]} .. {off[-1]}")
    return off


class RaggedKVCache(KVCache):
    """``rows [R, 576]`` (or MAX's ``[R, 1, 576]``), ``row_offsets [B+1]`` int32 or uint32:
    all sequences' rows back to back, token t of sequence b at ``rows[row_offsets[b] + t]``.
    A sequence holds ``row_offsets[b+1] - row_offsets[b]`` tokens (its capacity), and its
    length is that unless ``lengths`` says fewer. Rows between the runs are never read.

    On the device it is a one-page cache: storage ``[1, R, 576]`` (a view of ``rows``), and
    the offsets, an int32 ``[B+1, 1]`` copy, travel in the block table's place; ``locate``
    returns (0, offset + t), clamped into the rows."""

    kind = "ragged"

    def __init__(self, rows, row_offsets, lengths=None):
        if is_array(rows) and len(shape_of(rows)) == 3 and shape_of(rows)[1] == 1:
            rows = rows.reshape((shape_of(rows)[0], D_QK))  # MAX's [R, 1, 576]
        if not is_array(rows):
            raise TypeError(f"rows: expected an array, got {type(rows).__name__}")
        if len(shape_of(rows)) != 2 or shape_of(rows)[1] != D_QK:
            raise ValueError(f"rows: expected shape [R, {D_QK}] or [R, 1, {D_QK}], got "
                             f"{list(shape_of(rows))}")
        R = shape_of(rows)[0]
        try:  # a view, never a copy: the kernels read the caller's memory
            storage = rows.reshape((1, R, D_QK))
        except (NotImplementedError, ValueError, RuntimeError):
            raise ValueError("rows: expected a C-contiguous array (its rows back to back)")
        _check_storage("rows", storage)
        self.rows_array = rows
        self.storage = storage
        self.row_offsets = row_offsets
        self.offsets_host = host_offsets("row_offsets", row_offsets, R)
        self.runs = np.diff(self.offsets_host)  # tokens each sequence can hold
        # The block table's place: [B+1, 1] int32 (2-D, as the kernels' block table)
        self.block_table_host = np.ascontiguousarray(self.offsets_host[:, None])
        self.block_table = self.block_table_host
        self.page_size = max(R, 1)
        self.num_pages = 1
        self._set_lengths(lengths)
        self._finish()

    def _set_lengths(self, lengths):
        batch = self.runs.shape[0]
        if lengths is None:
            self.lengths_host = self.runs.astype(np.int32)
        else:
            self.lengths_host = check_lengths(lengths, batch, self.capacity)
            over = np.nonzero(self.lengths_host > self.runs)[0]
            if over.size:
                b = int(over[0])
                raise ValueError(f"lengths: lengths[{b}] = {self.lengths_host[b]} exceeds "
                                 f"sequence {b}'s {self.runs[b]} rows (row_offsets)")
        self.lengths = (lengths if lengths is not None and is_device(lengths)
                        else self.lengths_host)

    def with_lengths(self, lengths):
        new = object.__new__(RaggedKVCache)
        new.__dict__.update({k: v for k, v in self.__dict__.items()
                             if k not in ("_memo", "_device")})
        new._set_lengths(lengths)
        new._finish()
        if "block_table" in self._device:  # the offsets' device copy is shared
            new._device["block_table"] = self._device["block_table"]
        return new

    @property
    def capacity(self):
        return int(self.runs.max(initial=0))

    def rows(self, b, n):
        o = int(self.offsets_host[b])
        return np.asarray(to_host(self.rows_array)[o:o + n])

    @staticmethod
    def device_locate():
        from numba import cuda  # here, not at the top: the reference builds caches without Numba

        @cuda.jit(device=True)
        def locate(block_table, page_size, npages, b, t):
            # The offset and the row are clamped (page_size is the row count R here), so that
            # values changed in device memory after the checks read a wrong row, never
            # outside the rows
            off = max(block_table[min(b, block_table.shape[0] - 1), 0], 0)
            return 0, min(off + t, page_size - 1)

        return locate

    def __repr__(self):
        return (f"RaggedKVCache(rows {list(shape_of(self.rows_array))} {self.dtype}, "
                f"B={self.batch})")
