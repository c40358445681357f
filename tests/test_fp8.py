"""FP8 caches (numba_mla/fp8.py, docs/fp8.md): the definition, the quantizer, the checks, and
the FMA kernel against the reference on the dequantized cache.

The kernel problems are make_problem's (NaN in every slot no valid key occupies, a shuffled
block table with huge unused entries) with the cache quantized: a NaN slot stays NaN codes (and,
in the "v32" layout, NaN rope), so a read past a length or outside the used pages still shows.
The kernel tests run in the simulator (a simulated key tile costs seconds), so each factor
value appears at least once rather than every pair.
"""
import dataclasses

import ml_dtypes
import numpy as np
import pytest

import numba_mla as nm
from helpers import (BF16, MASK_CASES, MASKS, SCORE_MOD_CASES, SCORE_MODS, assert_three_way,
                     fp32_floor, make_problem, references, spy_factory, with_fp8_cache)
from numba_mla import fp8

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
KERNEL = pytest.mark.kernel


# ---------------------------------------------------------------------------------------------
# The definition
# ---------------------------------------------------------------------------------------------
def test_dequantize_e4m3_every_code():
    """Every one of the 256 codes is its exact e4m3fn value times the scale; 0x7F and 0xFF are
    NaN."""
    codes = np.arange(576, dtype=np.int64).astype(np.uint8).reshape(1, 576)
    got = fp8.dequantize(codes, "e4m3", 0.375)
    want = codes.view(E4M3).astype(np.float64) * 0.375
    assert np.array_equal(np.isnan(got), np.isin(codes, [0x7F, 0xFF]))
    assert np.array_equal(got, want, equal_nan=True)
    assert np.nanmax(np.abs(got)) == 448 * 0.375


def test_dequantize_v32_byte_layout(rng):
    """656 bytes: 512 codes, 4 float32 scales (group g: dims 128g..), 64 bf16 rope values."""
    codes = rng.integers(0, 0x7E, (3, 512), dtype=np.uint8)           # finite codes
    scales = np.array([0.5, 2.0, 3.0, 1e-3], np.float32)
    rope = rng.standard_normal((3, 64)).astype(BF16)
    row = np.concatenate([codes, np.broadcast_to(scales.view(np.uint8), (3, 16)),
                          rope.view(np.uint8)], axis=1)
    assert row.shape == (3, 656)
    got = fp8.dequantize(row, "v32")
    latent = codes.view(E4M3).astype(np.float64).reshape(3, 4, 128) * scales[:, None]
    assert np.array_equal(got[:, :512], latent.reshape(3, 512))
    assert np.array_equal(got[:, 512:], rope.astype(np.float64))


@pytest.mark.parametrize("layout", ["e4m3", "v32"])
@pytest.mark.parametrize("dtype", [BF16, np.float16, np.float32])
def test_quantizer_error_and_round_trip(layout, dtype, rng):
    """The error is at most half a code step (16 code units at the top, times the scale), the
    report says what dequantize says, and quantizing the dequantized values changes no value."""
    kv = (rng.standard_normal((2, 5, 576)) * rng.uniform(1e-3, 1e3, (2, 5, 1))).astype(dtype)
    codes, kv_scale, err = fp8.quantize(kv, layout)
    x = kv.astype(np.float64)
    deq = fp8.dequantize(codes, layout, kv_scale)
    if layout == "e4m3":
        assert kv_scale == pytest.approx(np.abs(x).max() / 448, rel=1e-6)
        assert codes.dtype == E4M3 and codes.shape == kv.shape
        bound = 16 * kv_scale * (1 + 1e-6)  # (x / kv_scale is rounded to float32 first)
    else:
        assert kv_scale is None and codes.shape == (2, 5, 656)
        s = np.ascontiguousarray(codes[..., 512:528]).view(np.float32)            # [2, 5, 4]
        assert np.all(np.log2(s) == np.round(np.log2(s)))                           # powers of 2
        bound = np.concatenate([np.repeat(16 * s.astype(np.float64), 128, axis=-1),
                                np.abs(x[..., 512:]) * 2.0**-8], axis=-1)
        assert np.all(np.abs(x[..., :512]).reshape(2, 5, 4, 128).max(-1) <= 448 * s)
    assert np.all(np.abs(deq - x) <= bound)
    assert err["max_abs"] == np.abs(deq - x).max()
    assert err["max_rel"] == pytest.approx(np.abs(deq - x).max() / np.abs(x).max())
    assert 0 < err["rms_rel"] < 0.05
    again, s2, _ = fp8.quantize(deq.astype(np.float32), layout, kv_scale)
    assert np.array_equal(fp8.dequantize(again, layout, s2), deq)


def test_quantizer_saturates_and_keeps_nan():
    kv = np.zeros((1, 576), np.float32)
    kv[0, :3] = [1000.0, -1000.0, np.nan]
    codes, s, _ = fp8.quantize(kv, "e4m3", 1.0)
    got = fp8.dequantize(codes, "e4m3", s)[0, :4]
    assert got[0] == 448 and got[1] == -448 and np.isnan(got[2]) and got[3] == 0


@KERNEL
@pytest.mark.parametrize("layout", ["e4m3", "v32"])
@pytest.mark.parametrize("dtype", [BF16, np.float16])
def test_device_quantizer_matches_host(layout, dtype, rng):
    """The GPU quantizer writes the host quantizer's bytes and scale, code for code."""
    from numba import cuda

    kv = (rng.standard_normal((3, 576)) * rng.uniform(1e-2, 1e2, (3, 1))).astype(dtype)
    kv[1, :128] = 0                                            # an all-zero group: scale 1
    host, hs, herr = fp8.quantize(kv, layout)
    # (Numba copies no bfloat16 host array: the bits go as int16 and are seen as dtype again)
    dev, ds, derr = fp8.quantize(cuda.to_device(kv.view(np.int16)).view(dtype), layout)
    assert np.array_equal(dev.copy_to_host(), np.asarray(host).view(np.uint8))
    assert hs == ds and herr == derr


# ---------------------------------------------------------------------------------------------
# Bad input: refused before anything runs, the argument named
# ---------------------------------------------------------------------------------------------
def _codes(width=576, dtype=E4M3):
    return np.zeros((1, 4, width), np.uint8).view(dtype)


LENGTHS = np.array([4], np.int32)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(), ValueError, "kv_scale: an FP8 cache of layout 'e4m3' needs"),
    (dict(kv_scale=float("nan")), ValueError, "kv_scale: expected a finite"),
    (dict(kv_scale=float("inf")), ValueError, "kv_scale: expected a finite"),
    (dict(kv_scale=0.0), ValueError, "kv_scale: expected a finite"),
    (dict(kv_scale=-0.5), ValueError, "kv_scale: expected a finite"),
    (dict(kv_scale=1e-45), ValueError, "kv_scale: expected a finite"),    # subnormal in f32
    (dict(kv_scale="1"), TypeError, "kv_scale: expected a float"),
    (dict(kv_scale=1.0, fp8_layout="v32"), ValueError, "kv_scale: the 'v32' layout"),
    (dict(fp8_layout="v33"), ValueError, "fp8_layout: expected one of"),
], ids=["missing", "nan", "inf", "zero", "negative", "subnormal", "str", "v32+scale", "layout"])
def test_bad_scale_or_layout(kwargs, error, match):
    storage = _codes(656 if kwargs.get("fp8_layout") == "v32" else 576)
    with pytest.raises(error, match=match):
        nm.ContiguousKVCache(storage, LENGTHS, **kwargs)


@pytest.mark.parametrize("storage,kwargs,error,match", [
    (_codes(656), dict(kv_scale=1.0), ValueError, r"kv: the 'e4m3' layout expects shape \[\*, \*, 576\].*'v32'"),
    (_codes(576), dict(fp8_layout="v32"), ValueError, r"kv: the 'v32' layout expects shape \[\*, \*, 656\]"),
    (_codes(600, np.uint8), dict(kv_scale=1.0), ValueError, "kv: the 'e4m3' layout expects"),
    (np.zeros((1, 4, 576), np.int8), dict(kv_scale=1.0), TypeError, "kv: an FP8 cache expects dtype"),
    (np.zeros((1, 4, 576), BF16), dict(kv_scale=1.0), TypeError, "kv: an FP8 cache expects dtype"),
    (_codes(576), dict(), ValueError, "kv_scale"),
], ids=["656-as-e4m3", "576-as-v32", "width", "int8", "bf16+scale", "uint8-no-scale"])
def test_bad_storage(storage, kwargs, error, match):
    with pytest.raises(error, match=match):
        nm.ContiguousKVCache(storage, LENGTHS, **kwargs)


def test_bad_storage_paged_names_pages():
    with pytest.raises(ValueError, match="pages: the 'v32' layout expects"):
        nm.PagedKVCache(_codes(576), np.zeros((1, 1), np.int32), LENGTHS, fp8_layout="v32")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, E4M3])
def test_q_must_be_16_bit(dtype):
    cache = nm.ContiguousKVCache(_codes(), LENGTHS, kv_scale=1.0)
    q = np.zeros((1, 1, 2, 576), np.float32).astype(dtype)
    with pytest.raises(TypeError, match="q: an FP8 cache needs q in bfloat16 or float16"):
        nm.mla_decode(q, cache, 0.1, backend="simt")


