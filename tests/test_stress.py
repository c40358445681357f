"""Numerics under stress, for every kernel backend (``kernel_backends``: "simt", "mma" for
16-bit data where the library takes it, and "simple").

- Scores of large magnitude in fp16/bf16: q and K scaled x100 (a one-hot softmax: out must be
  exactly the winning key's V row), and a large common offset (rope dims of 100: every score
  ~86500, the softmax spread over a few units), where anything but a max-subtracted softmax
  overflows.
- A single key (out exactly that key's V row), and one key kept of many (a window of 1, a bias
  of -inf everywhere but one key per row).
- NaN and +-inf in one element of q: that row becomes what the reference makes of it (NaN, or
  empty), every other row is unaffected; NaN in a key makes its sequence's rows NaN.
- Lengths exactly on and one past the key tiles (32 keys for simt, 64 for mma, 8 for simple)
  and the pages.

Every result is checked against the float64 reference three ways (docs/testing.md) with NaN/inf at
exactly its positions, and ``out`` pre-filled with NaN. Scores near 1e5 carry fp32 rounding of
a few units in the last place (0.008 each at 86500) whatever the summation order, so the floors
are in those units (``stress_floors``). In CI (the simulator) a handful of tiny cases run; the
``gpu``-marked variants are larger.
"""
import numpy as np
import pytest

import numba_mla as nm
from numba_mla.kernels import mma, simple
from helpers import (
    BF16,
    DTYPES,
    assert_three_way,
    f64,
    fp32_floor,
    kernel_backends,
    make_bias,
    make_problem,
    references,
    run_backend,
    simt_tile,
)


