"""Bad input (SPEC.md, "Bad input"): every refused argument raises ValueError or TypeError
whose message starts with the argument's name and shows the expected and actual values, before
any backend is chosen (whatever ``backend`` says), and nothing is written to ``out``.

Each entry point is driven through one table: ``mla_decode`` and ``mla_decode_ragged`` with
every backend, ``flare_mla_decoding`` (padded and ragged q) and the reference's two entry
points. A valid base problem is accepted (``test_base_call_is_accepted``; each public entry
point runs the backend it names, a kernel in the simulator without a GPU), so each refusal
below is caused by its one bad argument.
"""
import math
import re
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest

import numba_mla as nm
from helpers import BF16, UNUSED_PAGE, assert_three_way, fp32_floor, make_problem, randn
from numba_mla.factory import dtype_tag
from numba_mla.launch import resolve_backend

BACKENDS = ("auto", "simt", "mma", "simple", "reference")
SENTINEL = 7.0


@dataclass(frozen=True)
class Entry:
    fn: str                         # decode, ragged, flare, flare_ragged, ref_decode, ref_ragged
    backend: Optional[str] = None   # set for the public mla_decode / mla_decode_ragged

    def __str__(self):
        return f"{self.fn}-{self.backend}" if self.backend else self.fn

    @property
    def ragged(self):
        return self.fn.endswith("ragged")

    @property
    def flare(self):
        return self.fn.startswith("flare")


PUBLIC = [Entry(fn, be) for fn in ("decode", "ragged") for be in BACKENDS]
REFERENCE = [Entry("ref_decode"), Entry("ref_ragged")]
FLARE = [Entry("flare"), Entry("flare_ragged")]
ALL = PUBLIC + FLARE + REFERENCE
WITH_OPTIONS = PUBLIC + REFERENCE          # entry points with return_lse / out= / backend
PADDED = [e for e in ALL if not e.ragged]
RAGGED = [e for e in ALL if e.ragged]


def entries(table):
    return pytest.mark.parametrize("entry", table, ids=str)


def invoke(entry, p, out, **kw):
    """Call ``entry`` on problem p, any argument replaced through ``kw``."""
    a = dict(q=p.q, offsets=p.q_offsets, cache=p.cache, scale=p.scale, mask=None,
             score_mod=None, num_partitions=None)
    extra = {k: kw.pop(k) for k in list(kw) if k not in a}
    a.update(kw)
    if entry.flare:
        valid_length = a["offsets"] if entry.ragged else extra.pop("valid_length", None)
        extra.setdefault("use_score_mod", a["score_mod"] is not None)
        return nm.flare_mla_decoding(out, a["q"], a["cache"], a["mask"], a["score_mod"],
                                     valid_length, a["scale"], a["num_partitions"], **extra)
    if entry.backend:
        extra.setdefault("backend", entry.backend)
    api = nm.reference if entry.fn.startswith("ref") else nm
    if entry.ragged:
        return api.mla_decode_ragged(a["q"], a["offsets"], a["cache"], a["scale"], a["mask"],
                                     a["score_mod"], a["num_partitions"], out=out, **extra)
    return api.mla_decode(a["q"], a["cache"], a["scale"], a["mask"], a["score_mod"],
                          a["num_partitions"], out=out, **extra)


def base_problem(rng, entry, lengths=(7, 3), Sq=2, counts=(2, 1), dtype=np.float32):
    """B = 2, H = 2, fp32, paged cache (page size 3); ragged: 2 + 1 query rows."""
    return make_problem(rng, 2, Sq, 2, list(lengths), dtype, "paged", 3, ragged=entry.ragged,
                        q_counts=list(counts))


def sentinel_out(p, shape=None, dtype=None):
    return np.full(shape or p.out_shape, SENTINEL, dtype or p.dtype)


def assert_refused(entry, p, exc, name, *shows, out=None, **kw):
    """The call raises ``exc`` with a message starting with ``name`` and containing each of
    ``shows``; ``out`` (a sentinel-filled array by default) is left unchanged."""
    out = sentinel_out(p) if out is None else out
    before = np.array(out, copy=True) if isinstance(out, np.ndarray) else None
    with pytest.raises(exc, match=rf"^{re.escape(name)}\b") as info:
        invoke(entry, p, out, **kw)
    msg = str(info.value)
    for s in shows:
        assert str(s) in msg, f"the message {msg!r} does not show {s!r}"
    if before is not None:
        np.testing.assert_array_equal(out, before, err_msg="out was written by a refused call")


