"""Masks and score mods (``numba_mla.mods``): tile classification against the element-wise
mask, key ranges, ALiBi slopes, composition, constructor errors, and the device forms run in
a kernel (the simulator, or a GPU) against the NumPy forms."""
import math

import numpy as np
import pytest

import numba_mla as nm
from helpers import MASK_CASES, SCORE_MOD_CASES, make_problem, spec_alibi_slope
from numba import cuda
from numba_mla.mods import KEY_MAX, as_mask, as_score_mod

CLASS_NAMES = {nm.EMPTY: "EMPTY", nm.PARTIAL: "PARTIAL", nm.FULL: "FULL"}
BOOLEAN_CASES = [c for c in MASK_CASES if not c.id.startswith("bias")]

# Built-in masks whose classification must be exact (beyond the shared table's parameters).
EXACT_MASKS = [
    ("null", lambda: nm.NullMask()),
    ("causal", lambda: nm.CausalMask()),
    *[(f"window{w}", lambda w=w: nm.SlidingWindowCausalMask(w)) for w in (1, 2, 5, 17)],
    *[(f"chunked{c}", lambda c=c: nm.ChunkedMask(c)) for c in (1, 2, 5, 16)],
    *[(f"chunked_causal{c}", lambda c=c: nm.ChunkedCausalMask(c)) for c in (1, 3, 8)],
]
KEYS = 96          # key positions examined: 0..KEYS-1
B_H = (2, 3)       # (b, h) values examined: a tile's class must hold for all of them


def kept_grid(mask, q_lo, q_hi):
    """keep[b, h, q, k] for q in [q_lo, q_hi], k in [0, KEYS), from the NumPy form."""
    b = np.arange(B_H[0])[:, None, None, None]
    h = np.arange(B_H[1])[None, :, None, None]
    q = np.arange(q_lo, q_hi + 1)[None, None, :, None]
    k = np.arange(KEYS)[None, None, None, :]
    return np.broadcast_to(mask.keep(b, h, q, k), (*B_H, q_hi - q_lo + 1, KEYS))


def random_tiles(rng, q_lo, q_hi):
    """Tiles [k0, k1) covering [0, 64) in one random tile size, plus small tiles near the
    queries (where the classes change) and a few of random extent."""
    size = int(rng.choice([1, 2, 3, 4, 7, 16, 64]))
    tiles = [(k0, min(k0 + size, 64)) for k0 in range(0, 64, size)]
    for _ in range(8):
        k0 = int(rng.integers(max(0, q_lo - 20), q_hi + 2))
        tiles.append((k0, k0 + int(rng.integers(1, 5))))
    for _ in range(4):
        k0 = int(rng.integers(0, KEYS - 1))
        tiles.append((k0, int(rng.integers(k0 + 1, KEYS + 1))))
    return tiles


def random_query_range(rng):
    """[q_lo, q_hi]: a single position half the time, else up to 10 (Sq <= 8 and more)."""
    q_lo = int(rng.integers(0, 56))
    return q_lo, q_lo + (0 if rng.random() < 0.5 else int(rng.integers(1, 10)))


def true_class(kept):
    return nm.FULL if kept.all() else nm.EMPTY if not kept.any() else nm.PARTIAL


def check_classification(mask, rng, exact, cases=25):
    for _ in range(cases):
        q_lo, q_hi = random_query_range(rng)
        grid = kept_grid(mask, q_lo, q_hi)
        for k0, k1 in random_tiles(rng, q_lo, q_hi):
            got, want = mask.classify(k0, k1, q_lo, q_hi), true_class(grid[..., k0:k1])
            where = f"{mask!r}: tile [{k0}, {k1}), queries [{q_lo}, {q_hi}]"
            assert got in CLASS_NAMES, f"{where}: classify returned {got!r}"
            if exact:
                assert got == want, f"{where}: {CLASS_NAMES[got]}, expected {CLASS_NAMES[want]}"
            elif got != nm.PARTIAL:
                assert got == want, f"{where}: unsound {CLASS_NAMES[got]} ({CLASS_NAMES[want]})"


@pytest.mark.parametrize("case", BOOLEAN_CASES, ids=str)
def test_classify_is_sound(case, rng):
    mask = as_mask(case.make(None, rng))
    check_classification(mask, rng, exact=case.exact)


@pytest.mark.parametrize("name,make", EXACT_MASKS, ids=[n for n, _ in EXACT_MASKS])
def test_classify_is_exact(name, make, rng):
    check_classification(make(), rng, exact=True, cases=40)