def test_mma_backend_refused_for_v32():
    """The wgmma kernel reads "e4m3" rows, not "v32" ones: refused by name, before a launch."""
    cache = nm.ContiguousKVCache(_codes(656), LENGTHS, fp8_layout="v32")
    q = np.zeros((1, 1, 2, 576), BF16)
    out = np.full((1, 1, 2, 512), 7.0, BF16)
    with pytest.raises(ValueError, match="backend: 'mma' reads FP8 caches of the 'e4m3' layout"):
        nm.mla_decode(q, cache, 0.1, backend="mma", out=out)
    assert (out.astype(np.float32) == 7.0).all()


# ---------------------------------------------------------------------------------------------
# The FMA kernel on FP8 caches
# ---------------------------------------------------------------------------------------------
def fp8_problem(rng, layout, B, Sq, H, lengths, dtype, cache, ragged=False):
    """make_problem's problem with its cache quantized into ``layout`` (NaN slots stay NaN)."""
    kind = "contiguous" if cache == "contiguous" else "paged"
    page = int(cache[5:]) if kind == "paged" else 16
    counts = None
    if ragged:  # Sq rows where there are keys, but 1 in the first sequence
        counts = np.where(np.asarray(lengths) > 0, Sq, 0)
        counts[0] = min(counts[0], 1)
    p = make_problem(rng, B, Sq, H, np.asarray(lengths, np.int32), dtype, kind, page,
                     ragged=ragged, q_counts=counts)
    return with_fp8_cache(p, layout)


def check(p, mask, score_mod, num_partitions, backend="simt"):
    golden, same = references(p, mask, score_mod)
    out = np.full(p.out_shape, np.nan, p.dtype)
    got, lse = p.run(nm, mask=mask, score_mod=score_mod, num_partitions=num_partitions,
                     return_lse=True, out=out, backend=backend)
    assert got is out
    ran = backend
    if backend == "auto":  # ("auto"'s kernel for FP8 caches in the simulator, an sm_90 stand-in)
        ran = "mma" if p.cache.fp8_layout == "e4m3" else "mma_sync"
    assert_three_way(out, same[0], golden[0], floor=fp32_floor(golden[0], ran), what="out")
    assert_three_way(lse, same[1], golden[1], floor=fp32_floor(golden[1], ran), what="lse")


_MASKS = [c.id for c in MASK_CASES if "scalar" not in c.id]
_MODS = [c.id for c in SCORE_MOD_CASES if "scalar" not in c.id]
_CACHES = ["contiguous", "paged1", "paged5", "paged16"]
# (layout, dtype, Sq, H, lengths, num_partitions, ragged) cycled beside the masks: one key
# tile a block (each costs seconds in the simulator) and a sequence without keys (its blocks
# leave at once), but for one split-K case (2 partitions over 2 tiles, beside a one-key
# sequence); a 32-row block (Sq 2 x H 9 = 18 rows).
_SHAPES = [
    ("e4m3", BF16, 1, 2, [0, 20], 1, False),
    ("v32", np.float16, 2, 1, [0, 31], 1, True),
    ("e4m3", np.float16, 1, 1, [1, 45], 2, False),
    ("v32", BF16, 2, 9, [0, 12], 1, False),
    ("v32", BF16, 1, 3, [30, 0], 1, True),
    ("e4m3", BF16, 2, 1, [0, 17], 1, False),
    ("v32", np.float16, 1, 2, [9, 0], 1, False),
    ("e4m3", np.float16, 2, 2, [0, 8], 1, True),
    ("e4m3", BF16, 1, 4, [0, 32], 1, False),
    ("v32", BF16, 1, 1, [0, 25], 1, False),
]
FP8_CASES = [(m, _MODS[j % len(_MODS)], _CACHES[j % len(_CACHES)]) + _SHAPES[j % len(_SHAPES)]
             for j, m in enumerate(_MASKS)]


def test_fp8_cases_cover_every_factor_value():
    cols = list(zip(*FP8_CASES))
    assert set(cols[0]) == set(_MASKS) and set(cols[1]) == set(_MODS)
    assert set(cols[2]) == set(_CACHES) and set(cols[3]) == {"e4m3", "v32"}
    assert set(cols[8]) == {1, 2} and set(cols[9]) == {False, True}


@KERNEL
@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: "-".join(map(str, c[:4])))
def test_fp8_kernel(case, rng):
    mask_id, mod_id, cache, layout, dtype, Sq, H, lengths, P, ragged = case
    p = fp8_problem(rng, layout, len(lengths), Sq, H, lengths, dtype, cache, ragged)
    check(p, MASKS[mask_id].make(p, rng), SCORE_MODS[mod_id].make(p), P)


@KERNEL
@pytest.mark.parametrize("layout,cache,mask_id,mod_id", [
    ("e4m3", "paged5", "causal", "alibi"), ("v32", "contiguous", "bias_B_H_Sq_S", "softcap")])
def test_fp8_simple_kernel(layout, cache, mask_id, mod_id, rng):
    """The readable kernel (backend "simple") dequantizes as it copies a tile; split-K over
    2 tiles of 8 keys beside an empty sequence."""
    p = fp8_problem(rng, layout, 2, 1, 3, [0, 13], np.float16, cache)
    check(p, MASKS[mask_id].make(p, rng), SCORE_MODS[mod_id].make(p), 2, "simple")


@KERNEL
@pytest.mark.parametrize("layout,cache", [("e4m3", "paged5"), ("v32", "contiguous")])
def test_fp8_warp_split_k(layout, cache, rng):
    """decoding_warp_split_k on an FP8 cache runs the simple kernel's warp split-K variant
    (kernels/warpsplit.py), which dequantizes as it copies, as the simple kernel does; split
    over blocks too, beside an empty sequence."""
    p = fp8_problem(rng, layout, 2, 1, 3, [0, 13], BF16, cache)
    mask, score_mod = nm.CausalMask(), nm.AlibiScoreMod(3)
    golden, same = references(p, mask, score_mod)
    assert p.warp_split_plan(mask, score_mod).spec.backend == "warpsplit"
    output = np.full(p.out_shape, np.nan, p.dtype)
    nm.flare_mla_decoding(output, p.q, p.cache, mask, score_mod, None, p.scale, 2,
                          use_score_mod=True, decoding_warp_split_k=True)
    assert_three_way(output, same[0], golden[0], floor=fp32_floor(golden[0], "warpsplit"),
                     what="output")