# ---------------------------------------------------------------------------------------------
# The base call is accepted (so each refusal below is caused by its one bad argument)
# ---------------------------------------------------------------------------------------------
def running(table):
    """Parametrize over ``table`` for a test that runs the call: a public entry point runs the
    backend it names (marked ``kernel`` unless that is the reference); the others run the
    reference."""
    return pytest.mark.parametrize("entry", [
        pytest.param(e, id=str(e),
                     marks=pytest.mark.kernel if e.backend not in (None, "reference") else ())
        for e in table])


def accepted_problem(rng, entry, lengths=(7, 3)):
    """The base problem as a backend takes it: bfloat16 for "mma" (tensor cores take 16-bit
    data only; float32 is refused), float32 elsewhere."""
    return base_problem(rng, entry, lengths, dtype=BF16 if entry.backend == "mma" else np.float32)


def run_accepted(entry, p, out):
    """Call ``entry`` on the valid problem p: with its own backend where it names one, else
    with the reference (``flare_mla_decoding`` and the reference's entry points)."""
    if entry.backend:
        return invoke(entry, p, out)
    return invoke(entry, p, out, backend="reference")


def assert_reference_answer(entry, p, out):
    """``out`` holds the reference's answer: exactly where the reference ran, and within the
    three-way check where a kernel did."""
    want = p.run(nm.reference)
    if entry.backend in (None, "reference"):
        np.testing.assert_array_equal(out, want.astype(p.dtype))
        return
    low = p.run(nm.reference, compute_dtype=np.float32).astype(p.dtype)
    kernel = resolve_backend(entry.backend, dtype_tag(p.dtype))
    assert_three_way(out, low, want, floor=fp32_floor(want, kernel))


@running(ALL)
def test_base_call_is_accepted(entry, rng):
    p = accepted_problem(rng, entry)
    out = sentinel_out(p)
    run_accepted(entry, p, out)
    assert_reference_answer(entry, p, out)


@running(ALL)
def test_zero_length_sequence_is_accepted(entry, rng):
    """length 0 is allowed whatever the query count: its rows give 0."""
    p = accepted_problem(rng, entry, lengths=(0, 3))
    out = sentinel_out(p)
    run_accepted(entry, p, out)
    r0, n = p.rows_of(0)
    assert np.all(p.flat(out)[r0:r0 + n] == 0)
    assert_reference_answer(entry, p, out)


# ---------------------------------------------------------------------------------------------
# q
# ---------------------------------------------------------------------------------------------
@entries(ALL)
def test_q_head_dim(entry, rng):
    p = base_problem(rng, entry)
    assert_refused(entry, p, ValueError, "q", "576", "575", q=p.q[..., :575].copy())


@entries(WITH_OPTIONS)
def test_q_rank(entry, rng):
    p = base_problem(rng, entry)
    bad = p.q[None] if entry.ragged else p.q[0]
    assert_refused(entry, p, ValueError, "q", "576", str(list(bad.shape)), q=bad)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
@entries(ALL)
def test_q_dtype(entry, dtype, rng):
    p = base_problem(rng, entry)
    bad = p.q.astype(dtype if dtype != "bfloat16" else nm.arrays.BF16)
    assert_refused(entry, p, TypeError, "q", dtype, q=bad)


@entries(PADDED)
def test_batch_mismatch(entry, rng):
    p = base_problem(rng, entry)
    assert_refused(entry, p, ValueError, "q", "3", "2", q=np.concatenate([p.q, p.q[:1]]))


@entries(RAGGED)
def test_ragged_batch_mismatch(entry, rng):
    p = base_problem(rng, entry)
    offsets = np.array([0, 2, 3, 3], np.int32)          # B + 2 entries for B = 2
    assert_refused(entry, p, ValueError, "valid_length" if entry.flare else "q_row_offsets",
                   "[3]", "[4]", offsets=offsets)


@pytest.mark.parametrize("Sq", [0, 9])
@entries(PADDED)
def test_query_count_out_of_range(entry, Sq, rng):
    p = base_problem(rng, entry, lengths=(9, 12), Sq=Sq)
    assert_refused(entry, p, ValueError, "q", "8", f"Sq = {Sq}")


