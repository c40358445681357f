"""Random MLA decode problems and accuracy checks, shared by the tests, ``numba-mla validate``
and the benchmark.

Problems are adversarial by construction: fresh random data (never zeros), NaN in
every cache slot at or past a sequence's length and in every page no sequence uses, a shuffled
block table whose unused entries hold a huge out-of-range page index, and NaN in the parts of a
materialized bias that no valid (query, key) pair reads. Any out-of-bounds read then shows up
in the result.
"""
from dataclasses import dataclass, replace
from typing import List, Optional

import ml_dtypes
import numpy as np

import numba_mla as nm

BF16 = np.dtype(ml_dtypes.bfloat16)
#: Storage dtypes by short id (for readable parametrize ids).
DTYPES = {"bf16": BF16, "fp16": np.dtype(np.float16), "fp32": np.dtype(np.float32)}
#: Block-table entry for a page a sequence never reads: far outside [0, P), fits int32.
UNUSED_PAGE = 2**30
#: DeepSeek V3's softmax scale (mscale^2 / sqrt(192)).
DEEPSEEK_SCALE = 0.1352
D_QK, D_V = 576, 512


# ---------------------------------------------------------------------------------------------
# Problems
# ---------------------------------------------------------------------------------------------
@dataclass
class Problem:
    """One random decode call. ``keys[b]`` is the ground truth for sequence b: its
    ``lengths[b]`` valid rows in the storage dtype, written before the cache was laid out, so
    a check built on it does not depend on the cache's own addressing."""

    q: np.ndarray                      # [B, Sq, H, 576] padded, or [T, H, 576] ragged
    q_offsets: Optional[np.ndarray]    # ragged: [B+1] int32 row offsets; padded: None
    cache: nm.KVCache
    lengths: np.ndarray                # [B] int32
    keys: List[np.ndarray]             # keys[b]: [lengths[b], 576] in the storage dtype
    scale: float
    dtype: np.dtype
    cache_kind: str
    page_size: int

    @property
    def ragged(self):
        return self.q_offsets is not None

    @property
    def batch(self):
        return len(self.lengths)

    @property
    def heads(self):
        return self.q.shape[-2]

    @property
    def counts(self):
        """Query rows per sequence, [B]."""
        if self.ragged:
            return np.diff(self.q_offsets)
        return np.full(self.batch, self.q.shape[1], np.int64)

    @property
    def sq(self):
        """The Sq axis of per-query arrays (a bias): Sq, or the largest row count if ragged."""
        return int(self.counts.max()) if self.batch else 0

    @property
    def out_shape(self):
        return self.q.shape[:-1] + (D_V,)

    @property
    def lse_shape(self):
        return self.q.shape[:-1]

    def rows_of(self, b):
        """(index of the first row, row count) of sequence b, in the flat row order of q
        reshaped to [rows, H, 576]."""
        n = int(self.counts[b])
        return (int(self.q_offsets[b]) if self.ragged else b * n), n

    def q_of(self, b):
        """[n, H, 576] the query rows of sequence b."""
        if self.ragged:
            return self.q[self.q_offsets[b]:self.q_offsets[b + 1]]
        return self.q[b]

    def flat(self, x):
        """A per-query array ([B, Sq, H, ...] or [T, H, ...]) as [rows, H, ...]."""
        x = np.asarray(x)
        return x if self.ragged else x.reshape((-1,) + x.shape[2:])

    def run(self, api, **kwargs):
        """Call ``api.mla_decode`` or ``api.mla_decode_ragged`` (``api`` is ``numba_mla`` or
        ``numba_mla.reference``) on this problem."""
        kwargs.setdefault("scale", self.scale)
        if self.ragged:
            return api.mla_decode_ragged(self.q, self.q_offsets, self.cache, **kwargs)
        return api.mla_decode(self.q, self.cache, **kwargs)

    def warp_split_plan(self, mask=None, score_mod=None, num_partitions=None, out=None,
                        backend="auto"):
        """The ``launch.Plan`` of this problem's call with ``decoding_warp_split_k`` set
        (``backend``: the one the call names), not launched: its ``spec`` says which warp
        split-K kernel runs, ``launch()`` and ``result()`` give ``(out, lse)``."""
        from . import checks, launch

        args = (self.cache, self.scale, mask, score_mod, num_partitions, True, out, backend)
        call = (checks.check_ragged(self.q, self.q_offsets, *args) if self.ragged
                else checks.check_decode(self.q, *args))
        call.warp_split_k = True
        return launch.Plan(call)