def spy_mma_sync_staged(monkeypatch, smem_per_block=None, shapes=None):
    """Record the ``staged`` of every mma_sync kernel the selector asks for (and in ``shapes``,
    if given, its ``(block_m, wide, staged)``); with ``smem_per_block``, the device's limit
    seen as that many bytes."""
    from numba_mla import factory, heuristics

    seen, real = [], factory.mma_sync_partition_kernel

    def spy(*args, **kwargs):
        seen.append(int(args[9] if len(args) > 9 else kwargs.get("staged", 0)))
        if shapes is not None:
            shapes.append((args[4], bool(args[8]), seen[-1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(factory, "mma_sync_partition_kernel", spy)
    if smem_per_block is not None:
        monkeypatch.setattr(heuristics, "smem_per_block", lambda: smem_per_block)
    return seen


@KERNEL
@pytest.mark.parametrize("layout,cache,mask_id,mod_id,smem,backend", [
    ("v32", "paged5", "causal", "alibi", None, "auto"),
    ("v32", "contiguous", "bias_B_H_Sq_S", "softcap", 144000, "mma_sync"),
    ("e4m3", "contiguous", "window3", "softcap", 101376, "mma_sync"),
    ("v32", "paged16", "causal", "alibi", 101376, "mma_sync")])
def test_fp8_mma_sync_kernel(layout, cache, mask_id, mod_id, smem, backend, rng, monkeypatch):
    """The warp tensor-core kernel (backend "mma_sync", and "auto"'s choice for "v32" rows)
    converts FP8 rows to q's 16-bit type: copied as they are into shared memory and converted
    there where a block has room (an H100/H200 and the simulator: the 32-row block; ``smem``
    144000: a device that takes only the 16-row one), else (``smem`` 101376: an Ada GPU's
    99 KB a block) loaded and converted by the warps; split-K in 2 partitions beside an empty
    sequence."""
    seen = spy_mma_sync_staged(monkeypatch, smem)
    p = fp8_problem(rng, layout, 2, 1, 3, [0, 13], np.float16 if layout == "e4m3" else BF16,
                    cache)
    check(p, MASKS[mask_id].make(p, rng), SCORE_MODS[mod_id].make(p), 2, backend)
    # (raw stages: two for "e4m3" rows where they fit, one for "v32"; none where the warps
    # load the rows)
    assert seen and set(seen) == {{None: 2 if layout == "e4m3" else 1, 144000: 1, 101376: 0}[smem]}


@KERNEL
def test_fp8_mma_sync_32_rows(rng, monkeypatch):
    """FP8 rows into the warp tensor-core kernel's 32-row block (20 heads: rows of both m16
    tiles), staged through shared memory, one partition of two tiles."""
    shapes = []
    spy_mma_sync_staged(monkeypatch, shapes=shapes)
    p = fp8_problem(rng, "e4m3", 1, 1, 20, [100], BF16, "paged5")
    check(p, MASKS["causal"].make(p, rng), SCORE_MODS["softcap"].make(p), 1, "mma_sync")
    assert shapes and {(m, staged) for m, _, staged in shapes} == {(32, 2)}


@KERNEL
@pytest.mark.parametrize("block_m,H,window,parts", [(16, 3, 120, 1), (32, 20, 200, 2)])
def test_fp8_mma_sync_two_raw_stages(block_m, H, window, parts, rng, monkeypatch):
    """Two Fs stages (an H100/H200: the next two tiles' FP8 rows in flight while this one is
    converted and multiplied), after tiles a window skips: 3 tiles of 6 in one partition (the
    first two copy the tile after the next, the last finds none: an empty copy group), and,
    in the 32-row block, 4 in two partitions of two (both copied before the first tile)."""
    from numba_mla import heuristics

    if block_m == 16:  # (the 16-row block, half the simulated threads, takes two stages too)
        monkeypatch.setattr(heuristics, "mma_sync_block_m", lambda *a, **k: 16)
    shapes = []
    spy_mma_sync_staged(monkeypatch, shapes=shapes)
    p = fp8_problem(rng, "e4m3", 1, 1, H, [330], BF16, "paged16")
    check(p, nm.SlidingWindowCausalMask(window), nm.IdentityScoreMod(), parts, "mma_sync")
    assert shapes and {(m, staged) for m, _, staged in shapes} == {(block_m, 2)}


@KERNEL
@pytest.mark.parametrize("dtype,cache,lengths,window,parts", [
    (BF16, "paged96", [200], 100, 1), (np.float16, "paged16", [0, 330], 100, 2)])
def test_fp8_mma_kernel(dtype, cache, lengths, window, parts, rng, monkeypatch):
    """The wgmma kernel (backend "mma") on "e4m3" rows: copied as they are by cp.async (also
    where the cache would give TMA tiles), two tiles ahead, and converted into its KV buffer
    a group of dims at a time under the S steps of the group before; the cache's scale
    multiplies the scores and the output. A window keeps 3 tiles after a skipped one (the
    first two copy the tile after the next, the last finds none); with pages of 96 keys the
    first kept tile straddles two pages (a lookup a row) and the other two lie in one (one
    lookup a tile). Split in two beside an empty sequence, pages of 16 (GPU: in CI, the
    first case). (The transposed kernel is turned off past 16 rows, as
    ``TRANSPOSED_PAST_16 = 0`` would choose.)"""
    from numba_mla import selector

    monkeypatch.setattr(selector, "TRANSPOSED_PAST_16", 0)
    seen = spy_lockstep(monkeypatch)
    p = fp8_problem(rng, "e4m3", len(lengths), 1, 17, lengths, dtype, cache)
    check(p, nm.SlidingWindowCausalMask(window), nm.IdentityScoreMod(), parts, "mma")
    assert seen and set(seen) == {(False, "e4m3")}  # cp.async tiles, FP8 rows


def spy_lockstep(monkeypatch):
    """Record ``(tma, fp8)`` of every lockstep wgmma kernel the selector asks for."""
    # (mask, score_mod, tag, cache_cls, heads, direct, tma, fp8)
    return spy_factory(monkeypatch, "mma_partition_kernel", lambda a, kw: a[6:8])


def spy_transposed(monkeypatch):
    """Record ``(tag, heads, direct, block_m, v_ahead)`` of every transposed kernel the selector
    asks for."""
    # (mask, score_mod, tag, cache_cls, heads, direct, block_m, v_ahead)
    return spy_factory(monkeypatch, "transposed_partition_kernel",
                       lambda a, kw: (a[2], a[4], a[5], a[6], a[7]))


@KERNEL
@pytest.mark.parametrize("dtype,cache,Sq,H,lengths,mask_id,mod_id,parts", [
    (BF16, "paged64", 1, 16, [200], "null", "identity", 1),
    (np.float16, "paged16", 1, 3, [0, 330], "window100", "identity", 2),
    (BF16, "contiguous", 2, 8, [150], "causal", "identity", 3),
    (BF16, "paged64", 1, 16, [250], "null", "alibi", 1),
    (BF16, "paged64", 1, 32, [200], "null", "identity", 1),
    (np.float16, "paged16", 2, 20, [0, 330], "window100", "identity", 2),
    (BF16, "contiguous", 4, 8, [150], "causal", "identity", 3),
    (BF16, "paged64", 1, 40, [250], "null", "alibi", 1),
    (BF16, "paged64", 1, 40, [0, 130], "null", "identity", 1)])
def test_fp8_transposed_kernel(dtype, cache, Sq, H, lengths, mask_id, mod_id, parts, rng,
                               monkeypatch):
    """The transposed kernel (kernels/transposed.py: "mma" on "e4m3" rows at up to 16 query
    rows a sequence; S^T = K Q^T and O^T = V^T P^T with both A operands converted from the
    codes in registers): four tiles in one partition, the first three whole pages of 64 (one
    copy a tile, no test a piece) and a short last one; pages of 16 (each piece's row looked
    up) under a window (tiles the mask keeps in part), split in two beside an empty
    sequence; two query tokens of 8 heads (16 rows, two positions) under a causal mask in
    three partitions of one tile each (64, 64 and 22 keys: a run that ends inside the
    tile); ALiBi's slopes over four tiles, whose rising scores move the running maximum past
    its slack, so that O^T's columns are rescaled (hundreds of times a block). Past 16 query
    rows a sequence the same four in blocks of 32 rows: 32 heads (one whole block); two
    tokens of 20 heads (40 rows: a whole block and one of 8); four tokens of 8 heads (32 rows,
    four positions); 40 heads (a whole block and one of 8); and 40 heads beside an empty
    sequence in one partition (its blocks run no tile and write zeros themselves). (Past 32
    rows the 32-row block is kept here: the 64-row block has a test of its own.)"""
    from numba_mla import selector

    monkeypatch.setattr(selector, "TRANSPOSED_PAST_32", 32)
    blocks = run_transposed(rng, monkeypatch, dtype, cache, Sq, H, lengths, mask_id, mod_id,
                            parts)
    assert blocks == {16 if Sq * H <= 16 else 32}


def run_transposed(rng, monkeypatch, dtype, cache, Sq, H, lengths, mask_id, mod_id, parts):
    """One case of the transposed kernel's tests under "mma" against the reference; checks
    that the transposed kernel ran for q's type and H, writing ``out`` itself exactly where
    there is one partition, loading V's codes a step ahead in its blocks of 32 and 64 rows
    and at their step only where that build spilled (on a GPU: the 32-row block under a
    causal mask at four tokens of 8 heads did on the H100 at d64a3d2; the simulator never
    spills: the other form has its test), and returns the row counts a block it ran."""
    from numba_mla import launch, selector

    monkeypatch.setattr(selector, "SEESAW_E4M3", False)  # (its own tests: test_fp8_seesaw_*)
    seen = spy_transposed(monkeypatch)
    spilled, real = [], launch._Launch.spills
    monkeypatch.setattr(launch._Launch, "spills",
                        lambda self: spilled.append(real(self)) or spilled[-1])
    run_mma_case(rng, dtype, cache, Sq, H, lengths, mask_id, mod_id, parts)
    assert seen and {s[:2] for s in seen} == {("bf16" if dtype == BF16 else "f16", H)}
    assert {s[2] for s in seen} == {parts == 1}
    assert all(s[4] is None for s in seen if s[3] <= 16)
    ahead = [s[4] for s in seen if s[3] > 16]  # each step-ahead build checked for spills,
    # and the at-its-step form asked for once for each that spilled
    assert set(ahead) <= {selector.TRANSPOSED_V_AHEAD, None}
    assert ahead.count(selector.TRANSPOSED_V_AHEAD) == len(spilled)
    assert ahead.count(None) == sum(spilled)
    return {s[3] for s in seen}


def run_mma_case(rng, dtype, cache, Sq, H, lengths, mask_id, mod_id, parts):
    """A problem on "e4m3" rows under "mma" against the reference ("window100": a sliding
    window of 100 keys; else a mask of MASKS)."""
    p = fp8_problem(rng, "e4m3", len(lengths), Sq, H, lengths, dtype, cache)
    mask = (nm.SlidingWindowCausalMask(100) if mask_id == "window100"
            else MASKS[mask_id].make(p, rng))
    check(p, mask, SCORE_MODS[mod_id].make(p), parts, "mma")


@KERNEL
@pytest.mark.parametrize("dtype,cache,Sq,H,lengths,mask_id,mod_id,parts", [
    (BF16, "paged64", 1, 64, [200], "null", "identity", 1),
    (np.float16, "paged16", 2, 20, [0, 330], "window100", "identity", 2),
    (BF16, "contiguous", 1, 72, [150], "causal", "softcap", 3),
    (BF16, "paged64", 1, 64, [250], "null", "alibi", 1),
    (BF16, "paged64", 1, 70, [0, 130], "null", "identity", 1)])
def test_fp8_transposed_64_rows(dtype, cache, Sq, H, lengths, mask_id, mod_id, parts, rng,
                                monkeypatch):
    """The transposed kernel's 64-row block (past 32 query rows a sequence): two warpgroups,
    each S^T over half the dims, the partial sums added through shared memory, each the
    softmax of its half of the columns and O^T over half the output dims. 64 heads over four
    tiles (three whole pages); two tokens of 20 heads (40 rows: one block, 24 rows empty) on
    pages of 16 under a window in two partitions beside an empty sequence; 72 heads (a whole
    block and one of 8) causal with a soft cap in three partitions (a run that ends inside a
    tile); ALiBi over four tiles at 64 heads (the running max moves in every column: both
    warpgroups rescale O^T's columns from the factors the other found); 70 heads beside an
    empty sequence (blocks that run no tile and write zeros themselves)."""
    blocks = run_transposed(rng, monkeypatch, dtype, cache, Sq, H, lengths, mask_id, mod_id,
                            parts)
    assert blocks == {64}


@KERNEL
@pytest.mark.parametrize("block", [32, 64])
def test_fp8_transposed_v_at_its_step_where_ahead_spills(block, rng, monkeypatch):
    """The 32-row block (and the 64-row one) loads V's codes a step ahead
    (selector.TRANSPOSED_V_AHEAD) where that build uses no local memory (run_transposed
    checks it in every case above), and else in the block's own form, at their step: that
    form gives the reference's result too (the simulator never spills, so the fallback is
    made to happen): 130 keys in two partitions, two whole tiles and then a tile of two keys."""
    from numba_mla import launch, selector

    monkeypatch.setattr(selector, "TRANSPOSED_PAST_32", block)
    monkeypatch.setattr(selector, "SEESAW_E4M3", False)
    monkeypatch.setattr(launch._Launch, "spills", lambda self: True)
    seen = spy_transposed(monkeypatch)
    p = fp8_problem(rng, "e4m3", 1, 1, 40, [130], BF16, "paged64")
    check(p, nm.CausalMask(), SCORE_MODS["softcap"].make(p), 2, "mma")
    assert [s[4] for s in seen] == [selector.TRANSPOSED_V_AHEAD, None]
    assert {s[3] for s in seen} == {block}


def spy_seesaw(monkeypatch):
    """Record ``(tag, heads, direct, fp8)`` of every seesaw kernel the selector asks for."""
    # (mask, score_mod, tag, cache_cls, heads, direct, listed; fp8=)
    return spy_factory(monkeypatch, "seesaw_partition_kernel",
                       lambda a, kw: (a[2], a[4], a[5], kw.get("fp8")))


@KERNEL
@pytest.mark.parametrize("dtype,cache,Sq,H,lengths,mask_id,mod_id,parts", [
    (BF16, "paged64", 1, 64, [300], "null", "identity", 1),
    (np.float16, "contiguous", 2, 20, [0, 330], "window100", "identity", 2),
    (BF16, "contiguous", 1, 72, [150], "causal", "softcap", 3),
    (BF16, "paged64", 1, 64, [250], "null", "alibi", 1),
    (BF16, "paged128", 1, 70, [0, 130], "null", "identity", 1)])
def test_fp8_seesaw_kernel(dtype, cache, Sq, H, lengths, mask_id, mod_id, parts, rng,
                           monkeypatch):
    """The seesaw kernel on "e4m3" rows (past 32 query rows a sequence, on tiles that lie in
    one page): each tile's codes land inside its 16-bit buffer and the warpgroup that scores
    it converts them in place, a box at a time. 64 heads over five tiles in one partition
    (both buffers refilled, the third pair without a second tile, a short last tile); two
    tokens of 20 heads on a contiguous cache under a window (tiles kept in part) in two
    partitions beside an empty sequence; 72 heads (a whole block and one of 8) causal with a
    soft cap in three partitions of one tile each; ALiBi over four tiles (the running max
    moves: both warpgroups rescale); 70 heads beside an empty sequence on pages of 128
    (blocks that run no tile write zeros themselves)."""
    from numba_mla import selector

    assert selector.SEESAW_E4M3
    seen = spy_seesaw(monkeypatch)
    tr = spy_transposed(monkeypatch)
    run_mma_case(rng, dtype, cache, Sq, H, lengths, mask_id, mod_id, parts)
    assert set(seen) == {("bf16" if dtype == BF16 else "f16", H, parts == 1, "e4m3")}
    assert not tr


@KERNEL
@pytest.mark.parametrize("lengths,mod_id", [([9 * 64 - 5], "alibi"), ([300], "identity")])
def test_fp8_seesaw_kernel_softmax_path(lengths, mod_id, rng, monkeypatch):
    """seesaw.E4M3_TOO (on): the 16-bit rows' softmax path from LAG_HEADS heads (2^x by
    ex2.approx.ftz, the refills' rows looked up a pair early) on "e4m3" rows: 64 heads over
    nine tiles on shuffled pages (the carried rows of four pairs) with ALiBi (each key's score
    depends on its position, so that two tiles' rows swapped would not give the same output),
    and over five tiles (the last pair of one) match the reference."""
    from numba_mla.kernels import seesaw

    monkeypatch.setattr(seesaw, "E4M3_TOO", True)
    seen = spy_seesaw(monkeypatch)
    run_mma_case(rng, BF16, "paged64", 1, seesaw.LAG_HEADS, lengths, "null", mod_id, 1)
    assert set(seen) == {("bf16", seesaw.LAG_HEADS, True, "e4m3")}


@KERNEL
@pytest.mark.parametrize("parts", [1, 2])
def test_fp8_seesaw_kernel_max_early1(parts, rng, monkeypatch):
    """seesaw.MAX_EARLY1 (off: an experiment) on "e4m3" rows: warpgroup 1's tile maxima
    stored before its wait at SCALE0; 64 heads over nine tiles on shuffled pages with ALiBi,
    in one partition and in two, match the reference, and the seesaw build ran."""
    from numba_mla.kernels import seesaw

    monkeypatch.setattr(seesaw, "MAX_EARLY1", True)
    seen = spy_seesaw(monkeypatch)
    run_mma_case(rng, BF16, "paged64", 1, seesaw.LAG_HEADS, [9 * 64 - 5], "null", "alibi",
                 parts)
    assert set(seen) == {("bf16", seesaw.LAG_HEADS, parts == 1, "e4m3")}


@KERNEL
@pytest.mark.parametrize("parts,lengths", [(1, [9 * 64 - 5]), (2, [9 * 64 - 5]),
                                           (1, [5 * 64, 0])])
def test_fp8_seesaw_kernel_s8_loop(parts, lengths, rng, monkeypatch):
    """``qk8`` as a loop over the boxes (seesaw.S8_UNROLL False; the default writes each box's
    read of its codes, S over the box before and its conversion out box by box, in both
    buffers' orders, and is what every other "e4m3" seesaw test runs) on "e4m3" rows: 64
    heads over nine tiles (the last partial) on shuffled pages with ALiBi, in one partition
    and in two, and five whole tiles beside an empty sequence, match the reference, and the
    seesaw build of the loop ran."""
    from numba_mla.kernels import seesaw

    assert seesaw.S8_UNROLL
    monkeypatch.setattr(seesaw, "S8_UNROLL", False)
    seen = spy_seesaw(monkeypatch)
    run_mma_case(rng, BF16, "paged64", 1, seesaw.LAG_HEADS, lengths, "null", "alibi", parts)
    assert set(seen) == {("bf16", seesaw.LAG_HEADS, parts == 1, "e4m3")}
    built = [d.s8_unroll for d in spy_factory.kernels["seesaw_partition_kernel"]]
    assert built and not any(built), "expected the e4m3 seesaw build of qk8's loop"


@KERNEL
@pytest.mark.parametrize("flags,parts,lengths,mask_id,order", [
    (("S8_PAIRS",), 1, [9 * 64 - 5], "null", "high"),
    (("S8_PAIRS",), 1, [9 * 64 - 5], "null", "low"),
    (("S8_PAIRS",), 2, [9 * 64 - 5, 5 * 64], "causal", "high"),
    (("S8_PAIRS",), 1, [5 * 64, 0], "null", "low"),
    (("CODES_WIDE",), 1, [9 * 64 - 5], "null", "high"),
    (("CODES_WIDE",), 2, [9 * 64 - 5, 5 * 64], "causal", "low"),
    (("S8_PAIRS", "CODES_WIDE"), 1, [9 * 64 - 5], "null", "low"),
    (("S8_PAIRS", "CODES_WIDE"), 1, [5 * 64, 0], "null", "high"),
    (("STAGE8",), 1, [9 * 64 - 5], "null", "high+late"),
    (("STAGE8",), 1, [9 * 64 - 5], "null", "low+late"),
    (("STAGE8",), 2, [9 * 64 - 5, 5 * 64], "causal", "high"),
    (("STAGE8",), 1, [13 * 64 - 7, 3 * 64, 0], "null", "low"),
    (("STAGE8", "S8_PAIRS", "CODES_WIDE"), 1, [9 * 64 - 5], "null", "high"),
    (("STAGE8", "S8_PAIRS"), 2, [13 * 64 - 7, 5 * 64], "causal", "low")],
    ids=lambda v: "+".join(f.lower() for f in v) if isinstance(v, tuple) else None)
def test_fp8_seesaw_kernel_qk8_forms(flags, parts, lengths, mask_id, order, rng, monkeypatch):
    """``qk8``'s forms off by default, alone and together, on "e4m3" rows: a tile's boxes
    converted two at a time (seesaw.S8_PAIRS: one barrier and one fence a pair, S over the
    pair before), each box's codes read 16 bytes a load (seesaw.CODES_WIDE: four threads a
    key, each writing two 16-byte chunks of values, the second at the first's address ^ 16
    in the swizzled row), and buffer 0's boxes 4 and 5 staged early (seesaw.STAGE8:
    their values written only once warpgroup 1 says their place is free; 13 tiles give
    six pairs after the first). 64 heads over nine tiles (the last partial) on shuffled pages, in
    one partition and, causal beside five whole tiles, in two, and five whole tiles beside an
    empty sequence, with the lower or the higher warps run first by the simulator, match the
    reference, and the seesaw build of the flags named ran. Both buffers' conversion orders
    are walked (the two warpgroups' tiles), so a pair that issued S before its barrier or
    read a box's codes after another box was written, a chunk written to the wrong place of
    its row, or a key's codes read from another row, fails here. Two STAGE8 cases run each
    arrival without a wait last ("+late"): warpgroup 0 then reaches box 4 while warpgroup 1's
    P0 V0 still reads that place, so box 4's values written without the wait for warpgroup
    1's word on the FREE0 mbarrier fail them (they passed in the other orders)."""
    from numba_mla import _numba
    from numba_mla.kernels import seesaw

    for flag in ("S8_PAIRS", "CODES_WIDE", "STAGE8"):
        monkeypatch.setattr(seesaw, flag, flag in flags)
    seen = spy_seesaw(monkeypatch)
    with _numba.sim_turn_order(order):
        run_mma_case(rng, BF16, "paged64", 1, seesaw.LAG_HEADS, lengths, mask_id, "identity",
                     parts)
    assert set(seen) == {("bf16", seesaw.LAG_HEADS, parts == 1, "e4m3")}
    built = [(d.s8_pairs, d.codes_wide, d.stage8)
             for d in spy_factory.kernels["seesaw_partition_kernel"]]
    assert built and set(built) == {("S8_PAIRS" in flags, "CODES_WIDE" in flags,
                                     "STAGE8" in flags)}, (
        f"expected the e4m3 seesaw build with {flags}")


@KERNEL
@pytest.mark.parametrize("flags,Sq,mask_id", [
    (("WHOLE_TILES", "EXP_FOLD"), 1, "null"), (("EXP_FOLD",), 2, "causal"),
    (("WHOLE_TILES",), 2, "causal"), ((), 2, "causal")],
    ids=["both-null", "fold-causal", "whole-causal", "neither-causal"])
def test_fp8_seesaw_kernel_score_forms(flags, Sq, mask_id, rng, monkeypatch):
    """seesaw.WHOLE_TILES and seesaw.EXP_FOLD on "e4m3" rows (WHOLE_TILES on for them by
    default, "e4m3"; EXP_FOLD off, kept as a tested form), whose scores' factor has each
    row's power of two as well as the scale, each on and off: 64 heads over nine tiles (the
    last partial) beside five whole ones, on shuffled pages, in two partitions, match the
    reference, and the seesaw build with the flags named (and without the others) ran."""
    from numba_mla.kernels import seesaw

    for flag in ("WHOLE_TILES", "EXP_FOLD"):
        monkeypatch.setattr(seesaw, flag, flag in flags)
    seen = spy_seesaw(monkeypatch)
    run_mma_case(rng, BF16, "paged64", Sq, seesaw.LAG_HEADS, [9 * 64 - 5, 5 * 64], mask_id,
                 "identity", 2)
    assert set(seen) == {("bf16", seesaw.LAG_HEADS, False, "e4m3")}
    built = [(d.whole_tiles, d.exp_fold) for d in spy_factory.kernels["seesaw_partition_kernel"]]
    assert built and set(built) == {("WHOLE_TILES" in flags, "EXP_FOLD" in flags)}


@KERNEL
@pytest.mark.parametrize("dtype,cache,Sq,H,lengths,mask_id,mod_id,parts,order", [
    (BF16, "paged64", 1, 64, [400, 0], "null", "identity", 1, "fifo"),
    (BF16, "paged64", 1, 64, [400, 0], "null", "identity", 1, "warps:2"),
    (np.float16, "contiguous", 2, 40, [450], "causal", "softcap", 2, "fifo")])
def test_fp8_seesaw_converter_kernel(dtype, cache, Sq, H, lengths, mask_id, mod_id, parts, order,
                                     rng, monkeypatch):
    """The seesaw kernel on "e4m3" rows with a third warpgroup that converts every tile in
    place as its codes land (``selector.SEESAW_CONVERTER``): seven tiles in one partition
    beside an empty sequence (both buffers refilled, buffer 1 twice after warpgroup 1 let it
    go, the last pair without a second tile, a short last tile); two tokens of 40 heads
    causal with a soft cap in two partitions of four tiles each (the second ends short). The
    first case again with the threads taking turns in the order of warps that seed 2 draws
    (docs/testing.md; warps 1, 11, 0, 8, 9, 6, 7, 5, 10, 2, 3, 4: three of the converter's
    warps among the first five, warpgroup 1's first warp last): without the handoff that lets
    the converter write buffer 1 only after warpgroup 1's product on it (BAR_FREE1) both
    cases fail in that order (tried; in the default order, and in "low" and "high", they
    pass)."""
    from numba_mla import _numba, selector

    monkeypatch.setattr(selector, "SEESAW_CONVERTER", True)
    seen = spy_factory(monkeypatch, "seesaw_partition_kernel",
                       lambda a, kw: (a[4], kw.get("fp8"), kw.get("converter")))
    with _numba.sim_turn_order(order):
        run_mma_case(rng, dtype, cache, Sq, H, lengths, mask_id, mod_id, parts)
    assert set(seen) == {(H, "e4m3", True)}


@KERNEL
@pytest.mark.parametrize("case", ["rows", "huge", "tiny"])
def test_fp8_seesaw_kernel_scales_q_into_fp16(case, rng, monkeypatch):
    """The seesaw kernel multiplies "e4m3" rows in fp16: bf16 q goes into fp16 times a power
    of two a row, and each row's scores times its own 2^-k. "rows": heads scaled by 2^-6 ..
    2^6 in turn (a row multiplied back by another's 2^-k would be off by up to 2^12);
    "huge": a row past fp16's largest value (1e6), one spanning 12 decades, one of zeros;
    "tiny": every row 1e-6 (below fp16's normal range), the softmax scale times 1e6."""
    seen = spy_seesaw(monkeypatch)
    p = fp8_problem(rng, "e4m3", 1, 1, 40, [100], BF16, "paged64")
    q = np.array(p.q).astype(np.float32)
    if case == "rows":
        q *= (2.0 ** (np.arange(40) % 13 - 6))[:, None].astype(np.float32)
    elif case == "huge":
        q[..., 0, :] *= 1e6
        q[..., 2, :] *= 10.0 ** rng.uniform(-8, 4, 576)
        q[..., 3, :] = 0
    else:
        q *= 1e-6
        p = dataclasses.replace(p, scale=p.scale * 1e6)
    check(dataclasses.replace(p, q=q.astype(BF16)), nm.NullMask(), nm.IdentityScoreMod(), 1,
          "mma")
    assert seen


def test_seesaw_in_place_conversion_order():
    """Where the seesaw kernel's "e4m3" codes lie, and the order it converts them in: in each
    buffer the 9 boxes of codes lie apart inside the buffer, each in a part that nothing
    still uses when it is copied (buffer 0's boxes 0-3, copied by warpgroup 0 while
    warpgroup 1 multiplies by boxes 4-7 and reads P0 in the rope box: not there; its boxes
    4-8, copied by warpgroup 1 when warpgroup 0 may already write boxes 0-3's values: not
    there; buffer 1's, copied by warpgroup 0 while warpgroup 1 multiplies by boxes 4-7: not
    there), and converting in ``convert_order`` never writes over codes not yet read, except
    a box's own (read before its values are written)."""
    from numba_mla.kernels import seesaw as sw

    copies = {0: ((range(0, 4), range(4, 9)), (range(4, 9), range(0, 4))),
              1: ((range(0, 9), range(4, 8)),)}
    for buf, groups in copies.items():
        order = [sw.convert_order(buf, n) for n in range(sw.NBOX)]
        assert sorted(order) == list(range(sw.NBOX)) and order[-1] == sw.ROPE
        raw = [(sw.raw_at(buf, box), sw.raw_at(buf, box) + sw.RAW_BOX) for box in range(sw.NBOX)]
        assert all(0 <= lo and hi <= sw.ROWS_BYTES for lo, hi in raw)
        assert all(a[1] <= b[0] or b[1] <= a[0] for i, a in enumerate(raw) for b in raw[i + 1:])
        assert sorted(box for boxes, _ in groups for box in boxes) == list(range(sw.NBOX))
        for boxes, busy in groups:
            for lo, hi in (raw[box] for box in boxes):  # (the boxes of values it overlaps)
                assert not set(range(lo // sw.BOX_BYTES, -(-hi // sw.BOX_BYTES))) & set(busy)
        for n, box in enumerate(order):
            lo, hi = sw.BOX_BYTES * box, sw.BOX_BYTES * (box + 1)
            hit = {other for other, (a, b) in enumerate(raw) if a < hi and lo < b}
            assert hit <= set(order[:n + 1]), (buf, box, hit)


@KERNEL
@pytest.mark.parametrize("why", ["pages", "config", "spill"])
def test_fp8_seesaw_kernel_only_where_it_runs(why, rng, monkeypatch):
    """Past 32 rows on "e4m3" rows the transposed kernel's 64-row block runs where the seesaw
    kernel cannot: tiles that straddle pages (pages of 32 keys), a config that names the rows
    a block, or a seesaw build that spills (the simulator never spills: made to here)."""
    from numba_mla import launch

    seen = spy_seesaw(monkeypatch)
    tr = spy_transposed(monkeypatch)
    config = nm.MHAConfig(num_queries_per_block=64) if why == "config" else None
    if why == "spill":
        kernels = spy_factory.kernels["seesaw_partition_kernel"]
        monkeypatch.setattr(launch._Launch, "spills", lambda self: self.dispatcher in kernels)
    p = fp8_problem(rng, "e4m3", 1, 1, 40, [100], BF16, "paged32" if why == "pages" else "paged64")
    golden, same = references(p, nm.NullMask(), nm.IdentityScoreMod())
    out = np.full(p.out_shape, np.nan, p.dtype)
    nm.flare_mla_decoding(out, p.q, p.cache, nm.NullMask(), nm.IdentityScoreMod(), None,
                          p.scale, backend="mma", config=config)
    assert_three_way(out, same[0], golden[0], floor=fp32_floor(golden[0], "mma"), what="out")
    assert {s[3] for s in tr} == {64} and (bool(seen) == (why == "spill"))


@KERNEL
@pytest.mark.parametrize("H", [16, 32])
def test_fp8_transposed_kernel_columns_keep_their_q_scales(H, rng, monkeypatch):
    """Each query row's power of two is its own: heads scaled by 2^-6 .. 2^6 in turn, so that
    a column multiplied back by another column's 2^-k would be off by up to 2^12 (random q
    alone gives nearly one exponent for every row). In both blocks (16 and 32 rows)."""
    seen = spy_transposed(monkeypatch)
    p = fp8_problem(rng, "e4m3", 1, 1, H, [150], BF16, "paged64")
    f = 2.0 ** (np.arange(H) % 13 - 6)
    q = np.array(p.q).astype(np.float32) * f[:, None].astype(np.float32)
    check(dataclasses.replace(p, q=q.astype(BF16)), nm.NullMask(), nm.IdentityScoreMod(), 1,
          "mma")
    assert {s[3] for s in seen} == {H}


@KERNEL
@pytest.mark.parametrize("case", ["huge", "tiny"])
def test_fp8_transposed_kernel_scales_q_into_fp16(case, rng, monkeypatch):
    """bf16 q is copied into fp16 times a power of two a row. "huge": a row whose magnitudes
    pass fp16's largest value (1e6), one spanning 12 decades, one of zeros and an ordinary
    one (without the scale the first is inf in fp16: NaN out); "tiny": every row 1e-6 (below
    fp16's normal range: without the scale its values keep a few bits), the softmax scale
    times 1e6 so the scores still matter. Both give the reference's result."""
    seen = spy_transposed(monkeypatch)
    p = fp8_problem(rng, "e4m3", 1, 1, 4, [90], BF16, "paged64")
    q = np.array(p.q).astype(np.float32)
    if case == "huge":
        q[..., 0, :] *= 1e6
        q[..., 2, :] *= 10.0 ** rng.uniform(-8, 4, 576)
        q[..., 3, :] = 0
        p = dataclasses.replace(p, q=q.astype(BF16))
    else:
        p = dataclasses.replace(p, q=(q * 1e-6).astype(BF16), scale=p.scale * 1e6)
    check(p, nm.NullMask(), nm.IdentityScoreMod(), 1, "mma")
    assert seen


@KERNEL
def test_fp8_transposed_kernel_in_row_groups(rng):
    """A config of 16 rows a block runs the transposed kernel past 16 rows too: 2 tokens x 20
    heads are three row groups of the grid (the last one of 8 rows); and one of 32 at 8 rows
    a sequence runs its 32-row block (24 rows of it past the sequence's)."""
    from numba_mla import checks, launch

    for Sq, H, rows, groups in ((2, 20, 16, 3), (1, 8, 32, 1)):
        p = fp8_problem(rng, "e4m3", 1, Sq, H, [70], BF16, "paged64")
        config = nm.MHAConfig(num_queries_per_block=rows)
        call = checks.check_decode(p.q, p.cache, p.scale, backend="mma")
        call.config = config
        spec = launch.Plan(call).spec
        assert (spec.backend, spec.block_m, spec.groups) == ("transposed", rows, groups)
        golden, same = references(p, nm.NullMask(), nm.IdentityScoreMod())
        out = np.full(p.out_shape, np.nan, p.dtype)
        nm.flare_mla_decoding(out, p.q, p.cache, nm.NullMask(), nm.IdentityScoreMod(), None,
                              p.scale, backend="mma", config=config)
        assert_three_way(out, same[0], golden[0], floor=fp32_floor(golden[0], "mma"),
                         what="out")


def test_fp8_mma_config_rows_refused_naming_both_kernels(rng):
    """"mma" on "e4m3" rows runs 16, 32 or 64 query rows a block (the transposed kernel;
    64 is also the lockstep kernel's, which takes it only where the transposed one cannot):
    a config asking for 8 or 48 is refused naming them, before any launch."""
    from numba_mla import checks, launch

    p = fp8_problem(rng, "e4m3", 1, 1, 16, [70], BF16, "paged64")
    call = checks.check_decode(p.q, p.cache, p.scale, backend="mma")
    for rows, ok in ((48, False), (8, False), (16, True), (32, True), (64, True)):
        call.config = nm.MHAConfig(num_queries_per_block=rows)
        if ok:
            spec = launch.Plan(call).spec
            assert (spec.block_m, spec.backend) == (rows, "transposed")
        else:
            want = rf"the 'mma' kernel for this call runs 64 or 16 or 32, got {rows}"
            with pytest.raises(ValueError, match=r"config\.num_queries_per_block: " + want):
                launch.Plan(call)


def wider_rows(p):
    """``p``'s cache codes as uint8 rows of 592 bytes, the first 576 of each the row's."""
    codes = np.asarray(p.cache.storage).view(np.uint8)
    wide = np.zeros(codes.shape[:2] + (592,), np.uint8)
    wide[..., :576] = codes
    return wide


def test_fp8_config_of_16_rows_on_a_strided_cache(rng, monkeypatch):
    """Where q or the cache is strided (a torch view: ``packed_rows`` false, forced here) only
    the lockstep kernel runs "e4m3" rows under "mma": a config of 16 rows makes "auto" take
    the FMA kernel, and "mma" refuses it naming 64."""
    from numba_mla import checks, launch, selector

    real = selector.ArrayFacts
    monkeypatch.setattr(selector, "ArrayFacts",
                        lambda **kw: real(**dict(kw, packed_rows=False)))
    p = fp8_problem(rng, "e4m3", 1, 1, 16, [70], BF16, "paged64")
    config = nm.MHAConfig(num_queries_per_block=16)
    for backend in ("auto", "mma"):
        call = checks.check_decode(p.q, p.cache, p.scale, backend=backend)
        call.config = config
        if backend == "auto":
            assert launch.Plan(call).spec.backend == "simt"
        else:
            with pytest.raises(ValueError, match=r"config\.num_queries_per_block: the 'mma' "
                                                 r"kernel for this call runs 64, got 16"):
                launch.Plan(call)


@KERNEL
def test_quantize_a_strided_numba_device_array(rng):
    """A strided fp16 Numba device array (rows of 576 inside wider ones) is quantized as it is
    (read as int16 bits: an element of the same size, which Numba allows on strided arrays):
    the codes are the host quantizer's."""
    from numba import cuda

    wide = rng.standard_normal((3, 600)).astype(np.float16)
    codes, kv_scale, _ = fp8.quantize(cuda.to_device(wide)[:, :576], "e4m3")
    want, want_scale = fp8.quantize_host(wide[:, :576], "e4m3")
    got = codes.copy_to_host() if hasattr(codes, "copy_to_host") else np.asarray(codes)
    assert kv_scale == want_scale and np.array_equal(got.view(np.uint8), want.view(np.uint8))


@KERNEL
def test_fp8_strided_device_cache_takes_the_lockstep_kernel(rng, monkeypatch):
    """A device cache whose slots lie further apart than a row (a torch view of a wider
    buffer) is not copied as whole runs of bytes: "mma" runs the lockstep kernel there, which
    finds each row, and the result is the reference's."""
    from helpers import cuda_torch

    torch = cuda_torch()
    seen = spy_transposed(monkeypatch)
    lockstep = spy_lockstep(monkeypatch)
    p = fp8_problem(rng, "e4m3", 1, 1, 4, [90], BF16, "paged64")
    view = torch.from_numpy(wider_rows(p)).cuda()[:, :, :576]
    assert not view.is_contiguous()
    cache = nm.PagedKVCache(view, p.cache.block_table_host, p.lengths,
                            kv_scale=p.cache.kv_scale)
    check(dataclasses.replace(p, cache=cache), nm.NullMask(), nm.IdentityScoreMod(), 1, "mma")
    assert lockstep == [(False, "e4m3")] and not seen


@KERNEL
def test_fp8_strided_numba_device_cache_is_refused(rng):
    """A strided Numba device array cannot be read as words of four codes (Numba changes the
    element type of C-contiguous device arrays only): refused naming cache.storage, before
    any launch, out untouched."""
    from numba import cuda

    p = fp8_problem(rng, "e4m3", 1, 1, 4, [90], BF16, "paged64")
    view = cuda.to_device(wider_rows(p))[:, :, :576]
    cache = nm.PagedKVCache(view, p.cache.block_table_host, p.lengths,
                            kv_scale=p.cache.kv_scale)
    out = np.full(p.out_shape, np.nan, p.dtype)
    with pytest.raises(ValueError, match="cache.storage: a strided Numba or CuPy device array"):
        nm.mla_decode(p.q, cache, p.scale, out=out, backend="mma")
    assert np.isnan(out.astype(np.float32)).all()


def test_transposed_q_image_is_the_fragments_layout():
    """The transposed kernel's Q image puts dims d, d + 1 of query row c where the fragment
    tests' layout (tests/test_fp8_fragments.py, q_image) puts them: the k-step and column
    whose K fragment holds those dims."""
    from test_fp8_fragments import LBO as F_LBO, SBO as F_SBO, STEP_BYTES as F_STEP
    from test_fp8_fragments import physical_dim

    from numba_mla.kernels import transposed

    for c in range(16):
        for step in range(36):
            for k in range(0, 16, 2):
                byte = (step * F_STEP + (c // 8) * F_SBO + (k // 8) * F_LBO + (c % 8) * 16
                        + (k % 8) * 2)
                assert transposed._q_image_byte(c, physical_dim(step, k)) == byte
                # the 32 and 64-row blocks: twice (four times) the k-step, their rows past 16
                # past the first 16's
                for m in (2, 4):
                    for c2 in range(c, 16 * m, 16):
                        byte = (step * m * F_STEP + (c2 // 8) * F_SBO + (k // 8) * F_LBO
                                + (c2 % 8) * 16 + (k % 8) * 2)
                        assert transposed._q_image_byte(c2, physical_dim(step, k),
                                                        m * F_STEP) == byte


def test_byte_perm_twin():
    """prmt's twin: byte k of the result is byte (sel >> 4k) & 7 of (a, b)."""
    from numba_mla.ptx.arith import _byte_perm_twin

    a, b = 0x03020100, 0x07060504
    assert _byte_perm_twin(0x5140)(a, b) == 0x05010400
    assert _byte_perm_twin(0x7362)(a, b) == 0x07030602
    assert _byte_perm_twin(0x3210)(a, -1) == a
    assert _byte_perm_twin(0x7654)(a, -1) == -1


def test_auto_takes_wgmma_for_e4m3(rng):
    """"auto" on an FP8 cache: the wgmma kernels for "e4m3" rows (the transposed one, 16
    query rows a block at up to 16 a sequence, 32 up to 32, 64 past that), the warp
    tensor-core kernel for
    "v32" rows (the simulator stands for an sm_90 GPU);
    nothing is launched."""
    from numba_mla import checks, launch

    for layout, Sq, H, want in (("e4m3", 1, 20, ("transposed", 32)),
                                ("e4m3", 2, 16, ("transposed", 32)),
                                ("e4m3", 1, 33, ("transposed", 64)),
                                ("e4m3", 1, 128, ("transposed", 64)),
                                ("e4m3", 1, 16, ("transposed", 16)),
                                ("e4m3", 1, 1, ("transposed", 16)),
                                ("e4m3", 2, 8, ("transposed", 16)),
                                ("v32", 1, 20, ("mma_sync", None)),
                                ("v32", 1, 1, ("mma_sync", None))):
        p = fp8_problem(rng, layout, 1, Sq, H, [40], BF16, "paged16")
        call = checks.check_decode(p.q, p.cache, p.scale, None, None, None, False, None, "auto")
        spec = launch.Plan(call).spec
        assert (spec.backend, spec.block_m if want[1] else None) == want, (layout, Sq, H)


@KERNEL
def test_fp8_mma_sync_4_byte_copies(rng, monkeypatch):
    """FP8 rows staged by 4-byte cp.async where the cache does not start 16-byte aligned: a
    "v32" row is 164 pieces, not a multiple of the 8 threads that copy a row. (A device whose
    blocks take the 16-row staged block, 135 KB, but not the 32-row one, 151 KB.)"""
    from numba_mla import launch

    monkeypatch.setattr(launch, "_aligned16", lambda dev: False)
    shapes = []
    spy_mma_sync_staged(monkeypatch, smem_per_block=144000, shapes=shapes)
    p = fp8_problem(rng, "v32", 2, 1, 2, [0, 27], BF16, "paged16")
    check(p, nm.CausalMask(), nm.IdentityScoreMod(), 1, "mma_sync")
    assert shapes and set(shapes) == {(16, False, 1)}


@KERNEL
@pytest.mark.parametrize("backend", ["simt", "mma_sync"])
def test_fp8_nan_code_in_a_kept_key(backend, rng, monkeypatch):
    """A NaN code in a kept key's V makes its rows' outputs NaN, as a NaN in a 16-bit cache
    does; the reference and the kernel agree on where (on a GPU the conversions' cvt makes
    the NaN; here their twins, in the 16-row block, half the simulated threads of the
    32-row one the GPU runs)."""
    from numba_mla import _compat, heuristics

    if _compat.SIMULATOR and backend == "mma_sync":
        monkeypatch.setattr(heuristics, "smem_per_block", lambda: 144000)
    p = fp8_problem(rng, "e4m3", 1, 1, 2, [9], BF16, "contiguous")
    codes = np.array(p.cache.storage)
    codes.view(np.uint8)[0, 4, 100] = 0x7F
    c = nm.ContiguousKVCache(codes, p.lengths, kv_scale=p.cache.kv_scale)
    p = dataclasses.replace(p, cache=c)
    check(p, nm.NullMask(), nm.IdentityScoreMod(), 1, backend)


# ---------------------------------------------------------------------------------------------
# GPU only: the conversion primitives' PTX (cvt e4m3x2, sm_89+) against their twins, the
# quantizer and the kernel at moderate shapes over every mask x score mod
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_e4m3_primitives_match_their_twins(rng):
    from numba import cuda

    from numba_mla import ptx
    from numba_mla.ptx import conversions

    @cuda.jit
    def convert(words, out, floats, packed):
        i = cuda.grid(1)
        if i < words.shape[0]:
            out[i, 0], out[i, 1], out[i, 2], out[i, 3] = ptx.e4m3x4_to_f32(words[i])
            packed[i] = ptx.pack_e4m3x4(floats[i, 0], floats[i, 1], floats[i, 2], floats[i, 3])

    codes = np.arange(256, dtype=np.uint8)
    words = np.stack([codes, np.roll(codes, 1), np.roll(codes, 2), np.roll(codes, 3)], 1)
    words = np.ascontiguousarray(words).view(np.int32).ravel()          # every code, every byte
    floats = (rng.standard_normal((256, 4)) * 10.0 ** rng.integers(-4, 4, (256, 4)))
    floats[:8] = [[448, 464, 1e9, -1e9], [np.nan, -0.0, 2.0**-10, -(2.0**-9)],
                  [1.0625, 1.1875, 240, 248], [0, 1, 2, 3]] * 2      # ties, saturation, NaN
    floats = floats.astype(np.float32)
    out = cuda.device_array((256, 4), np.float32)
    packed = cuda.device_array(256, np.int32)
    convert[2, 128](cuda.to_device(words), out, cuda.to_device(floats), packed)
    want = np.array([conversions._e4m3x4_to_f32_twin(w) for w in words], np.float32)
    assert np.array_equal(out.copy_to_host(), want, equal_nan=True)
    want_p = np.array([conversions._pack_e4m3x4_twin(*f) for f in floats], np.int32)
    assert np.array_equal(packed.copy_to_host(), want_p)


@pytest.mark.gpu
def test_byte_perm_matches_its_twin(rng):
    from numba import cuda

    from numba_mla import ptx
    from numba_mla.ptx.arith import _byte_perm_twin

    lo, hi = ptx.byte_perm(0x5140), ptx.byte_perm(0x7362)

    @cuda.jit
    def perm(a, b, out):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i, 0] = lo(a[i], b[i])
            out[i, 1] = hi(a[i], b[i])

    a, b = (rng.integers(-2**31, 2**31, 256).astype(np.int32) for _ in range(2))
    out = cuda.device_array((256, 2), np.int32)
    perm[2, 128](cuda.to_device(a), cuda.to_device(b), out)
    want = [[_byte_perm_twin(sel)(x, y) for sel in (0x5140, 0x7362)] for x, y in zip(a, b)]
    assert np.array_equal(out.copy_to_host(), np.array(want, np.int32))


def test_exp2_ftz_twin():
    """The twin of ``ptx.exp2_ftz`` (ex2.approx.ftz, the transposed kernel's softmax): 2^x,
    exact at integers; a result below 2^-126 (subnormal) is 0, as is 2^-inf."""
    from numba_mla.ptx.arith import _exp2_ftz_twin as exp2

    assert exp2(0.0) == 1 and exp2(10.0) == 1024 and exp2(-126.0) == 2.0 ** -126
    assert exp2(-126.5) == 0 and exp2(-149.0) == 0 and exp2(-np.inf) == 0
    assert exp2(np.inf) == np.inf and np.isnan(exp2(np.nan))
    x = np.linspace(-125, 125, 2001, dtype=np.float32)
    got = np.array([exp2(v) for v in x], np.float64)
    assert np.all(np.abs(got / np.exp2(x.astype(np.float64)) - 1) < 2.0 ** -22)


@pytest.mark.gpu
def test_exp2_ftz_matches_its_twin(rng):
    from numba import cuda

    from numba_mla import ptx
    from numba_mla.ptx.arith import _exp2_ftz_twin

    @cuda.jit
    def exp2(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = ptx.exp2_ftz(x[i])

    x = np.concatenate([rng.uniform(-140, 120, 500), [0, 1, -1, -125, -127, -130, -200]])
    x = np.concatenate([x, [np.nan, -np.inf, np.inf]]).astype(np.float32)
    out = cuda.device_array(x.shape, np.float32)
    exp2[4, 128](cuda.to_device(x), out)
    got = out.copy_to_host().astype(np.float64)
    want = np.array([_exp2_ftz_twin(v) for v in x], np.float64)
    edge = np.abs(x + 126) < 0.01  # (a result this close to 2^-126 may round either side)
    assert np.array_equal(got[~edge] == 0, want[~edge] == 0)  # the same ones flushed
    kept = (want != 0) & np.isfinite(want) & ~edge
    assert np.all(np.abs(got[kept] / want[kept] - 1) < 2.0 ** -21)
    assert got[-1] == np.inf and got[-2] == 0 and np.isnan(got[-3])


def _code_words():
    """Every e4m3 code in every byte of a word (256 words)."""
    codes = np.arange(256, dtype=np.uint8)
    words = np.stack([codes, np.roll(codes, 1), np.roll(codes, 2), np.roll(codes, 3)], 1)
    return np.ascontiguousarray(words).view(np.int32).ravel()


@pytest.mark.parametrize("dtype", [BF16, np.float16])
def test_e4m3_to_16_bit_twin_is_the_exact_value(dtype):
    """The twin of the 4-code conversion packs each code's exact value into 16-bit pairs in
    the kernel's order (codes 0, 1 in the first word, code 0 low); a NaN code gives NaN."""
    from numba_mla.ptx import conversions

    twin = conversions._e4m3x4_to_16x4_twin(dtype)
    for w in _code_words():
        got = np.array(twin(w), np.int32).view(dtype).astype(np.float64)
        want = np.array([w], np.int32).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        assert np.array_equal(got, want, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("tag,dtype", [("bf16", BF16), ("f16", np.float16)])
def test_e4m3_to_16_bit_matches_its_twin(tag, dtype):
    """The 4-code conversion on the GPU gives every code's exact value, subnormal codes,
    zeros of both signs included, and NaN for a NaN code."""
    from numba import cuda

    from numba_mla import ptx
    from numba_mla.ptx import conversions

    convert16 = ptx.e4m3x4_to_bf16x4 if tag == "bf16" else ptx.e4m3x4_to_f16x4

    @cuda.jit
    def convert(words, out):
        i = cuda.grid(1)
        if i < words.shape[0]:
            out[i, 0], out[i, 1] = convert16(words[i])

    words = _code_words()
    out = cuda.device_array((256, 2), np.int32)
    convert[2, 128](cuda.to_device(words), out)
    got = out.copy_to_host().view(dtype).astype(np.float64)
    twin = conversions._e4m3x4_to_16x4_twin(dtype)
    want = np.array([twin(w) for w in words], np.int32).view(dtype).astype(np.float64)
    assert np.isnan(want).sum() == 8  # (two NaN codes, in each of the 4 bytes)
    assert np.array_equal(got, want, equal_nan=True)
    real = ~np.isnan(want)
    assert np.array_equal(np.signbit(got[real]), np.signbit(want[real]))  # -0 stays -0


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["e4m3", "v32"])
def test_device_quantizer_matches_host_gpu(layout, rng):
    from numba import cuda

    kv = (rng.standard_normal((4, 1000, 576)) * rng.uniform(1e-3, 1e3, (4, 1000, 1))).astype(BF16)
    host, hs, _ = fp8.quantize(kv, layout)
    dev, ds, _ = fp8.quantize(cuda.to_device(kv.view(np.int16)).view(BF16), layout)
    assert hs == ds
    assert np.array_equal(dev.copy_to_host(), np.asarray(host).view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("backend,layout", [
    ("simt", "e4m3"), ("simt", "v32"), ("mma_sync", "e4m3"), ("mma_sync", "v32"),
    ("mma", "e4m3"), ("mma-64", "e4m3")])
@pytest.mark.parametrize("cache", ["contiguous", "paged16", "paged64"])
def test_fp8_kernel_every_mask_and_mod_gpu(layout, cache, backend, rng, monkeypatch):
    """Every mask and every score mod over an FP8 cache. Their whole cross product is
    test_kernels' (the FP8 row load is independent of them, and each pair is a kernel to
    compile: the product here took minutes a case); each parameter set pairs them with its
    own offset, so the sets together meet many pairs. Under "mma" the 2 x 128-row problems
    run the seesaw kernel on a contiguous cache (the transposed kernel's 64-row block where
    a mask's build spills; "mma-64": that block everywhere, ``SEESAW_E4M3 = False``), the
    32-row block on pages of 16 (``TRANSPOSED_PAST_32 = 32``) and the lockstep kernel on
    pages of 64 (``TRANSPOSED_PAST_16 = 0``: what a strided cache runs)."""
    from numba_mla import selector

    if backend == "mma-64":
        if cache != "contiguous":
            pytest.skip("the 64-row block runs on a contiguous cache here")
        monkeypatch.setattr(selector, "SEESAW_E4M3", False)
        backend = "mma"
    if backend == "mma" and cache == "paged64":
        monkeypatch.setattr(selector, "TRANSPOSED_PAST_16", 0)
    if backend == "mma" and cache == "paged16":
        monkeypatch.setattr(selector, "TRANSPOSED_PAST_32", 32)
    shift = ("contiguous", "paged16", "paged64").index(cache) + 3 * ("e4m3", "v32").index(layout)
    for i in range(max(len(MASK_CASES), len(SCORE_MOD_CASES))):
        j, k = i % len(MASK_CASES), (i + shift) % len(SCORE_MOD_CASES)
        mc, sc = MASK_CASES[j], SCORE_MOD_CASES[k]
        Sq, H = (1, 16) if (j + k) % 2 else (2, 128)
        lengths = [rng.integers(Sq, 700), 0, rng.integers(Sq, 1500)]
        p = fp8_problem(rng, layout, 3, Sq, H, lengths, (BF16, np.float16)[k % 2], cache)
        check(p, mc.make(p, rng), sc.make(p), (None, 1, 7)[(j + k) % 3], backend)


@KERNEL
def test_fp8_device_arrays_and_plans_follow_kv_scale(rng):
    """Device storage (uint8 bytes): plain calls reuse a plan per layout, and a cache over the
    same bytes with another kv_scale is another plan (the scale is a kernel argument), so
    each result is its own cache's."""
    from numba import cuda

    p = fp8_problem(rng, "e4m3", 1, 1, 2, [10], BF16, "contiguous")
    storage = cuda.to_device(np.asarray(p.cache.storage).view(np.uint8))
    q = cuda.to_device(np.asarray(p.q).view(np.int16)).view(p.q.dtype)
    for kv_scale in (p.cache.kv_scale, 3 * p.cache.kv_scale):
        cache = nm.ContiguousKVCache(storage, p.lengths, kv_scale=kv_scale)
        golden = nm.reference.mla_decode(p.q, cache, p.scale)
        same = nm.reference.mla_decode(p.q, cache, p.scale, compute_dtype=np.float32)
        out = nm.mla_decode(q, cache, p.scale, backend="simt", num_partitions=1)
        assert_three_way(out.copy_to_host(), same.astype(BF16), golden,
                         floor=fp32_floor(golden))


@KERNEL
def test_fp8_kernel_4_byte_copies(rng, monkeypatch):
    """A cache that does not start 16-byte aligned is copied in 4-byte pieces: a "v32" row is
    164 of them, not a multiple of the 8 threads that copy a row (the last ones copy fewer)."""
    from numba_mla import factory, launch

    monkeypatch.setattr(launch, "_aligned16", lambda dev: False)
    built = []
    make = factory.partition_kernel

    def recording(*args):
        built.append(args[7])  # wide
        return make(*args)

    monkeypatch.setattr(factory, "partition_kernel", recording)
    p = fp8_problem(rng, "v32", 2, 1, 2, [0, 27], BF16, "paged16")
    check(p, nm.CausalMask(), nm.IdentityScoreMod(), 1)
    assert built == [False]


@KERNEL
def test_fp8_shards_merge_to_the_whole_cache(rng):
    """Decode context parallel over an FP8 cache: each rank's shard of local FP8 keys (the
    cache's one kv_scale on every rank), decoded and merged, is the whole cache's decode."""
    from numba_mla.distributed import merge
    from numba_mla.sharding import shard_cache
    from test_dcp import local_cache, positions_of

    p = with_fp8_cache(make_problem(rng, 1, 1, 2, np.array([9], np.int32), BF16,
                                    "contiguous"), "e4m3")
    kv_scale = p.cache.kv_scale
    golden, same = references(p)
    outs, lses = [], []
    for rank in range(2):
        pm = positions_of("interleaved", rank, 2, p.lengths)
        local = local_cache(rng, p, pm, "paged")            # this rank's keys, bf16
        local = nm.PagedKVCache(fp8.quantize_host(local.storage, "e4m3", kv_scale)[0],
                                local.block_table_host, local.lengths_host, kv_scale=kv_scale)
        out, lse = nm.mla_decode(p.q, shard_cache(local, p.lengths, pm), p.scale,
                                 return_lse=True, backend="simt")
        outs.append(out)
        lses.append(lse)
    out, lse = merge(np.stack(outs), np.stack(lses))
    assert_three_way(out, same[0], golden[0], floor=fp32_floor(golden[0], "simt"), what="out")
    assert_three_way(lse, same[1], golden[1], floor=fp32_floor(golden[1], "simt"), what="lse")