@entries(RAGGED)
def test_ragged_query_count_above_8(entry, rng):
    p = base_problem(rng, entry, lengths=(9, 3), counts=(9, 1))
    assert_refused(entry, p, ValueError, "valid_length" if entry.flare else "q_row_offsets",
                   "9", "8")


OFFSETS = {
    "start_1": (np.array([1, 2, 3]), ValueError),
    "end_short": (np.array([0, 2, 2]), ValueError),
    "end_long": (np.array([0, 2, 4]), ValueError),
    "decreasing": (np.array([0, 4, 3]), ValueError),
    "float": (np.array([0.0, 2.0, 3.0]), TypeError),
    "2d": (np.array([[0, 2, 3]]), ValueError),
    "list": ([0, 2, 3], TypeError),
}


@pytest.mark.parametrize("bad", sorted(OFFSETS))
@entries(RAGGED)
def test_ragged_offsets(entry, bad, rng):
    p = base_problem(rng, entry)
    offsets, exc = OFFSETS[bad]
    assert_refused(entry, p, exc, "valid_length" if entry.flare else "q_row_offsets",
                   offsets=offsets)


# ---------------------------------------------------------------------------------------------
# lengths against the query rows: 0 < length < Sq is refused at the call
# ---------------------------------------------------------------------------------------------
@entries(PADDED)
def test_length_below_query_count(entry, rng):
    p = base_problem(rng, entry, lengths=(7, 1))
    assert_refused(entry, p, ValueError, "lengths", "lengths[1] = 1", "2")


@entries(RAGGED)
def test_ragged_length_below_query_count(entry, rng):
    p = base_problem(rng, entry, lengths=(1, 3), counts=(2, 1))
    assert_refused(entry, p, ValueError, "lengths", "lengths[0] = 1", "2")


# ---------------------------------------------------------------------------------------------
# scale, num_partitions, backend, return_lse, out
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale,exc", [(math.nan, ValueError), (math.inf, ValueError),
                                       (-math.inf, ValueError), (np.float32("nan"), ValueError),
                                       ("0.1", TypeError), (None, TypeError), (True, TypeError)],
                         ids=["nan", "inf", "-inf", "f32_nan", "str", "None", "bool"])
@entries(ALL)
def test_scale(entry, scale, exc, rng):
    p = base_problem(rng, entry)
    shows = (str(scale),) if exc is ValueError else ()
    assert_refused(entry, p, exc, "scale", *shows, scale=scale)


@pytest.mark.parametrize("num_partitions,exc", [(0, ValueError), (-2, ValueError),
                                                (2.5, TypeError), (True, TypeError),
                                                ("4", TypeError)],
                         ids=["0", "-2", "float", "bool", "str"])
@entries(ALL)
def test_num_partitions(entry, num_partitions, exc, rng):
    p = base_problem(rng, entry)
    assert_refused(entry, p, exc, "num_partitions", num_partitions=num_partitions)


@pytest.mark.parametrize("backend", ["cuda", "SIMT", None, 1])
@entries([e for e in PUBLIC if e.backend == "auto"])
def test_backend(entry, backend, rng):
    p = base_problem(rng, entry)
    assert_refused(entry, p, ValueError, "backend", repr(backend), backend=backend)


@entries(WITH_OPTIONS)
def test_return_lse(entry, rng):
    p = base_problem(rng, entry)
    assert_refused(entry, p, TypeError, "return_lse", "str", return_lse="yes")


@pytest.mark.parametrize("change", ["heads", "rows", "width", "rank"])
@entries(ALL)
def test_out_shape(entry, change, rng):
    p = base_problem(rng, entry)
    shape = list(p.out_shape)
    if change == "heads":
        shape[-2] += 1
    elif change == "rows":
        shape[0] += 1
    elif change == "width":
        shape[-1] = 576
    else:
        shape = [1] + shape
    out = sentinel_out(p, tuple(shape))
    assert_refused(entry, p, ValueError, "output" if entry.flare else "out",
                   str(list(p.out_shape)), str(shape), out=out)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
@entries(ALL)
def test_out_dtype(entry, dtype, rng):
    p = base_problem(rng, entry)
    assert_refused(entry, p, TypeError, "output" if entry.flare else "out", "float32", dtype,
                   out=sentinel_out(p, dtype=np.dtype(dtype)))


@entries(WITH_OPTIONS)
def test_out_not_an_array(entry, rng):
    p = base_problem(rng, entry)
    assert_refused(entry, p, TypeError, "out", "list", out=[[0.0]])


