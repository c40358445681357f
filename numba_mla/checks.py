"""Input checks shared by every entry point (SPEC.md, "Bad input").

Everything is checked before anything is launched or written: a bad argument raises
``TypeError`` (wrong kind or dtype) or ``ValueError`` (wrong shape or value) whose message
starts with the argument's name and gives the expected and the actual value. The result is a
``Call``: the normalised arguments plus the few host-side facts the kernels need.
"""
import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .arrays import IO_DTYPES, dtype_of, is_array, is_device, is_torch, shape_of, strides_of
from .caches import D_QK, D_V, KVCache, _host_int32
from .constants import MAX_SQ
from .mods import Mask, ScoreMod, as_mask, as_score_mod

BACKENDS = ("auto", "simt", "mma", "mma_sync", "simple", "reference")
_F32_MAX = float(np.finfo(np.float32).max)


@dataclass
class Call:
    q: Any
    cache: KVCache
    scale: float
    mask: Mask
    score_mod: ScoreMod
    num_partitions: Optional[int]
    return_lse: bool
    out: Any
    backend: str
    batch: int
    heads: int
    sq: int  # query rows per sequence (the largest, for ragged calls)
    dtype: np.dtype
    out_shape: tuple
    # Ragged calls: row offsets [B+1] as given, and their checked host int32 copy (None for
    # device offsets a kernel backend reads unread: check_ragged); None for padded q.
    q_offsets: Optional[Any] = None
    q_offsets_host: Optional[np.ndarray] = None
    # flare_mla_decoding's tuning (config.MHAConfig) and warp split-K; selector.py reads them
    config: Optional[Any] = None
    warp_split_k: bool = False

    @property
    def ragged(self):
        return self.q_offsets is not None

    def rows_of(self, b):
        """(first row, row count) of sequence b's queries."""
        if self.ragged:
            o = self.q_offsets_host
            return int(o[b]), int(o[b + 1] - o[b])
        return 0, self.sq


def _check_q_dtype(q, cache):
    dt = dtype_of(q)
    if cache.fp8_layout:  # FP8 storage: q (and out) bfloat16 or float16
        if dt not in IO_DTYPES[:2]:
            raise TypeError(f"q: an FP8 cache needs q in bfloat16 or float16, got {dt}")
        return dt
    if dt not in IO_DTYPES:
        raise TypeError(f"q: expected dtype bfloat16, float16 or float32, got {dt}")
    if dt != cache.dtype:
        raise TypeError(f"q: dtype {dt} does not match the cache's dtype {cache.dtype}")
    return dt