def check_key_range(mask, rng, tight, cases=40):
    for _ in range(cases):
        q_lo, q_hi = random_query_range(rng)
        lo, hi = mask.key_range(q_lo, q_hi)
        kept = np.nonzero(kept_grid(mask, q_lo, q_hi).any(axis=(0, 1, 2)))[0]
        where = f"{mask!r}: queries [{q_lo}, {q_hi}] -> keys [{lo}, {hi})"
        assert 0 <= lo and hi <= KEY_MAX, where
        if kept.size:
            assert lo <= kept.min() and kept.max() < hi, f"{where} misses kept keys {kept}"
            if tight:
                assert (lo, hi) == (kept.min(), kept.max() + 1), f"{where}, kept {kept}"


@pytest.mark.parametrize("case", BOOLEAN_CASES, ids=str)
def test_key_range_bounds_kept_keys(case, rng):
    check_key_range(as_mask(case.make(None, rng)), rng, tight=False)


@pytest.mark.parametrize("name,make", EXACT_MASKS[1:], ids=[n for n, _ in EXACT_MASKS[1:]])
def test_key_range_is_tight(name, make, rng):
    """A sliding window over a long cache reads only the window: the built-in masks' key
    ranges are exactly the kept keys."""
    check_key_range(make(), rng, tight=True)


def test_null_mask_is_trivial():
    m = nm.NullMask()
    assert m.trivial and m.key_range(3, 5) == (0, KEY_MAX)
    assert m.classify(0, 1000, 0, 0) == nm.FULL
    assert not nm.CausalMask().trivial