# ---------------------------------------------------------------------------------------------
# mask, score_mod, bias
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,exc,name", [
    ({"mask": 3}, TypeError, "mask"),
    ({"mask": nm.IdentityScoreMod()}, TypeError, "mask"),
    ({"score_mod": nm.CausalMask()}, TypeError, "score_mod"),
    ({"score_mod": lambda s, b: s}, TypeError, "score_mod"),
    ({"score_mod": nm.AlibiScoreMod(3)}, ValueError, "score_mod"),
], ids=["mask_int", "mask_is_score_mod", "score_mod_is_mask", "score_mod_2_args",
        "alibi_heads"])
@entries(ALL)
def test_mask_and_score_mod(entry, kw, exc, name, rng):
    p = base_problem(rng, entry)
    assert_refused(entry, p, exc, name, **kw)


def test_window_and_chunk_must_be_positive():
    for w in (0, -1):
        with pytest.raises(ValueError, match="^window"):
            nm.SlidingWindowCausalMask(w)
        with pytest.raises(ValueError, match="^chunk"):
            nm.ChunkedMask(w)


BIAS_SHAPES = {  # (B, H, Sq, S) of the base problem -> a wrong bias shape
    "B+1": lambda B, H, Sq, S: (B + 1, Sq, S),
    "Sq+1": lambda B, H, Sq, S: (B, Sq + 1, S),
    "S_short": lambda B, H, Sq, S: (B, Sq, S - 1),
    "H+1": lambda B, H, Sq, S: (B, H + 1, Sq, S),
    "per_head_Sq-1": lambda B, H, Sq, S: (B, H, Sq - 1, S),
}


@pytest.mark.parametrize("bad", sorted(BIAS_SHAPES))
@entries(ALL)
def test_bias_shape(entry, bad, rng):
    p = base_problem(rng, entry)
    shape = BIAS_SHAPES[bad](p.batch, p.heads, p.sq, int(p.lengths.max()))
    bias = rng.standard_normal(shape).astype(np.float32)
    assert_refused(entry, p, ValueError, "bias", str(list(shape)), mask=nm.MaterializedMask(bias))


# ---------------------------------------------------------------------------------------------
# cache
# ---------------------------------------------------------------------------------------------
@entries(WITH_OPTIONS)
def test_cache_not_a_cache(entry, rng):
    p = base_problem(rng, entry)
    assert_refused(entry, p, TypeError, "cache", "ndarray", cache=p.cache.storage)


class _DeviceView:
    """A device array as the CUDA array interface describes it (no memory behind it: the
    check must refuse it from its description alone)."""

    def __init__(self, shape, strides):
        self.shape, self.dtype = shape, np.dtype(np.float32)
        self.__cuda_array_interface__ = dict(shape=shape, strides=strides, typestr="<f4",
                                             data=(0, False), version=3)


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_cache_rows_must_be_contiguous(kind):
    """The kernels copy a cache row as one run of bytes: a device cache whose last axis is
    strided (e.g. every other value of a wider array) is refused when the cache is built."""
    name = "kv" if kind == "contiguous" else "pages"
    lengths = np.array([3, 1], np.int32)

    def build(storage):
        if kind == "contiguous":
            return nm.ContiguousKVCache(storage, lengths)
        return nm.PagedKVCache(storage, np.array([[0], [1]], np.int32), lengths)

    build(_DeviceView((2, 4, 576), None))                              # C-contiguous
    build(_DeviceView((2, 4, 576), (4 * 576 * 4 + 64, 576 * 4, 4)))    # padded rows: fine
    with pytest.raises(ValueError, match=f"^{name}: its rows .* must be contiguous"):
        build(_DeviceView((2, 4, 576), (4 * 1152 * 4, 1152 * 4, 8)))   # every other value


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_cache_head_dim_and_dtype(kind, rng):
    name = "kv" if kind == "contiguous" else "pages"
    lengths = np.array([3, 1], np.int32)
    bt = np.array([[0], [1]], np.int32)

    def build(storage):
        if kind == "contiguous":
            return nm.ContiguousKVCache(storage, lengths)
        return nm.PagedKVCache(storage, bt, lengths)

    good = randn(rng, (2, 4, 576), np.float32)
    build(good)
    for bad, exc, shows in [(good[..., :575], ValueError, ("576", "575")),
                            (good[..., :512], ValueError, ("512",)),
                            (good[None], ValueError, ("576",)),
                            (good.astype(np.float64), TypeError, ("float64",)),
                            (good.astype(np.int32), TypeError, ("int32",)),
                            (good.tolist(), TypeError, ("list",))]:
        with pytest.raises(exc, match=f"^{name}\\b") as info:
            build(bad)
        for s in shows:
            assert s in str(info.value)


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_lengths(kind, rng):
    """Capacity 8 tokens either way (contiguous S = 8; paged 4 pages of 2)."""
    storage = randn(rng, (2, 8, 576), np.float16)
    pages = randn(rng, (8, 2, 576), np.float16)
    bt = np.arange(8, dtype=np.int32).reshape(2, 4)

    def build(lengths):
        if kind == "contiguous":
            return nm.ContiguousKVCache(storage, lengths)
        return nm.PagedKVCache(pages, bt, lengths)

    build(np.array([8, 0], np.int32))
    build(np.array([8, 0], np.int64))       # host int64 is accepted
    for lengths, exc, shows in [(np.array([9, 1], np.int32), ValueError, ("lengths[0] = 9", "8")),
                                (np.array([2, -1], np.int32), ValueError, ("lengths[1] = -1",)),
                                (np.array([2, 1, 1], np.int32), ValueError, ("[2]", "[3]")),
                                (np.array([[2, 1]], np.int32), ValueError, ("[1, 2]",)),
                                (np.array([2.0, 1.0]), TypeError, ("float64",)),
                                ([2, 1], TypeError, ("list",)),
                                (np.array([2**40, 1]), ValueError, ("int32",))]:
        with pytest.raises(exc, match="^lengths\\b") as info:
            build(lengths)
        for s in shows:
            assert s in str(info.value)


