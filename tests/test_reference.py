"""The NumPy reference (``numba_mla.reference``) against a brute-force formulation of SPEC.md.

The brute force below loops over sequence b, query row i, head h and key j in plain Python:
scalar float64 dot products, ``math.exp``, no max subtraction, the masks and score mods in
their SPEC scalar forms (``helpers.MASK_CASES`` / ``SCORE_MOD_CASES``), keys read from the
problem's ground-truth rows rather than through the cache. Shapes stay tiny so it is fast.
"""
import math
from operator import mul

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numba_mla as nm
from helpers import (
    DTYPES,
    MASK_CASES,
    MASKS,
    SCORE_MOD_CASES,
    SCORE_MODS,
    assert_close,
    assert_three_way,
    make_bias,
    make_problem,
    random_lengths,
)
from numba import cuda

RTOL, ATOL = 1e-9, 1e-12  # float64 against float64: only the summation order differs


def brute_force(p, mask, score_mod, mask_case, score_case):
    """SPEC.md's definition, one (b, i, h, j) at a time. Returns out [rows, H, 512] and
    lse [rows, H] in q's flat row order (``p.flat``)."""
    mask_rule = mask_case.rule(mask)                    # (b, h, i, q_pos, k) -> 0, -inf, bias
    score_rule = score_case.rule(score_mod, p.heads)    # (s, b, h, q_pos, k) -> s'
    rows = p.flat(p.q).shape[0]
    out = np.zeros((rows, p.heads, 512))
    lse = np.full((rows, p.heads), -math.inf)
    for b in range(p.batch):
        r0, n = p.rows_of(b)
        L = int(p.lengths[b])
        K = p.keys[b].astype(np.float64).tolist()       # [L][576]; V = K[j][:512]
        Q = p.q_of(b).astype(np.float64)                # [n, H, 576]
        for i in range(n):
            q_pos = L - n + i
            for h in range(p.heads):
                qv = Q[i, h].tolist()
                weights = []                            # (j, exp(s_j)) over kept keys
                for j in range(L):
                    bias = mask_rule(b, h, i, q_pos, j)
                    if bias == -math.inf:               # dropped, whatever the score
                        continue
                    s = p.scale * sum(map(mul, qv, K[j]))
                    s = score_rule(s, b, h, q_pos, j) + bias
                    if s != -math.inf:
                        weights.append((j, math.exp(s)))
                if not weights:                         # empty row: out 0, lse -inf
                    continue
                total = sum(w for _, w in weights)
                acc = [0.0] * 512
                for j, w in weights:
                    for d, v in enumerate(K[j][:512]):
                        acc[d] += w * v
                out[r0 + i, h] = [a / total for a in acc]
                lse[r0 + i, h] = math.log(total)
    return out, lse


def check_against_brute_force(p, mask_case, score_case, rng):
    mask, score_mod = mask_case.make(p, rng), score_case.make(p)
    out, lse = p.run(nm.reference, mask=mask, score_mod=score_mod, return_lse=True)
    assert out.shape == p.out_shape and lse.shape == p.lse_shape
    assert out.dtype == np.float64 and lse.dtype == np.float64
    want_out, want_lse = brute_force(p, mask, score_mod, mask_case, score_case)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert_close(p.flat(out), want_out, RTOL, ATOL, "out")
    assert_close(p.flat(lse), want_lse, RTOL, ATOL, "lse")