def _check_common(cache, scale, mask, score_mod, num_partitions, return_lse, backend):
    if not isinstance(cache, KVCache):
        raise TypeError(
            f"cache: expected a ContiguousKVCache, PagedKVCache or RaggedKVCache, got "
            f"{type(cache).__name__}"
        )
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale: expected a float, got {type(scale).__name__}")
    try:
        scale_f = float(scale)
    except OverflowError:  # an int beyond float64's range
        scale_f = math.inf
    # The kernels multiply in float32: a scale that float32 cannot hold is not finite there.
    if not math.isfinite(scale_f) or abs(scale_f) > _F32_MAX:
        raise ValueError(f"scale: expected a finite float (|scale| <= {_F32_MAX:.4g}, float32), "
                         f"got {scale}")
    if num_partitions is not None:
        if isinstance(num_partitions, bool) or not isinstance(num_partitions, (int, np.integer)):
            raise TypeError(f"num_partitions: expected None or an int, got {type(num_partitions).__name__}")
        if num_partitions < 1:
            raise ValueError(f"num_partitions: expected a positive int, got {num_partitions}")
        num_partitions = int(num_partitions)
    if not isinstance(return_lse, (bool, np.bool_)):
        raise TypeError(f"return_lse: expected a bool, got {type(return_lse).__name__}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    return scale_f, as_mask(mask), as_score_mod(score_mod), num_partitions, bool(return_lse)


def _check_lengths_vs_rows(cache, counts, name="lengths"):
    """SPEC: a sequence with keys must hold its own query tokens: not 0 < length < Sq.
    ``name``: the caller's argument that gave the lengths."""
    lh = cache.lengths_host
    bad = np.nonzero((lh > 0) & (lh < counts))[0]
    if bad.size:
        b = int(bad[0])
        raise ValueError(
            f"{name}: {name}[{b}] = {lh[b]} is smaller than its {int(np.broadcast_to(counts, lh.shape)[b])} "
            f"query tokens (each query's own token is in the cache)"
        )


def _check_bias(mask, batch, heads, sq, cache):
    bias = mask.bias_array()
    if bias is None:
        return
    shape = shape_of(bias)
    need_s = int(cache.lengths_host.max()) if cache.batch else 0
    lead = (batch, heads, sq) if len(shape) == 4 else (batch, sq)
    names = "[B, H, Sq, S]" if len(shape) == 4 else "[B, Sq, S]"
    if shape[:-1] != lead or shape[-1] < need_s:
        raise ValueError(
            f"bias: expected shape {names} = [{', '.join(map(str, lead))}, S >= {need_s}], got {list(shape)}"
        )


def _check_out(out, q, shape, dtype, name):
    if out is None:
        return
    if not is_array(out):
        raise TypeError(f"{name}: expected an array, got {type(out).__name__}")
    if shape_of(out) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(shape_of(out))}")
    if dtype_of(out) != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {dtype_of(out)}")
    if is_device(out) != is_device(q):
        where = "device" if is_device(q) else "host"
        raise TypeError(f"{name}: expected a {where} array like q, got a "
                        f"{'device' if is_device(out) else 'host'} array")
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError(f"{name}: expected a writable array, got a read-only one")
    if is_device(out):
        # The kernels write [T, H, 512] rows in place: a strided view would be reshaped into a
        # copy (torch) or refused by the launcher (Numba), and the caller's array left unwritten.
        cai = None if is_torch(out) else getattr(out, "__cuda_array_interface__", None)
        if cai is not None and len(cai.get("data") or ()) > 1 and cai["data"][1]:
            raise ValueError(f"{name}: expected a writable array, got a read-only one")
        if not _c_contiguous(out):
            raise ValueError(f"{name}: expected a C-contiguous device array, got strides "
                             f"{strides_of(out)} for shape {list(shape)}")


def _c_contiguous(x):
    """Whether a device array is C-contiguous (axes of length 1 may have any stride)."""
    if is_torch(x):
        return bool(x.is_contiguous())
    strides = strides_of(x)
    if strides is None:
        return True
    step = dtype_of(x).itemsize
    for n, s in zip(reversed(shape_of(x)), reversed(strides)):
        if n > 1 and s != step:
            return False
        step *= n
    return True


def _check_q_shape(q, leading):
    """q's shape, checked to be [*leading, H, 576] with H >= 1 (``leading``: the names of the
    axes before H, for the messages)."""
    if not is_array(q):
        raise TypeError(f"q: expected an array, got {type(q).__name__}")
    shape = shape_of(q)
    if len(shape) != len(leading) + 2 or shape[-1] != D_QK:
        names = ", ".join((*leading, "H", str(D_QK)))
        raise ValueError(f"q: expected shape [{names}], got {list(shape)}")
    if shape[-2] < 1:
        raise ValueError(f"q: expected at least one head, got H = {shape[-2]}")
    return shape


def check_decode(q, cache, scale, mask=None, score_mod=None, num_partitions=None,
                 return_lse=False, out=None, backend="auto", out_name="out", lengths_name="lengths"):
    """Checks for ``mla_decode``: q ``[B, Sq, H, 576]``. ``out_name``, ``lengths_name``: what
    the caller calls ``out`` and the lengths (``flare_mla_decoding`` says ``output``, and
    ``valid_length`` for the lengths it was given with an array ``k``)."""
    scale, mask, score_mod, num_partitions, return_lse = _check_common(
        cache, scale, mask, score_mod, num_partitions, return_lse, backend)
    batch, sq, heads, _ = _check_q_shape(q, ("B", "Sq"))
    if batch != cache.batch:
        raise ValueError(f"q: batch size {batch} does not match the cache's {cache.batch} sequences")
    if not 1 <= sq <= MAX_SQ:
        raise ValueError(f"q: expected 1 <= Sq <= {MAX_SQ} query tokens per sequence, got Sq = {sq}")
    dtype = _check_q_dtype(q, cache)
    _check_lengths_vs_rows(cache, sq, lengths_name)
    score_mod.check_heads(heads)
    _check_bias(mask, batch, heads, sq, cache)
    out_shape = (batch, sq, heads, D_V)
    _check_out(out, q, out_shape, dtype, out_name)
    return Call(q, cache, scale, mask, score_mod, num_partitions, return_lse, out, backend,
                batch, heads, sq, dtype, out_shape)