def with_fp8_cache(p, layout, kv_scale=None):
    """``p`` with its cache's rows quantized into the FP8 ``layout`` (fp8.quantize_host, the
    given ``kv_scale`` or its own), the same kind of cache over the same pages; NaN slots stay
    NaN codes."""
    from . import fp8

    codes, kv_scale = fp8.quantize_host(p.cache.storage, layout, kv_scale)
    kw = dict(kv_scale=kv_scale, fp8_layout=layout)
    if p.cache_kind == "contiguous":
        return replace(p, cache=nm.ContiguousKVCache(codes, p.lengths, **kw))
    return replace(p, cache=nm.PagedKVCache(codes, p.cache.block_table_host, p.lengths, **kw))


def random_lengths(rng, B, Sq, max_len, *, zero=True):
    """B valid lengths (0, or Sq..max_len): includes Sq itself and (if ``zero`` and B > 1) 0,
    so the edge cases are always present."""
    lo = max(Sq, 1)
    lengths = rng.integers(lo, max(max_len, lo) + 1, size=B)
    edge = [lo] + ([0] if zero else [])
    for j, v in enumerate(edge[:B]):
        lengths[j] = v
    return rng.permutation(lengths).astype(np.int32)


def random_counts(rng, lengths, max_rows=8):
    """Ragged query-row counts, one per sequence: 0..max_rows, never more than a nonzero
    length (the SPEC's 'not 0 < length < rows' rule)."""
    counts = []
    for L in lengths:
        hi = max_rows if L == 0 else min(max_rows, int(L))
        counts.append(int(rng.integers(0, hi + 1)))
    return np.array(counts, np.int64)


@dataclass
class PagedLayout:
    """Where a paged cache's sequences live: ``block_table`` [B, max_pages] int32 (entries past
    a sequence's pages hold ``UNUSED_PAGE``), ``used[b]`` pages of sequence b, ``spare`` the
    page ids no sequence reads, out of ``num_pages``."""

    block_table: np.ndarray
    used: np.ndarray
    spare: np.ndarray
    num_pages: int

    def tails(self, lengths, page_size):
        """(page, first unused slot) of each sequence's partly filled last page."""
        return [(int(self.block_table[b, self.used[b] - 1]), int(L) % page_size)
                for b, L in enumerate(lengths) if self.used[b] and int(L) % page_size]