LAYOUTS = ["padded", "ragged"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("score_case", SCORE_MOD_CASES, ids=str)
@pytest.mark.parametrize("mask_case", MASK_CASES, ids=str)
def test_masks_and_score_mods(mask_case, score_case, layout, rng):
    # H = 3: not a power of two (ALiBi's second slope rule); paged, page size 3.
    B, Sq, H = 3, 3, 3
    p = make_problem(rng, B, Sq, H, random_lengths(rng, B, Sq, 9), np.float32, "paged", 3,
                     ragged=layout == "ragged")
    check_against_brute_force(p, mask_case, score_case, rng)


CACHES = [("contiguous", 0), ("paged", 1), ("paged", 3), ("paged", 16)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("Sq", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("kind,page_size", CACHES,
                         ids=[f"{k}{ps or ''}" for k, ps in CACHES])
def test_caches_and_query_counts(kind, page_size, Sq, layout, rng):
    B, H = 3, 4
    lengths = random_lengths(rng, B, Sq, Sq + 20)     # holds 0 and Sq
    if layout == "ragged":
        lengths[lengths == Sq] = 1                      # one key: at most one query row
    p = make_problem(rng, B, Sq, H, lengths, np.float32, kind, page_size,
                     ragged=layout == "ragged")
    check_against_brute_force(p, MASKS["causal"], SCORE_MODS["alibi"], rng)


@pytest.mark.parametrize("H", [1, 2, 5, 8])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_dtypes_and_heads(dtype, H, rng):
    B, Sq = 2, 2
    p = make_problem(rng, B, Sq, H, random_lengths(rng, B, Sq, 11), DTYPES[dtype], "paged", 4)
    check_against_brute_force(p, MASKS["window3"], SCORE_MODS["alibi"], rng)


def test_return_lse_and_compute_dtype(rng):
    p = make_problem(rng, 2, 2, 2, [7, 4], np.float32, "paged", 3)
    out_only = nm.reference.mla_decode(p.q, p.cache, p.scale)
    out, lse = nm.reference.mla_decode(p.q, p.cache, p.scale, return_lse=True)
    assert isinstance(out_only, np.ndarray) and out_only.shape == (2, 2, 2, 512)
    assert lse.shape == (2, 2, 2)
    np.testing.assert_array_equal(out_only, out)
    out32, lse32 = nm.reference.mla_decode(p.q, p.cache, p.scale, return_lse=True,
                                           compute_dtype=np.float32)
    assert out32.dtype == np.float32 and lse32.dtype == np.float32
    assert_close(out32, out, 1e-4, 1e-5, "out (float32 compute)")
    assert_close(lse32, lse, 1e-5, 1e-5, "lse (float32 compute)")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_empty_rows(layout, rng):
    """Length 0, and rows whose every key is dropped: out exactly 0, lse -inf, never NaN."""
    B, Sq, H = 3, 2, 2
    p = make_problem(rng, B, Sq, H, [0, 5, 6], np.float32, "paged", 2, ragged=layout == "ragged",
                     q_counts=[2, 2, 1])
    S = 8
    bias = rng.standard_normal((B, H, p.sq, S)).astype(np.float32)
    bias[1, 0, :, :] = -np.inf     # head 0 of sequence 1 keeps nothing
    bias[2, 1, 0, :6] = -np.inf    # one row of sequence 2 drops all its keys...
    bias[2, 1, 0, 6:] = 0.0        # ...though the bias keeps slots past the length
    out, lse = p.run(nm.reference, mask=nm.MaterializedMask(bias), return_lse=True)
    out, lse = p.flat(out), p.flat(lse)
    (r0, n0), (r1, n1), (r2, _) = (p.rows_of(b) for b in range(B))
    empty = np.zeros(lse.shape, bool)                  # [rows, H]
    empty[r0:r0 + n0, :] = True                         # length 0
    empty[r1:r1 + n1, 0] = True                         # all dropped by the bias
    empty[r2, 1] = True
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert np.all(out[empty] == 0.0)
    assert np.all(np.isneginf(lse[empty]))
    assert np.all(np.isfinite(lse[~empty]))
    assert np.all(np.abs(out[~empty]).max(axis=-1) > 0)


def future_is_inf(s, b, h, q_pos, k):
    return s if k <= q_pos else math.inf


def future_is_nan(s, b, h, q_pos, k):
    return s if k <= q_pos else math.nan


@pytest.mark.parametrize("mask_kind", ["causal", "bias"])
@pytest.mark.parametrize("score_mod", [future_is_inf, future_is_nan], ids=["inf", "nan"])
def test_dropped_keys_ignore_the_score_mod(score_mod, mask_kind, rng):
    """SPEC: a masked key is -inf, whatever the score mod made of it (+inf, NaN)."""
    p = make_problem(rng, 2, 3, 2, [6, 3], np.float32, "paged", 2)
    if mask_kind == "causal":
        mask = nm.CausalMask()
    else:
        q_pos = (p.lengths[:, None, None] - 3 + np.arange(3)[None, :, None])   # [B, Sq, 1]
        bias = rng.standard_normal((2, 3, 6)).astype(np.float32)
        bias[np.arange(6)[None, None, :] > q_pos] = -np.inf
        mask = nm.MaterializedMask(bias)
    out, lse = p.run(nm.reference, mask=mask, score_mod=score_mod, return_lse=True)
    want_out, want_lse = p.run(nm.reference, mask=mask, return_lse=True)
    assert_close(out, want_out, RTOL, ATOL, "out")
    assert_close(lse, want_lse, RTOL, ATOL, "lse")


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_dropped_key_takes_no_part(value, rng):
    """NaN or inf in the V part of a valid key: the rows that keep it are NaN (their whole out
    row, and lse), the rows the mask drops it for are untouched (never 0 x NaN)."""
    p = make_problem(rng, 1, 3, 2, [12], np.float32, "contiguous")
    clean = p.run(nm.reference, mask=nm.CausalMask(), return_lse=True)
    p.cache.storage[0, 10, 100] = value       # key 10: kept by the queries at 10 and 11 only
    out, lse = p.run(nm.reference, mask=nm.CausalMask(), return_lse=True)
    kept = np.array([False, True, True])      # queries at positions 9, 10, 11
    assert not np.isfinite(out[0, kept][..., 100]).any()
    np.testing.assert_array_equal(out[0, ~kept], clean[0][0, ~kept])
    np.testing.assert_array_equal(lse[0, ~kept], clean[1][0, ~kept])


@pytest.mark.parametrize("mask_id", ["null", "bias_B_H_Sq_S"])
@pytest.mark.parametrize("kind,page_size", [("contiguous", 0), ("paged", 1), ("paged", 5)],
                         ids=["contiguous", "paged1", "paged5"])
def test_unused_slots_never_reach_the_result(kind, page_size, mask_id):
    """The same problem with NaN, +inf or a huge value in every unused slot (cache and bias)
    gives bit-identical, finite results."""
    results = []
    for filler in (np.nan, np.inf, -3e38):
        rng = np.random.default_rng(1234)
        p = make_problem(rng, 3, 2, 2, [5, 0, 9], np.float32, kind, page_size, filler=filler)
        mask = (nm.MaterializedMask(make_bias(rng, p, True, filler=filler))
                if mask_id != "null" else nm.NullMask())
        results.append(p.run(nm.reference, mask=mask, return_lse=True))
    for out, lse in results:
        assert not np.isnan(out).any() and not np.isnan(lse).any()
        assert np.isfinite(out).all()
    for out, lse in results[1:]:
        np.testing.assert_array_equal(out, results[0][0])
        np.testing.assert_array_equal(lse, results[0][1])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_out_is_written(dtype, layout, rng):
    p = make_problem(rng, 2, 3, 2, [3, 8], DTYPES[dtype], "paged", 3, ragged=layout == "ragged")
    want = p.run(nm.reference, mask=nm.CausalMask())
    out = np.full(p.out_shape, np.nan, DTYPES[dtype])
    got = p.run(nm.reference, mask=nm.CausalMask(), out=out)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(out, want.astype(DTYPES[dtype]))
    # The public entry point, reference backend: same values, written into out.
    out2 = np.full(p.out_shape, np.nan, DTYPES[dtype])
    res = p.run(nm, mask=nm.CausalMask(), out=out2, backend="reference")
    np.testing.assert_array_equal(out2, want.astype(DTYPES[dtype]))
    np.testing.assert_array_equal(np.asarray(res), out2)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_public_reference_backend_three_way(dtype, rng):
    """``nm.mla_decode(backend="reference")`` returns q's dtype and float32 lse; its error is
    within the three-way bound against the float32 reference (rounded to q's dtype)."""
    dt = DTYPES[dtype]
    p = make_problem(rng, 2, 2, 4, [9, 40], dt, "paged", 16)
    mask, mod = nm.SlidingWindowCausalMask(13), nm.SoftCapScoreMod(3.0)
    out, lse = p.run(nm, mask=mask, score_mod=mod, return_lse=True, backend="reference")
    assert out.dtype == dt and lse.dtype == np.float32
    gold_out, gold_lse = p.run(nm.reference, mask=mask, score_mod=mod, return_lse=True)
    low_out, low_lse = p.run(nm.reference, mask=mask, score_mod=mod, return_lse=True,
                             compute_dtype=np.float32)
    assert_three_way(out, low_out.astype(dt), gold_out, what="out")
    assert_three_way(lse, low_lse, gold_lse, what="lse")


@pytest.mark.parametrize("kind,page_size", [("contiguous", 0), ("paged", 1), ("paged", 3)],
                         ids=["contiguous", "paged1", "paged3"])
def test_cache_addressing(kind, page_size, rng):
    """``rows`` (host) and ``device_locate`` (run in a tiny kernel) find every valid token."""
    p = make_problem(rng, 3, 1, 1, [4, 0, 7], np.float16, kind, page_size, spare_pages=3)
    cache = p.cache
    for b in range(3):
        np.testing.assert_array_equal(cache.rows(b, int(p.lengths[b])), p.keys[b])

    locate = cache.device_locate()
    bt = cache.block_table if cache.block_table is not None else np.zeros((1, 1), np.int32)
    bs = np.repeat(np.arange(3), 7).astype(np.int32)
    ts = np.tile(np.arange(7), 3).astype(np.int32)
    where = np.full((bs.size, 2), -1, np.int64)

    @cuda.jit
    def kernel(block_table, page_size, npages, bs, ts, where):
        x = cuda.grid(1)
        if x < bs.size:
            page, slot = locate(block_table, page_size, npages, bs[x], ts[x])
            where[x, 0] = page
            where[x, 1] = slot

    kernel[1, 32](bt, cache.page_size, np.asarray(cache.storage).shape[0], bs, ts, where)
    storage = np.asarray(cache.storage)
    for x, (b, t) in enumerate(zip(bs, ts)):
        if t < p.lengths[b]:
            np.testing.assert_array_equal(storage[where[x, 0], where[x, 1]], p.keys[b][t])


@pytest.mark.parametrize("cls", [nm.PagedKVCache, nm.ContiguousKVCache, nm.RaggedKVCache],
                         ids=["paged", "contiguous", "ragged"])
def test_tile_run_agrees_with_locate(cls, rng):
    """``tile_run`` (kernels/common.py: one lookup for a tile whose keys lie in one page's
    consecutive slots) says "run" exactly where ``locate`` puts key k0 + n at slot + n of one
    page for every key of [k0, k1), in particular wherever the keys lie in one page of the
    table without a clamp: random page sizes, tables with repeated and out-of-range entries,
    keys past the table, the capacity or the rows (run in a tiny kernel)."""
    from numba_mla.kernels.common import make_tile_run

    locate = cls.device_locate()
    tile_run = make_tile_run(locate)
    n = 64
    page_size = rng.choice([1, 3, 16, 64, 96], n).astype(np.int32)
    npages = rng.integers(1, 6, n).astype(np.int32)
    table = rng.integers(-1, 7, (n, 3, 4)).astype(np.int32)  # 3 sequences a trial, 4 columns
    b = rng.integers(0, 3, n).astype(np.int32)
    k0 = rng.integers(0, 5 * 96, n).astype(np.int32)
    k0 = np.where(rng.random(n) < 0.5, k0 - k0 % page_size, k0).astype(np.int32)  # aligned
    k1 = (k0 + rng.integers(1, 65, n)).astype(np.int32)
    out = np.full((n, 3), -1, np.int32)

    @cuda.jit
    def kernel(page_size, npages, table, b, k0, k1, out):
        x = cuda.grid(1)
        if x < out.shape[0]:
            page, slot, run = tile_run(table[x], page_size[x], npages[x], b[x], k0[x], k1[x])
            same = True
            for key in range(k0[x], k1[x]):
                pg, sl = locate(table[x], page_size[x], npages[x], b[x], key)
                same = same and pg == page and sl == slot + (key - k0[x])
            out[x, 0], out[x, 1], out[x, 2] = run, same, page

    kernel[1, n](page_size, npages, table, b, k0, k1, out)
    assert np.all(out[:, 1] == out[:, 0])  # a run is one, and one is found
    if cls is nm.PagedKVCache:  # one page of the table, no clamp: a run
        inside = ((k0 // page_size == (k1 - 1) // page_size) & (k0 // page_size < 4)
                  & (table[np.arange(n), b, np.minimum(k0 // page_size, 3)] >= 0)
                  & (table[np.arange(n), b, np.minimum(k0 // page_size, 3)] < npages))
        assert inside.any() and np.all(out[inside, 0] == 1)
    assert out[:, 0].any() and not out[:, 0].all()


# ---------------------------------------------------------------------------------------------
# Property tests: random shapes, lengths, caches, masks and score mods
# ---------------------------------------------------------------------------------------------
@st.composite
def problems(draw):
    ragged = draw(st.booleans())
    B = draw(st.integers(1, 3))
    Sq = draw(st.integers(1, 4))
    H = draw(st.integers(1, 4))
    if ragged:
        counts = draw(st.lists(st.integers(0, Sq), min_size=B, max_size=B))
        lengths = [draw(st.one_of(st.just(0), st.integers(max(c, 1), max(c, 1) + 8)))
                   for c in counts]
    else:
        counts = None
        lengths = draw(st.lists(st.one_of(st.just(0), st.integers(Sq, Sq + 8)),
                                min_size=B, max_size=B))
    kind = draw(st.sampled_from(["contiguous", "paged"]))
    page_size = draw(st.sampled_from([1, 2, 3, 5, 16]))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    p = make_problem(rng, B, Sq, H, lengths, DTYPES[dtype], kind, page_size, ragged=ragged,
                     q_counts=counts, scale=draw(st.floats(0.01, 0.3)))
    return p, rng


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from(MASK_CASES), st.sampled_from(SCORE_MOD_CASES))
def test_property_reference_matches_brute_force(problem, mask_case, score_case):
    p, rng = problem
    check_against_brute_force(p, mask_case, score_case, rng)