# ---------------------------------------------------------------------------------------------
# Score mods
# ---------------------------------------------------------------------------------------------
def alibi_paper_slopes(n):
    """ALiBi's published reference implementation (Press et al.,
    ofirpress/attention_with_linear_biases)."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    p = 2 ** math.floor(math.log2(n))
    return power_of_2(p) + alibi_paper_slopes(2 * p)[0::2][: n - p]


@pytest.mark.parametrize("H", [1, 2, 3, 5, 8, 12, 16, 24, 100, 128])
def test_alibi_slopes(H):
    mod = nm.AlibiScoreMod(H)
    want = [spec_alibi_slope(h, H) for h in range(H)]
    np.testing.assert_allclose(mod.slopes(), want, rtol=1e-15)
    np.testing.assert_allclose(mod.slopes(), alibi_paper_slopes(H), rtol=1e-12)
    # apply: s + slope[h] * (k - q_pos), broadcast over index arrays.
    s = np.linspace(-2, 2, 7)[None, None, :]
    h = np.arange(H)[:, None, None]
    q_pos = np.array([[[6]], [[9]]]).reshape(2, 1, 1, 1)
    k = np.arange(7)
    got = mod.apply(s, 0, h, q_pos, k)
    np.testing.assert_allclose(got, s + np.array(want)[:, None, None] * (k - q_pos), rtol=1e-14)


def test_alibi_checks_heads():
    nm.AlibiScoreMod(12).check_heads(12)
    with pytest.raises(ValueError, match="^score_mod"):
        nm.AlibiScoreMod(12).check_heads(16)


def test_softcap_bounds_scores():
    mod = nm.SoftCapScoreMod(5.0)
    s = np.array([-1e6, -5.0, -0.1, 0.0, 0.1, 5.0, 1e6])
    got = mod.apply(s, 0, 0, 0, 0)
    np.testing.assert_allclose(got, 5.0 * np.tanh(s / 5.0))
    assert np.all(np.abs(got) <= 5.0)
    np.testing.assert_allclose(got[2:5], s[2:5], atol=1e-3)  # ~identity near 0


# ---------------------------------------------------------------------------------------------
# Composition
# ---------------------------------------------------------------------------------------------
def test_composition_rules(rng):
    causal, window = nm.CausalMask(), nm.SlidingWindowCausalMask(2)

    def odd(b, h, q_pos, k):
        return k % 2 == 1

    both, either = causal & odd, odd | window            # Mask & fn, fn | Mask (reflected)
    assert isinstance(both, nm.AndMask) and isinstance(either, nm.OrMask)
    assert isinstance(both.b, nm.FunctionMask) and isinstance(either.a, nm.FunctionMask)
    q, k = np.arange(12)[:, None], np.arange(12)[None, :]
    np.testing.assert_array_equal(both.keep(0, 0, q, k), (k <= q) & (k % 2 == 1))
    np.testing.assert_array_equal(either.keep(0, 0, q, k),
                                  (k % 2 == 1) | ((k <= q) & (q - k < 2)))
    nested = (causal | odd) & window
    np.testing.assert_array_equal(nested.keep(0, 0, q, k), window.keep(0, 0, q, k))
    # Distinct compositions are distinct kernels; equal ones share one.
    keys = {m.cache_key() for m in (causal & window, causal | window, window & causal)}
    assert len(keys) == 3
    same = nm.CausalMask() & nm.SlidingWindowCausalMask(2)
    assert (causal & window).cache_key() == same.cache_key()
    assert nm.SlidingWindowCausalMask(2).cache_key() != nm.SlidingWindowCausalMask(3).cache_key()
    assert isinstance(as_mask(None), nm.NullMask)
    assert isinstance(as_score_mod(None), nm.IdentityScoreMod)


def _never(b, h, q_pos, k):
    return False


@pytest.mark.parametrize("other", [nm.CausalMask(), _never, None], ids=["causal", "fn", "bias"])
@pytest.mark.parametrize("op", ["&", "|"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_materialized_mask_does_not_compose(side, op, other):
    bias = nm.MaterializedMask(np.full((1, 1, 4), -1.5, np.float32))
    other = bias if other is None else other
    a, b = (bias, other) if side == "left" else (other, bias)
    with pytest.raises(TypeError, match="^mask"):
        (a & b) if op == "&" else (a | b)


CONSTRUCTOR_ERRORS = [
    ("window0", lambda: nm.SlidingWindowCausalMask(0), ValueError, "window"),
    ("window-3", lambda: nm.SlidingWindowCausalMask(-3), ValueError, "window"),
    ("window_float", lambda: nm.SlidingWindowCausalMask(2.0), TypeError, "window"),
    ("window_bool", lambda: nm.SlidingWindowCausalMask(True), TypeError, "window"),
    ("chunk0", lambda: nm.ChunkedMask(0), ValueError, "chunk"),
    ("chunk-1", lambda: nm.ChunkedMask(-1), ValueError, "chunk"),
    ("chunk_str", lambda: nm.ChunkedMask("4"), TypeError, "chunk"),
    ("chunked_causal0", lambda: nm.ChunkedCausalMask(0), ValueError, "chunk"),
    ("cap_inf", lambda: nm.SoftCapScoreMod(math.inf), ValueError, "cap"),
    ("cap_nan", lambda: nm.SoftCapScoreMod(math.nan), ValueError, "cap"),
    ("cap0", lambda: nm.SoftCapScoreMod(0.0), ValueError, "cap"),
    ("cap-1", lambda: nm.SoftCapScoreMod(-1.0), ValueError, "cap"),
    ("cap_str", lambda: nm.SoftCapScoreMod("2"), TypeError, "cap"),
    ("alibi0", lambda: nm.AlibiScoreMod(0), ValueError, "num_heads"),
    ("alibi_float", lambda: nm.AlibiScoreMod(4.0), TypeError, "num_heads"),
    ("mask_fn_3_args", lambda: nm.FunctionMask(lambda b, h, q: True), TypeError, "mask"),
    ("mask_not_callable", lambda: nm.FunctionMask(3), TypeError, "mask"),
    ("score_fn_4_args", lambda: nm.FunctionScoreMod(lambda s, b, h, q: s), TypeError, "score_mod"),
    ("bias_float64", lambda: nm.MaterializedMask(np.zeros((1, 1, 4))), TypeError, "bias"),
    ("bias_2d", lambda: nm.MaterializedMask(np.zeros((1, 4), np.float32)), ValueError, "bias"),
    ("bias_list", lambda: nm.MaterializedMask([[[0.0]]]), TypeError, "bias"),
    ("score_mod_as_mask", lambda: as_mask(nm.IdentityScoreMod()), TypeError, "mask"),
    ("int_as_mask", lambda: as_mask(7), TypeError, "mask"),
    ("mask_as_score_mod", lambda: as_score_mod(nm.CausalMask()), TypeError, "score_mod"),
    ("str_as_score_mod", lambda: as_score_mod("tanh"), TypeError, "score_mod"),
]


@pytest.mark.parametrize("make,exc,name", [c[1:] for c in CONSTRUCTOR_ERRORS],
                         ids=[c[0] for c in CONSTRUCTOR_ERRORS])
def test_constructor_errors(make, exc, name):
    with pytest.raises(exc, match=f"^{name}\\b"):
        make()


# ---------------------------------------------------------------------------------------------
# Device forms: each compiled into one tiny kernel and compared with the NumPy forms
# ---------------------------------------------------------------------------------------------
@cuda.jit(device=True)
def _keep_unused(b, h, q_pos, k):
    return True


def mask_kernel(mask):
    """One kernel evaluating every device form of ``mask``: apply and keep at (b, h, i, k)
    points, classify on tiles, key_range on query ranges."""
    apply = mask.device_apply()
    keep = mask.device_keep() if mask.boolean else _keep_unused
    classify, key_range = mask.device_classify(), mask.device_key_range()

    @cuda.jit
    def kernel(pts, s, q_pos, bias, tiles, ranges, applied, kept, classes, bounds):
        start, step = cuda.grid(1), cuda.gridsize(1)
        for x in range(start, pts.shape[0], step):
            b, h, i, k = pts[x, 0], pts[x, 1], pts[x, 2], pts[x, 3]
            applied[x] = apply(s[x], b, h, i, q_pos[x], k, bias)
            kept[x] = 1 if keep(b, h, q_pos[x], k) else 0
        for x in range(start, tiles.shape[0], step):
            classes[x] = classify(tiles[x, 0], tiles[x, 1], tiles[x, 2], tiles[x, 3])
        for x in range(start, ranges.shape[0], step):
            lo, hi = key_range(ranges[x, 0], ranges[x, 1])
            bounds[x, 0] = lo
            bounds[x, 1] = hi

    return kernel


@pytest.mark.parametrize("case", MASK_CASES, ids=str)
def test_mask_device_forms(case, rng):
    B, Sq, H, L = 2, 3, 3, 10
    p = make_problem(rng, B, Sq, H, [L, L], np.float32, "contiguous")
    mask = as_mask(case.make(p, rng))
    # Points (b, h, i, k) over every query row and valid key; q_pos = L - Sq + i.
    pts = np.array(np.meshgrid(range(B), range(H), range(Sq), range(L), indexing="ij"),
                   np.int32).reshape(4, -1).T.copy()
    b, h, i, k = pts.T
    q_pos = (L - Sq + i).astype(np.int32)
    s = rng.standard_normal(len(pts))
    s[rng.random(len(pts)) < 0.1] = np.inf       # a dropped key stays -inf, whatever the score
    s[rng.random(len(pts)) < 0.1] = np.nan
    tiles = np.array([(k0, k0 + w, q0, q0 + dq) for k0 in range(0, 24, 3) for w in (1, 4)
                      for q0, dq in ((2, 0), (9, 3))], np.int32)
    ranges = np.array([(q0, q0 + dq) for q0 in (0, 3, 11) for dq in (0, 2, 7)], np.int32)
    bias = mask.bias_array() if mask.bias_array() is not None else np.zeros((1, 1, 1), np.float32)

    applied = np.full(len(pts), np.nan)
    kept = np.full(len(pts), 7, np.uint8)
    classes = np.full(len(tiles), -1, np.int32)
    bounds = np.full((len(ranges), 2), -1, np.int64)
    mask_kernel(mask)[1, 32](pts, s, q_pos, bias, tiles, ranges, applied, kept, classes, bounds)

    bias_np = mask.bias(b, h, i, q_pos, k)
    with np.errstate(invalid="ignore"):
        want = np.where(np.isneginf(bias_np), -np.inf, s + bias_np)
    np.testing.assert_array_equal(applied, want)
    if mask.boolean:
        np.testing.assert_array_equal(kept.astype(bool), mask.keep(b, h, q_pos, k))
    np.testing.assert_array_equal(classes, [mask.classify(*t) for t in tiles.tolist()])
    np.testing.assert_array_equal(bounds, [mask.key_range(*r) for r in ranges.tolist()])


def score_mod_kernel(mod):
    fn = mod.device_fn()

    @cuda.jit
    def kernel(s, pts, out):
        start, step = cuda.grid(1), cuda.gridsize(1)
        for x in range(start, s.shape[0], step):
            out[x] = fn(s[x], pts[x, 0], pts[x, 1], pts[x, 2], pts[x, 3])

    return kernel


@pytest.mark.parametrize("H", [4, 6])
@pytest.mark.parametrize("case", SCORE_MOD_CASES, ids=str)
def test_score_mod_device_forms(case, H, rng):
    p = make_problem(rng, 2, 1, H, [1, 1], np.float32, "contiguous")
    mod = as_score_mod(case.make(p))
    n = 200
    pts = np.stack([rng.integers(0, 2, n), rng.integers(0, H, n), rng.integers(0, 40, n),
                    rng.integers(0, 40, n)], axis=1).astype(np.int32)  # b, h, q_pos, k
    s = rng.standard_normal(n) * 4
    out = np.full(n, np.nan)
    score_mod_kernel(mod)[1, 32](s, pts, out)
    want = mod.apply(s, *pts.T)
    # Device forms compute in fp32, like the kernel's softmax (SPEC); user functions keep
    # whatever precision they compute in.
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=2e-6)
    assert not np.allclose(want, s) or case.id == "identity"  # the mod does something