def _unread_offsets(offsets, backend, mask):
    """Whether a ragged call's row offsets stay unread: int32 offsets in device memory, for a
    kernel backend, without a materialized bias (whose rows the host checks against the
    sequences' row counts). Reading them would wait for the GPU on every call; a first kernel
    clamps them instead (kernels/offsets.py)."""
    return (is_array(offsets) and is_device(offsets) and dtype_of(offsets) == np.int32
            and backend != "reference" and mask.bias_array() is None)


def check_ragged(q, q_row_offsets, cache, scale, mask=None, score_mod=None, num_partitions=None,
                 return_lse=False, out=None, backend="auto", out_name="out",
                 offsets_name="q_row_offsets", lengths_name="lengths", rows_bound=None):
    """Checks for ``mla_decode_ragged``: q ``[T, H, 576]``, row offsets ``[B+1]``; the names
    as ``check_decode``'s (``flare_mla_decoding`` passes its offsets as ``valid_length``).

    Device int32 offsets (kernel backends, no materialized bias) are checked for shape and
    dtype only, not read: the values' checks (from 0 to T, non-decreasing, at most MAX_SQ
    rows a sequence, lengths at least the rows) do not run, and a first kernel clamps the
    offsets into q's rows (kernels/offsets.py). The call is then planned for ``rows_bound``
    rows a sequence (MAX_SQ, or ``flare_mla_decoding``'s ``q_max_seq_len``)."""
    scale, mask, score_mod, num_partitions, return_lse = _check_common(
        cache, scale, mask, score_mod, num_partitions, return_lse, backend)
    rows, heads, _ = _check_q_shape(q, ("T",))
    batch = cache.batch
    if _unread_offsets(q_row_offsets, backend, mask):
        shape = shape_of(q_row_offsets)
        if shape != (batch + 1,):
            raise ValueError(f"{offsets_name}: expected shape [{batch + 1}] (B+1), got "
                             f"{list(shape)}")
        dtype = _check_q_dtype(q, cache)
        sq = min(MAX_SQ, rows, MAX_SQ if rows_bound is None else rows_bound)
        score_mod.check_heads(heads)
        out_shape = (rows, heads, D_V)
        _check_out(out, q, out_shape, dtype, out_name)
        return Call(q, cache, scale, mask, score_mod, num_partitions, return_lse, out, backend,
                    batch, heads, sq, dtype, out_shape, q_row_offsets, None)
    offs = _host_int32(offsets_name, q_row_offsets, 1)
    if offs.shape[0] != batch + 1:
        raise ValueError(f"{offsets_name}: expected shape [{batch + 1}] (B+1), got {list(offs.shape)}")
    if offs[0] != 0 or offs[-1] != rows:
        raise ValueError(f"{offsets_name}: expected to run from 0 to T = {rows}, got {offs[0]} .. {offs[-1]}")
    counts = np.diff(offs)
    if counts.size and counts.min() < 0:
        b = int(np.argmin(counts))
        raise ValueError(f"{offsets_name}: expected non-decreasing offsets, got {offs[b]} then {offs[b + 1]}")
    if counts.size and counts.max() > MAX_SQ:
        b = int(np.argmax(counts))
        raise ValueError(f"{offsets_name}: sequence {b} has {counts[b]} query rows, more than {MAX_SQ}")
    dtype = _check_q_dtype(q, cache)
    _check_lengths_vs_rows(cache, counts, lengths_name)
    sq = int(counts.max()) if counts.size else 0
    score_mod.check_heads(heads)
    _check_bias(mask, batch, heads, sq, cache)
    out_shape = (rows, heads, D_V)
    _check_out(out, q, out_shape, dtype, out_name)
    return Call(q, cache, scale, mask, score_mod, num_partitions, return_lse, out, backend,
                batch, heads, sq, dtype, out_shape, q_row_offsets, offs)