@pytest.mark.parametrize("entry_value", [5, -1, UNUSED_PAGE], ids=["P", "-1", "2^30"])
@pytest.mark.parametrize("where", ["first", "last_partial"])
def test_block_table_used_entry_out_of_range(where, entry_value, rng):
    """5 pages of 3 tokens; sequence 0 (7 tokens) uses pages at table columns 0..2."""
    pages = randn(rng, (5, 3, 576), np.float32)
    bt = np.array([[4, 0, 2, UNUSED_PAGE], [1, UNUSED_PAGE, UNUSED_PAGE, UNUSED_PAGE]], np.int32)
    col = 0 if where == "first" else 2
    bt[0, col] = entry_value
    with pytest.raises(ValueError, match="^block_table\\b") as info:
        nm.PagedKVCache(pages, bt, np.array([7, 3], np.int32))
    assert f"block_table[0, {col}] = {entry_value}" in str(info.value)
    assert "[0, 5)" in str(info.value)


@pytest.mark.parametrize("unused", [UNUSED_PAGE, -1, 5, -(2**31)],
                         ids=["2^30", "-1", "P", "int32_min"])
def test_block_table_unused_entries_are_accepted(unused, rng):
    """Entries past a sequence's last used page (and every entry of a length-0 sequence) may
    hold anything: the cache is built, and the result does not depend on them."""
    pages = randn(rng, (5, 3, 576), np.float32)
    lengths = np.array([6, 3, 0], np.int32)            # 2 pages, 1 page, none
    bt = np.array([[4, 0, 2, 3], [1, 2, 3, 4], [0, 1, 2, 3]], np.int32)
    q = randn(rng, (3, 1, 2, 576), np.float32)
    want = nm.reference.mla_decode(q, nm.PagedKVCache(pages, bt, lengths), 0.1)
    bt[0, 2:] = unused
    bt[1, 1:] = unused
    bt[2, :] = unused
    cache = nm.PagedKVCache(pages, bt, lengths)
    out = np.full((3, 1, 2, 512), SENTINEL, np.float32)
    nm.mla_decode(q, cache, 0.1, out=out, backend="reference")
    np.testing.assert_array_equal(out, want.astype(np.float32))