def paged_layout(rng, lengths, page_size, max_pages, spare_pages=1):
    """The one paged-cache layout of the tests, ``validate`` and the benchmark: each sequence
    gets ceil(length / page_size) pages in a shuffled order (so no kernel can get away with
    assuming page b*k+j), ``spare_pages`` more that no sequence uses (filled with NaN by the
    callers), and ``UNUSED_PAGE`` (far out of range) in every block-table entry past a
    sequence's pages (a read through one faults or shows up as NaN)."""
    lengths = np.asarray(lengths, np.int64)
    used = -(-lengths // page_size)
    if used.size and used.max() > max_pages:
        raise ValueError(f"max_pages: {max_pages} cannot hold {int(used.max())} pages")
    n_used = int(used.sum())
    order = rng.permutation(n_used + spare_pages)            # shuffled physical page ids
    block_table = np.full((len(lengths), max_pages), UNUSED_PAGE, np.int32)
    block_table[np.arange(max_pages)[None, :] < used[:, None]] = order[:n_used]
    return PagedLayout(block_table, used, order[n_used:], n_used + spare_pages)


def randn(rng, shape, dtype):
    """Standard-normal data in ``dtype`` (fresh, never all zeros)."""
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def make_problem(rng, B, Sq, H, lengths, dtype=np.float32, cache_kind="contiguous",
                 page_size=16, *, ragged=False, q_counts=None, capacity=None, spare_pages=2,
                 scale=DEEPSEEK_SCALE, filler=np.nan):
    """A random decode problem.

    B sequences of ``lengths`` tokens, H heads, ``dtype`` in {bfloat16, float16, float32}.
    Padded q is [B, Sq, H, 576]. ``ragged=True`` gives q [T, H, 576] with row offsets [B+1];
    ``q_counts`` sets the rows per sequence (default: random 0..Sq, at most a nonzero length;
    ignored for padded q).
    ``cache_kind`` "contiguous" ([B, capacity, 576]), "paged" (``page_size`` >= 1, pages
    assigned in a shuffled order, ``spare_pages`` extra pages no sequence uses) or "ragged"
    (all rows back to back, filler rows between the runs).
    ``capacity`` defaults to a few tokens past the longest sequence. ``filler`` fills every
    slot no valid key occupies. Lengths are not validated against Sq here, so bad-input tests
    can build refused problems too.
    """
    dtype = np.dtype(dtype)
    lengths = np.asarray(lengths, np.int32)
    assert lengths.shape == (B,), f"lengths must have B = {B} entries"
    max_len = int(lengths.max()) if B else 0
    if capacity is None:
        capacity = max_len + 3
    keys = [randn(rng, (int(L), D_QK), dtype) for L in lengths]

    if cache_kind == "contiguous":
        kv = np.full((B, capacity, D_QK), filler, dtype)
        for b, L in enumerate(lengths):
            kv[b, :L] = keys[b]
        cache = nm.ContiguousKVCache(kv, lengths)
    elif cache_kind == "paged":
        assert page_size >= 1
        layout = paged_layout(rng, lengths, page_size, max(1, -(-capacity // page_size)),
                              spare_pages)
        pages = np.full((layout.num_pages, page_size, D_QK), filler, dtype)
        for b, L in enumerate(lengths):
            for j in range(int(layout.used[b])):
                t0, t1 = j * page_size, min(int(L), (j + 1) * page_size)
                pages[layout.block_table[b, j], :t1 - t0] = keys[b][t0:t1]
        cache = nm.PagedKVCache(pages, layout.block_table, lengths)
    elif cache_kind == "ragged":
        # Runs back to back with 1-3 filler rows before each (NaN by default): a read past a
        # run's end or before its start lands on filler
        gaps = rng.integers(1, 4, B + 1)
        starts = np.cumsum(gaps[:B]) + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        rows = np.full((int(lengths.sum() + gaps.sum()), D_QK), filler, dtype)
        for b, L in enumerate(lengths):
            rows[starts[b]:starts[b] + L] = keys[b]
        offsets = np.concatenate([starts, [starts[-1] + lengths[-1] if B else 0]])
        # Each run ends at the next one's start (its filler rows are in it, past the length)
        cache = nm.RaggedKVCache(rows, offsets.astype(np.int32), lengths)
    else:
        raise ValueError(f"cache_kind: expected 'contiguous', 'paged' or 'ragged', got "
                         f"{cache_kind!r}")

    if ragged:
        counts = random_counts(rng, lengths, Sq) if q_counts is None else np.asarray(q_counts)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        q = randn(rng, (int(offsets[-1]), H, D_QK), dtype)
    else:
        offsets = None
        q = randn(rng, (B, Sq, H, D_QK), dtype)
    return Problem(q, offsets, cache, lengths, keys, float(scale), dtype, cache_kind,
                   page_size if cache_kind == "paged" else capacity)


def make_bias(rng, p, per_head, drop=0.25, filler=np.nan):
    """A float32 materialized bias for problem ``p``: [B, Sq, S] or [B, H, Sq, S] with
    S = longest length + 2. Random finite values, about ``drop`` of them -inf, one query row
    of every sequence with keys dropped entirely (an empty row), and ``filler`` wherever no
    valid (query, key) pair reads (keys at or past the length, rows past a sequence's count)."""
    B, H, sq = p.batch, p.heads, p.sq
    S = (int(p.lengths.max()) if B else 0) + 2
    shape = (B, H, sq, S) if per_head else (B, sq, S)
    bias = rng.standard_normal(shape).astype(np.float32)
    bias[rng.random(shape) < drop] = -np.inf
    view = bias if per_head else bias[:, None]           # [B, H or 1, Sq, S]
    for b in range(B):
        n, L = int(p.counts[b]), int(p.lengths[b])
        if n:
            row = int(rng.integers(0, n))
            view[b, int(rng.integers(0, view.shape[1])), row, :] = -np.inf
        view[b, :, :, L:] = filler
        view[b, :, n:, :] = filler
    return bias


# ---------------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------------
def f64(x):
    return np.asarray(x).astype(np.float64)


def assert_same_nonfinite(actual, expected, what="result"):
    """NaN and +-inf must sit at exactly the same positions (with the same sign)."""
    a, e = f64(actual), f64(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    for name, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        bad = np.argwhere(test(a) != test(e))
        assert not bad.size, f"{what}: {name} positions differ, first at {tuple(bad[0])}"


def assert_close(actual, expected, rtol, atol, what="result"):
    """Non-finite positions identical; finite values within ``atol + rtol * |expected|``."""
    assert_same_nonfinite(actual, expected, what)
    a, e = f64(actual), f64(expected)
    fin = np.isfinite(e)
    err = np.abs(a[fin] - e[fin]) - rtol * np.abs(e[fin])
    if err.size and err.max() > atol:
        j = int(np.argmax(err))
        idx = tuple(np.argwhere(fin)[j])
        raise AssertionError(
            f"{what}: |actual - expected| too large at {idx}: actual {a[idx]!r}, "
            f"expected {e[idx]!r} (rtol {rtol}, atol {atol})"
        )


#: Float32 ulps of the three-way check's floor, per backend. FMA: a 576-term float32 dot
#: product summed in the kernel's order (sequential FMAs per warp, then 8 partial sums) and in
#: NumPy's (SIMD partial sums) differs by a few ulps of the score, and on a handful of rows the
#: larger of two such errors can exceed twice the smaller by chance. Tensor cores: wgmma adds
#: each 16-wide step's products to its fp32 accumulator truncating, not rounding (measured on
#: the H200: errors of ~18 ulps, all of one sign, on single-key rows), and a score takes 36
#: steps: up to 36 ulps more. A wrong key, mask or scale is off by orders of magnitude more.
#: "simple" is FMA too (two sequential 288-term halves), and so is its warp split-K variant
#: ("warpsplit"), and so is the FMA kernel's ("simt_warpsplit"); "mma_sync" (warp tensor
#: cores) is given the tensor cores' allowance. Keyed by the kernel that ran ("auto" resolved).
FLOOR_ULPS = {"simt": 8, "mma": 8 + 36, "mma_sync": 8 + 36, "simple": 8, "warpsplit": 8,
              "simt_warpsplit": 8, "reference": 8}


def fp32_floor(golden, backend="simt"):
    """The three-way check's absolute floor: ``FLOOR_ULPS[backend]`` float32 units in the last
    place of the largest expected value (at least assert_three_way's 1e-6)."""
    g = f64(golden)
    top = float(np.abs(g[np.isfinite(g)]).max(initial=0.0))
    return max(1e-6, FLOOR_ULPS[backend] * float(np.finfo(np.float32).eps) * top)


def assert_three_way(actual, same_precision, golden, factor=2.0, floor=1e-6, what="out"):
    """The three-way check: ``actual``'s max error against the float64 ``golden`` may
    be at most ``factor`` times that of a same-precision reference (``reference.mla_decode``
    with ``compute_dtype=np.float32``, rounded to the output's dtype), plus ``floor``.
    Non-finite positions must match exactly."""
    assert_same_nonfinite(actual, golden, what)
    assert_same_nonfinite(same_precision, golden, what + " (same-precision reference)")
    a, s, g = f64(actual), f64(same_precision), f64(golden)
    fin = np.isfinite(g)
    err = float(np.abs(a[fin] - g[fin]).max(initial=0.0))
    ref_err = float(np.abs(s[fin] - g[fin]).max(initial=0.0))
    assert err <= factor * ref_err + floor, (
        f"{what}: max error {err:.3g} vs float64, more than {factor} x the same-precision "
        f"reference's {ref_err:.3g} + {floor:.1g}"
    )