def backend_cases(dtypes, ci=None):
    """(dtype, backend) parameters over ``dtypes`` and their kernel backends. With ``ci`` (a
    test's index), the first dtype runs in the simulator with the ``ci``-th of the tuned
    backends (in rotation, so the CI tests share them out) and with "simple" (the readable
    kernel, cheap to simulate); the others are marked ``gpu``. Without it, all are for the GPU
    suite (whose tests carry the mark)."""
    params = []
    for dt in dtypes:
        available = kernel_backends(dt)
        tuned = [be for be in available if be != "simple"]
        for be in available:
            in_ci = (ci is not None and dt == dtypes[0]
                     and be in (tuned[ci % len(tuned)], "simple"))
            params.append(pytest.param(dt, be, id=f"{dt}-{be}",
                                       marks=() if in_ci else pytest.mark.gpu))
    return params


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def write_keys(p, keys):
    """Replace the valid keys of every sequence (p.keys and the cache slots they occupy); the
    NaN in the other slots stays."""
    storage = p.cache.storage
    for b, K in enumerate(keys):
        K = np.asarray(K).astype(p.dtype)
        p.keys[b] = K
        t = np.arange(len(K))
        if p.cache_kind == "paged":
            storage[p.cache.block_table[b, t // p.page_size], t % p.page_size] = K
        else:
            storage[b, t] = K


def stress_floors(p, golden):
    """(out floor, lse floor) for the three-way check. lse: 8 fp32 ulps of the largest value
    (fp32_floor). out: 4 fp32 ulps of the largest score, the rounding any fp32 summation order
    leaves in a score, times the largest V value (a score off by d moves out by at most d times
    the V range); at ordinary magnitudes this is fp32_floor's size."""
    lse = f64(golden[1])
    top = float(np.abs(lse[np.isfinite(lse)]).max(initial=0.0))
    vmax = max((float(np.abs(f64(K[:, :512])).max(initial=0.0)) for K in p.keys), default=0.0)
    score_ulps = 4 * float(np.spacing(np.float32(max(top, 1.0))))
    return max(fp32_floor(golden[0]), score_ulps * vmax), fp32_floor(golden[1])


def check(p, backend, mask=None, num_partitions=None):
    """Run ``backend`` into a NaN-filled out; three-way against the references. Returns
    (out, lse, golden)."""
    golden, same = references(p, mask)
    out = np.full(p.out_shape, np.nan, p.dtype)
    got, lse = run_backend(p, backend, mask=mask, num_partitions=num_partitions,
                           return_lse=True, out=out)
    assert got is out
    out_floor, lse_floor = stress_floors(p, golden)
    assert_three_way(out, same[0], golden[0], floor=out_floor, what="out")
    assert_three_way(lse, same[1], golden[1], floor=lse_floor, what="lse")
    return out, lse, golden


def scores(p, b):
    """float64 scaled scores of sequence b's query rows: [n, H, L]."""
    return p.scale * np.einsum("nhd,ld->nhl", f64(p.q_of(b)), f64(p.keys[b]))


# ---------------------------------------------------------------------------------------------
# Large scores
# ---------------------------------------------------------------------------------------------
def large_x100(rng, dtype, B, Sq, H, lengths, page_size=16):
    p = make_problem(rng, B, Sq, H, lengths, DTYPES[dtype], "paged", page_size)
    p.q[...] = (f64(p.q) * 100).astype(p.dtype)
    write_keys(p, [f64(K) * 100 for K in p.keys])
    return p


def assert_one_hot_rows_exact(p, out, causal=False, min_gap=60.0):
    """Rows whose best kept score leads the next by ``min_gap`` (e^-60: nothing else counts
    in fp32) must hold exactly the winning key's V row."""
    checked = 0
    for b in range(p.batch):
        r0, n = p.rows_of(b)
        L = int(p.lengths[b])
        if not n or not L:
            continue
        s = scores(p, b)                                              # [n, H, L]
        if causal:                                                    # key k <= q_pos only
            q_pos = L - n + np.arange(n)[:, None, None]
            s = np.where(np.arange(L)[None, None, :] <= q_pos, s, -np.inf)
        order = np.sort(s, axis=-1)
        gap = order[..., -1] - (order[..., -2] if s.shape[-1] > 1 else -np.inf)
        win = np.argmax(s, axis=-1)
        for i, h in zip(*np.nonzero(gap > min_gap)):
            np.testing.assert_array_equal(f64(p.flat(out)[r0 + i, h]),
                                          f64(p.keys[b][win[i, h], :512]),
                                          err_msg=f"row (b={b}, i={i}, h={h}) is not V[{win[i, h]}]")
            checked += 1
    assert checked, "no one-hot row to check"


@pytest.mark.kernel
@pytest.mark.parametrize("dtype,backend", backend_cases(["bf16", "fp16"], ci=0))
def test_large_scores_one_hot(dtype, backend, rng):
    """q and K x100: scores ~1e4-1e5 apart, a one-hot softmax, finite everywhere."""
    p = large_x100(rng, dtype, 1, 1, 2, [40])
    out, lse, _ = check(p, backend, num_partitions=2)
    assert np.isfinite(f64(out)).all() and np.isfinite(lse).all()
    assert np.abs(lse).max() > 1e4
    assert_one_hot_rows_exact(p, out)


def large_offset(rng, dtype, B, Sq, H, lengths, page_size=16, value=100.0):
    """The 64 rope dims of q and of every key set to ``value``: every score gets the same
    0.1352 * 64 * value^2 (86528 at 100) on top of an ordinary spread."""
    p = make_problem(rng, B, Sq, H, lengths, DTYPES[dtype], "paged", page_size)
    p.q[..., 512:] = value
    keys = [f64(K) for K in p.keys]
    for K in keys:
        K[:, 512:] = value
    write_keys(p, keys)
    return p


@pytest.mark.kernel
@pytest.mark.parametrize("dtype,backend", backend_cases(["bf16", "fp16"], ci=1))
def test_large_common_offset(dtype, backend, rng):
    p = large_offset(rng, dtype, 1, 1, 2, [40])
    out, lse, golden = check(p, backend, num_partitions=2)
    assert np.isfinite(f64(out)).all() and (lse > 8e4).all()
    # Not one-hot: the softmax is spread (else this would only repeat the test above).
    s = scores(p, 0)
    assert (np.exp(np.sort(s, -1)[..., -2] - s.max(-1)) > 1e-3).any()


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("kind", ["x100", "offset"])
@pytest.mark.parametrize("dtype,backend", backend_cases(["bf16", "fp16", "fp32"]) + [
    pytest.param(dt, "mma_sync", id=f"{dt}-mma_sync") for dt in ("bf16", "fp16")])
def test_gpu_large_scores(dtype, backend, kind, heads, rng):
    """(At 128 heads the reference max of the seesaw kernel and of the mma_sync kernel's
    split-role form lags: a one-hot row's P is then rounded, and only its division by P as
    rounded gives V exactly.)"""
    lengths = [1000, 777, 2, 0]
    make = large_x100 if kind == "x100" else large_offset
    p = make(rng, dtype, 4, 2, heads, lengths, 64)
    for P in (None, 1, 5):
        out, lse, _ = check(p, backend, mask=nm.CausalMask(), num_partitions=P)
        assert np.isfinite(f64(out)).all()
    if kind == "x100":
        assert_one_hot_rows_exact(p, out, causal=True)


@pytest.mark.kernel
@pytest.mark.parametrize("ahead", [False, True], ids=["s_in_turn", "s_ahead"])
@pytest.mark.parametrize("flags", [
    {},  # (the default: each lane's maxima, read early)
    dict(LANE_MAX=False),  # (the quad's maxima, read early)
    dict(MAX_EARLY=False, SUMS_LATE=False, P_FTZ=False),  # (the form before them)
], ids=["lane_max", "early_quad_max", "late_max"])
def test_mma_sync_roles_large_scores(flags, ahead, rng, monkeypatch):
    """The mma_sync kernel's split-role form (20 query rows: 32 a block) on scores 10^4 apart
    (q and keys x100, fp16: P of a row's lesser keys underflows, a max too low by more than
    16 would overflow P), in each form of its softmax's row maxima and with S of the next
    sub-tile ahead and in turn: right against the references, and each one-hot row exactly
    its key's V. A max of the wrong lanes or of one warp of the pair fails here where
    ordinary scores hide it (the lagging reference max and the division by P as rounded
    absorb a small error)."""
    from numba_mla.kernels import mma_sync_roles

    for name, value in dict(flags, S_AHEAD=ahead).items():
        monkeypatch.setattr(mma_sync_roles, name, value)
    p = large_x100(rng, "fp16", 2, 1, 20, [100, 37], 16)
    out, _, _ = check(p, "mma_sync", mask=nm.CausalMask(), num_partitions=1)
    assert np.isfinite(f64(out)).all()
    assert_one_hot_rows_exact(p, out, causal=True)


# ---------------------------------------------------------------------------------------------
# One key
# ---------------------------------------------------------------------------------------------
@pytest.mark.kernel
@pytest.mark.parametrize("dtype,backend", backend_cases(["fp16", "bf16", "fp32"], ci=0))
def test_single_key(dtype, backend, rng):
    """One key (the other sequence none), 2 partitions of which 1 is empty: out is exactly
    the key's V row (weight exp(0) = 1), the empty sequence 0 and -inf."""
    H = 1 if backend == "simt" else 2
    p = make_problem(rng, 2, 1, H, [1, 0], DTYPES[dtype], "paged", 16)
    out, lse, _ = check(p, backend, num_partitions=2)
    for h in range(H):
        np.testing.assert_array_equal(f64(out[0, 0, h]), f64(p.keys[0][0, :512]))
    assert np.all(out[1] == 0) and np.all(np.isneginf(lse[1]))


@pytest.mark.kernel
@pytest.mark.parametrize("dtype,backend", backend_cases(["bf16", "fp16", "fp32"], ci=1))
def test_one_key_kept_by_a_window_of_one(dtype, backend, rng):
    """A window of 1 keeps only the query's own key (the last of 40, past a tile boundary):
    out is exactly that key's V row."""
    p = make_problem(rng, 1, 2, 2, [40], DTYPES[dtype], "paged", 16)
    out, _, _ = check(p, backend, mask=nm.SlidingWindowCausalMask(1), num_partitions=2)
    for i in range(2):
        for h in range(2):
            np.testing.assert_array_equal(f64(out[0, i, h]), f64(p.keys[0][38 + i, :512]))


def one_key_bias(rng, p):
    """A [B, H, Sq, S] bias that drops every key but one random key per (row, head)."""
    bias = make_bias(rng, p, per_head=True, drop=0.0)
    keep = {}
    for b in range(p.batch):
        L, n = int(p.lengths[b]), int(p.counts[b])
        bias[b, :, :n, :L] = -np.inf
        for i in range(n):
            for h in range(p.heads):
                k = int(rng.integers(0, L))
                bias[b, h, i, k] = 0.0
                keep[b, i, h] = k
    return nm.MaterializedMask(bias), keep


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,backend", backend_cases(["bf16", "fp16", "fp32"]))
def test_gpu_one_key_kept(dtype, backend, rng):
    p = make_problem(rng, 3, 2, 16, [2000, 700, 65], DTYPES[dtype], "paged", 64)
    mask, keep = one_key_bias(rng, p)
    for P in (None, 1, 9):
        out, _, _ = check(p, backend, mask=mask, num_partitions=P)
        for (b, i, h), k in keep.items():
            np.testing.assert_array_equal(f64(out[b, i, h]), f64(p.keys[b][k, :512]))
    out, _, _ = check(p, backend, mask=nm.SlidingWindowCausalMask(1), num_partitions=4)
    for b in range(3):
        L = int(p.lengths[b])
        for i in range(2):
            np.testing.assert_array_equal(f64(out[b, i]),
                                          np.broadcast_to(f64(p.keys[b][L - 2 + i, :512]),
                                                          (16, 512)))


# ---------------------------------------------------------------------------------------------
# NaN and inf
# ---------------------------------------------------------------------------------------------
def poison_q(p, rng, values):
    """Put each of ``values`` into one element of a different query row; returns the rows
    (b, i, h)."""
    rows = [(b, i, h) for b in range(p.batch) for i in range(p.q.shape[1])
            for h in range(p.heads) if p.lengths[b]]
    picks = [rows[j] for j in rng.permutation(len(rows))[:len(values)]]
    for (b, i, h), v in zip(picks, values):
        p.q[b, i, h, int(rng.integers(0, 576))] = v
    return picks


@pytest.mark.kernel
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf * 0, sim
@pytest.mark.parametrize("dtype,backend", backend_cases(["fp16", "bf16", "fp32"], ci=0))
def test_nan_and_inf_in_query_rows(dtype, backend, rng):
    """NaN, +inf and -inf each in one q row: that row is what the float64 reference makes of it
    (NaN; or out 0 / lse -inf if every score became -inf), other rows are unaffected."""
    p = make_problem(rng, 2, 2, 2, [5, 9], DTYPES[dtype], "paged", 4)
    picks = poison_q(p, rng, [np.nan, np.inf, -np.inf])
    out, lse, golden = check(p, backend)              # NaN/inf exactly where golden has them
    bad = np.zeros(p.lse_shape, bool)
    for r in picks:
        bad[r] = True
    assert np.isfinite(lse[~bad]).all() and np.isfinite(f64(out[~bad])).all()
    assert np.isnan(lse[picks[0]]) and np.isnan(f64(out[picks[0]])).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,backend", backend_cases(["bf16", "fp16", "fp32"]))
def test_gpu_nan_and_inf(dtype, backend, rng):
    p = make_problem(rng, 4, 2, 16, [1000, 300, 64, 33], DTYPES[dtype], "paged", 64)
    poison_q(p, rng, [np.nan, np.inf, -np.inf, np.nan, np.inf, -np.inf])
    for P in (None, 1, 6):
        check(p, backend, num_partitions=P)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,backend", backend_cases(["bf16", "fp16", "fp32"]))
def test_gpu_nan_in_a_key(dtype, backend, rng):
    """NaN in one valid key of sequence 0 (1000 keys): its rows are NaN where the key is kept,
    others not. The window keeps keys 991..999 only, so key 40's tile is skipped entirely (a
    dropped key that shares a tile with kept keys still meets P.V: 0 x NaN, see README)."""
    p = make_problem(rng, 4, 2, 16, [1000, 300, 64, 33], DTYPES[dtype], "paged", 64)
    poison_q(p, rng, [np.nan, np.inf, -np.inf, np.nan, np.inf, -np.inf])
    keys = [f64(K) for K in p.keys]
    keys[0][40, 100] = np.nan
    write_keys(p, keys)
    for mask in (None, nm.SlidingWindowCausalMask(8)):
        check(p, backend, mask=mask, num_partitions=3)


@pytest.mark.kernel
@pytest.mark.parametrize("backend", ["simt", "mma", "simple"])
def test_nan_in_a_dropped_key(backend, rng):
    """NaN in the V part of a valid key that a sliding window drops (its whole tile): the
    kernels never read it, and the reference leaves it out too (a dropped key takes no part)."""
    p = make_problem(rng, 1, 1, 2, [200], BF16, "contiguous")
    keys = [f64(K) for K in p.keys]
    keys[0][10, 100] = np.nan
    write_keys(p, keys)
    out, lse, golden = check(p, backend, mask=nm.SlidingWindowCausalMask(8))
    assert np.isfinite(f64(out)).all() and np.isfinite(lse).all()


# ---------------------------------------------------------------------------------------------
# Tile and page boundaries
# ---------------------------------------------------------------------------------------------
@pytest.mark.kernel
@pytest.mark.parametrize("dtype,backend", backend_cases(["bf16", "fp16", "fp32"], ci=0))
def test_lengths_on_and_past_a_tile(dtype, backend, rng):
    """Lengths of exactly one tile and one key more (pages of 16: also on a page boundary)."""
    n = {"mma": mma.BLOCK_N, "simple": simple.BLOCK_N}.get(backend) or simt_tile(
        2, DTYPES[dtype])
    p = make_problem(rng, 2, 1, 2, [n, n + 1], DTYPES[dtype], "paged", 16)
    check(p, backend)


BOUNDARY_LENGTHS = [1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257]


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype,backend", backend_cases(["bf16", "fp16", "fp32"]))
def test_gpu_tile_and_page_boundaries(dtype, backend, page_size, rng):
    B = len(BOUNDARY_LENGTHS)
    for Sq, P in ((1, None), (2, 1), (1, 3), (4, 7)):
        lengths = [max(L, Sq) for L in BOUNDARY_LENGTHS]
        p = make_problem(rng, B, Sq, 16, lengths, DTYPES[dtype], "paged", page_size)
        check(p, backend, mask=nm.CausalMask() if Sq > 1 else None, num_partitions=P)
    p = make_problem(rng, B, 1, 8, BOUNDARY_LENGTHS, DTYPES[dtype], "contiguous")
    check(p, backend, num_partitions=2)


def test_kernel_backends_helper():
    """simt first and simple last, always; mma never for fp32; the answer is cached."""
    assert kernel_backends("fp32") == ["simt", "simple"]
    for dt in ("bf16", BF16, np.float16):
        got = kernel_backends(dt)
        assert got[0] == "simt" and got[-1] == "simple" and set(got) <= {"simt", "mma", "simple"}
        assert kernel_backends(dt) == got