def test_with_lengths_checks_the_pages_it_reaches(rng):
    """``with_lengths`` checks only the table entries the new lengths reach that the old ones
    did not (the per-sequence count of leading real pages is kept), with the same message
    as construction; its layout key equals that of a cache built anew with those lengths."""
    pages = randn(rng, (3, 4, 576), np.float32)
    bt = np.array([[0, 1, -1], [2, 7, 0]], np.int32)  # 2 and 1 leading real pages
    cache = nm.PagedKVCache(pages, bt, np.array([8, 4], np.int32))
    moved = cache.with_lengths(np.array([5, 3], np.int64))
    assert moved.lengths_host.tolist() == [5, 3]
    assert moved.layout_key == nm.PagedKVCache(pages, bt, np.array([5, 3])).layout_key
    for lengths, entry in (([1, 5], "block_table[1, 1] = 7"), ([9, 0], "block_table[0, 2] = -1")):
        with pytest.raises(ValueError, match="^block_table\\b") as info:
            cache.with_lengths(np.array(lengths, np.int32))
        assert entry in str(info.value)
    with pytest.raises(ValueError, match="exceeds the cache capacity of 12"):
        cache.with_lengths(np.array([13, 0], np.int32))


def test_block_table_and_page_size(rng):
    lengths = np.array([2, 1], np.int32)
    with pytest.raises(ValueError, match="^page_size\\b") as info:
        nm.PagedKVCache(np.zeros((4, 0, 576), np.float32), np.zeros((2, 2), np.int32), lengths)
    assert "0" in str(info.value)
    pages = randn(rng, (4, 2, 576), np.float32)
    for bt, exc in [(np.zeros(2, np.int32), ValueError),
                    (np.zeros((2, 2), np.float32), TypeError),
                    ([[0, 1], [2, 3]], TypeError)]:
        with pytest.raises(exc, match="^block_table\\b"):
            nm.PagedKVCache(pages, bt, lengths)
    with pytest.raises(ValueError, match="^lengths\\b"):   # one length per block-table row
        nm.PagedKVCache(pages, np.zeros((3, 2), np.int32), lengths)


# ---------------------------------------------------------------------------------------------
# flare_mla_decoding's own arguments
# ---------------------------------------------------------------------------------------------
def test_flare_valid_length_must_match_the_cache(rng):
    entry = Entry("flare")
    p = base_problem(rng, entry)
    assert_refused(entry, p, ValueError, "valid_length", "[7, 3]", "[7, 2]",
                   valid_length=np.array([7, 2], np.int32))
    assert_refused(entry, p, ValueError, "valid_length", valid_length=np.array([7, 3, 0], np.int32))
    out = sentinel_out(p)
    invoke(entry, p, out, valid_length=np.array([7, 3], np.int32), backend="reference")
    np.testing.assert_array_equal(out, p.run(nm.reference).astype(p.dtype))


@entries(FLARE)
def test_flare_k_and_output(entry, rng):
    p = base_problem(rng, entry)
    assert_refused(entry, p, ValueError, "k", "[2, 8, 2, 576]",
                   cache=randn(rng, (2, 8, 2, 576), np.float32))
    assert_refused(entry, p, TypeError, "k", "str", cache="kv")
    with pytest.raises(TypeError, match="^output\\b"):
        nm.flare_mla_decoding(None, p.q, p.cache, None, None, p.q_offsets, p.scale)


def test_flare_ragged_needs_row_offsets(rng):
    entry = Entry("flare_ragged")
    p = base_problem(rng, entry)
    assert_refused(entry, p, ValueError, "valid_length", "None", offsets=None)


def test_flare_array_k(rng):
    """MAX's second overload: k [B, S, 1, 576]; valid_length None means all S keys."""
    B, S = 2, 6
    k = randn(rng, (B, S, 1, 576), np.float32)
    q = randn(rng, (B, 1, 3, 576), np.float32)
    for valid_length in (None, np.array([6, 2], np.int32)):
        lengths = np.full(B, S, np.int32) if valid_length is None else valid_length
        want = nm.reference.mla_decode(q, nm.ContiguousKVCache(k[:, :, 0], lengths), 0.2)
        out = np.full((B, 1, 3, 512), SENTINEL, np.float32)
        res = nm.flare_mla_decoding(out, q, k, None, None, valid_length, 0.2, backend="reference")
        np.testing.assert_array_equal(out, want.astype(np.float32))
        assert res is out


def test_flare_array_k_valid_length_above_S(rng):
    k = randn(rng, (2, 6, 1, 576), np.float32)
    q = randn(rng, (2, 1, 3, 576), np.float32)
    out = np.full((2, 1, 3, 512), SENTINEL, np.float32)
    with pytest.raises(ValueError, match="^valid_length\\b"):
        nm.flare_mla_decoding(out, q, k, None, None, np.array([7, 2], np.int32), 0.2)
    assert np.all(out == SENTINEL)
