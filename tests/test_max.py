"""Modular MAX's whole ``flare_mla_decoding`` signature, the ragged KV cache, ``MHAConfig`` and
warp split-K.

- ``RaggedKVCache``: every kernel backend and the reference on rows with NaN filler before,
  between and after the sequences' runs (a read outside a run shows up as NaN);
- warp split-K (kernels/warpsplit.py) with masks, score mods and split-K over blocks together;
- ``config``: the kernel it selects (checked on the plan, no launch) and a run with it;
- MAX's two call shapes ported as a MAX user writes them (uint32 lengths and offsets, every
  keyword), end to end;
- one test per refused combination: the error names the argument, ``output`` is untouched.

Kernel cases are simulator-sized (marked ``kernel``); the refusals launch nothing.
"""
import dataclasses

import numpy as np
import pytest

import numba_mla as nm
from helpers import (BF16, assert_three_way, fp32_floor, make_problem, references,
                     with_fp8_cache)
from numba_mla import checks, launch, selector

KERNEL = pytest.mark.kernel


def sentinel(shape, dtype):
    return np.full(shape, 7.0, dtype)


def assert_refused(call, exc, name, out=None):
    """``call()`` raises ``exc`` whose message starts with ``name``; ``out`` stays unchanged."""
    before = None if out is None else out.copy()
    with pytest.raises(exc) as info:
        call()
    assert str(info.value).startswith(name), str(info.value)
    if out is not None:
        np.testing.assert_array_equal(out, before)


def ragged_k(p):
    """Problem p's ragged cache as MAX's k tensor [rows, 1, 576] and its B+1 row offsets."""
    c = p.cache
    return c.rows_array[:, None, :], c.offsets_host


# ---------------------------------------------------------------------------------------------
# The ragged cache
# ---------------------------------------------------------------------------------------------
def test_ragged_cache_rows_and_lengths(rng):
    """rows(b, n) reads run b from its offset; lengths default to the runs; with_lengths
    shortens them; MAX's [R, 1, 576] is taken as [R, 576]."""
    rows = rng.standard_normal((10, 576)).astype(np.float32)
    off = np.array([1, 4, 4, 9], np.uint32)
    c = nm.RaggedKVCache(rows[:, None, :], off)
    assert c.lengths_host.tolist() == [3, 0, 5] and c.capacity == 5 and c.batch == 3
    np.testing.assert_array_equal(c.rows(2, 5), rows[4:9])
    short = c.with_lengths(np.array([2, 0, 1], np.int64))
    assert short.lengths_host.tolist() == [2, 0, 1]
    np.testing.assert_array_equal(short.rows(0, 2), rows[1:3])
    assert short.layout_key == c.layout_key  # the same plan serves both


def test_ragged_cache_reference_ignores_filler(rng):
    """NaN filler rows around every run: the reference's result is finite and equals the
    same keys in a contiguous cache."""
    p = make_problem(rng, 3, 2, 2, [5, 0, 7], np.float32, "ragged")
    assert np.isnan(p.cache.rows_array).any()
    kv = np.zeros((3, 7, 576), np.float32)
    for b, keys in enumerate(p.keys):
        kv[b, :len(keys)] = keys
    want = nm.reference.mla_decode(p.q, nm.ContiguousKVCache(kv, p.lengths), p.scale)
    got = nm.reference.mla_decode(p.q, p.cache, p.scale)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, want)


@KERNEL
@pytest.mark.parametrize("backend,dtype,mask,partitions", [
    ("simt", np.float32, None, 2),
    ("simple", np.float16, nm.CausalMask(), 1),
    ("mma", BF16, nm.SlidingWindowCausalMask(5), 2),
], ids=["simt", "simple", "mma"])
def test_ragged_cache_kernels(backend, dtype, mask, partitions, rng):
    """Each kernel backend on a ragged cache with NaN filler between the runs (and in the
    runs past a length), ragged q, a sequence without keys."""
    p = make_problem(rng, 3, 2, 2, [9, 0, 4], dtype, "ragged", ragged=True, q_counts=[2, 0, 1])
    golden, same = references(p, mask)
    out, lse = p.run(nm, mask=mask, backend=backend, num_partitions=partitions,
                     return_lse=True)
    floor = fp32_floor(golden[0], backend)
    assert_three_way(out, same[0], golden[0], floor=floor)
    assert_three_way(lse, same[1], golden[1], floor=floor, what="lse")


@KERNEL
def test_ragged_cache_device_arrays(rng):
    """Device rows and uint32 device offsets through the plain call (twice: the second reuses
    the plan with a new q) and through prepare()."""
    from numba import cuda

    p = make_problem(rng, 2, 1, 2, [6, 3], np.float32, "ragged")
    c = p.cache
    cache = nm.RaggedKVCache(cuda.to_device(c.rows_array),
                             cuda.to_device(c.offsets_host.astype(np.uint32)), p.lengths)
    for step in range(2):
        q = p.q if step == 0 else p.q[::-1].copy()
        golden, same = references(dataclasses.replace(p, q=q))
        out = nm.mla_decode(cuda.to_device(q), cache, p.scale, backend="simple").copy_to_host()
        assert_three_way(out, same[0], golden[0], floor=fp32_floor(golden[0], "simple"))
    q_dev = cuda.to_device(p.q)
    step = nm.prepare(q_dev, cache, p.scale, backend="simple")
    golden, same = references(p)
    assert_three_way(step().copy_to_host(), same[0], golden[0],
                     floor=fp32_floor(golden[0], "simple"))


# ---------------------------------------------------------------------------------------------
# Warp split-K
# ---------------------------------------------------------------------------------------------
@KERNEL
@pytest.mark.parametrize("case", ["paged-alibi-split", "ragged-window-direct"])
def test_warp_split_k(case, rng):
    """decoding_warp_split_k=True runs the simple kernel's warp split-K variant, with a mask
    and a score mod, split over blocks too (num_partitions=3) or not; a row group whose
    warps keep nothing (the window) and a sequence without keys are merged to 0 / -inf."""
    if case == "paged-alibi-split":
        p = make_problem(rng, 2, 2, 3, [21, 0], np.float32, "paged", 4)
        mask, score_mod, partitions, backend = nm.CausalMask(), nm.AlibiScoreMod(3), 3, "auto"
    else:
        p = make_problem(rng, 2, 2, 2, [3, 18], np.float16, "ragged", ragged=True,
                         q_counts=[1, 2])
        mask, score_mod, partitions, backend = (nm.SlidingWindowCausalMask(3), None, 1,
                                                "simple")
    golden, same = references(p, mask, score_mod)
    assert p.warp_split_plan(mask, score_mod, backend=backend).spec.backend == "warpsplit"
    output = np.full(p.out_shape, np.nan, p.dtype)
    got = nm.flare_mla_decoding(output, p.q, p.cache, mask, score_mod,
                                p.q_offsets if p.ragged else None, p.scale, partitions,
                                backend, use_score_mod=score_mod is not None,
                                decoding_warp_split_k=True)
    assert got is output
    assert_three_way(output, same[0], golden[0], floor=fp32_floor(golden[0], "warpsplit"),
                     what="output")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["simt", "mma", "simple", "warpsplit", "simt_warpsplit"])
def test_gpu_ragged_cache_and_warp_split(backend, rng):
    """On a GPU: a ragged cache with NaN rows between the runs, long and empty sequences,
    ragged q, a mask and a score mod, through flare_mla_decoding (warp split-K for
    "warpsplit", in the simple kernel, and "simt_warpsplit", in the FMA kernel)."""
    p = make_problem(rng, 4, 2, 16, [4096, 1, 0, 777], BF16, "ragged", ragged=True,
                     q_counts=[2, 1, 0, 2])
    mask, score_mod = nm.CausalMask(), nm.AlibiScoreMod(16)
    golden, same = references(p, mask, score_mod)
    output = np.full(p.out_shape, np.nan, p.dtype)
    split = selector.WARP_SPLIT_ASKS
    nm.flare_mla_decoding(output, p.q, p.cache, mask, score_mod, p.q_offsets, p.scale,
                          backend=split.get(backend, backend), use_score_mod=True,
                          decoding_warp_split_k=backend in split)
    assert_three_way(output, same[0], golden[0], floor=fp32_floor(golden[0], backend),
                     what="output")


# ---------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------
def _spec(p, config, backend="auto", warp_split_k=False):
    call = checks.check_decode(p.q, p.cache, p.scale, backend=backend)
    call.config, call.warp_split_k = config, warp_split_k
    return launch.Plan(call).spec


def test_config_selects(rng):
    """Each field is honoured: rows per block (the FMA kernel's 16 and 32), the split-K
    factor, the tensor-core tiles; ``"auto"`` runs the FMA kernel for rows the tensor-core
    kernels do not have; None everywhere is the library's choice."""
    p = make_problem(rng, 1, 1, 4, [40], BF16)
    spec = _spec(p, nm.MHAConfig(num_queries_per_block=32, num_partitions=3), "simt")
    assert (spec.backend, spec.block_m, spec.num_partitions) == ("simt", 32, 3)
    spec = _spec(p, nm.MHAConfig(num_queries_per_block=16, num_keys_per_block=64,
                                 num_pipeline_stages=2))
    assert (spec.backend, spec.block_m, spec.block_n) == ("simt", 16, 64)
    spec = _spec(p, nm.MHAConfig(num_queries_per_block=64, num_keys_per_block=64), "mma")
    assert spec.backend in ("mma", "seesaw") and spec.block_m == 64
    assert _spec(p, nm.MHAConfig()) == _spec(p, None)


def test_warp_split_selects(rng):
    """decoding_warp_split_k runs the FMA kernel's variant for 16-bit caches (under "auto"
    and "simt"; 16 rows a block, 32-key tiles a group), the simple kernel's under "simple"
    and for float32 and FP8 caches; the FMA kernel's refuses what it cannot run, by name."""
    p16 = make_problem(rng, 1, 1, 4, [40], BF16)
    p32 = make_problem(rng, 1, 1, 4, [40], np.float32)
    fp8 = with_fp8_cache(make_problem(rng, 1, 1, 4, [40], BF16), "e4m3")
    assert _spec(p16, None, "auto", True).backend == "simt_warpsplit"
    assert _spec(p16, None, "simple", True).backend == "warpsplit"
    assert _spec(p32, None, "auto", True).backend == "warpsplit"
    assert _spec(fp8, None, "auto", True).backend == "warpsplit"
    spec = _spec(p16, nm.MHAConfig(num_queries_per_block=16, num_keys_per_block=32,
                                   num_pipeline_stages=2, num_partitions=2), "simt", True)
    assert (spec.backend, spec.block_m, spec.block_n, spec.num_partitions) == (
        "simt_warpsplit", 16, 32, 2)
    with pytest.raises(ValueError, match="config.num_queries_per_block"):
        _spec(p16, nm.MHAConfig(num_queries_per_block=32), "simt", True)
    # "auto": a config only the simple kernel's warp split-K honours runs there
    for field, value in (("num_queries_per_block", 8), ("num_keys_per_block", 8),
                         ("num_pipeline_stages", 1)):
        spec = _spec(p16, nm.MHAConfig(**{field: value}), "auto", True)
        assert spec.backend == "warpsplit"
    for backend in ("mma", "mma_sync"):  # (a call checked without api's check_warp_split)
        with pytest.raises(ValueError, match="^decoding_warp_split_k"):
            _spec(p16, None, backend, True)
    for p, kind in ((p32, "float32"), (fp8, "FP8")):
        with pytest.raises(ValueError, match=f"^decoding_warp_split_k: .* {kind} cache"):
            _spec(p, None, "simt", True)


def test_fma_kernel_fits_the_device(rng, monkeypatch):
    """The FMA kernel's block (154-226 KB of shared memory) is read against the device's
    shared memory a block: on an A100-sized one (163 KB) "auto" runs the simple kernel for
    float32 data (and its warp split-K for decoding_warp_split_k), and an explicit "simt"
    is refused by name; FP8 rows at 16 rows (154 KB) fit a block of that size (on a GPU, FP8
    needs compute capability 8.9: Ada's 99 KB do not take it). On a device between its
    16-row and 32-row blocks, it takes 16 rows."""
    from numba_mla import heuristics

    p16 = make_problem(rng, 1, 2, 16, [40], BF16)  # 32 query rows
    p32 = make_problem(rng, 1, 1, 4, [40], np.float32)
    monkeypatch.setattr(heuristics, "smem_per_block", lambda: 166912)  # an A100's
    assert _spec(p32, None).backend == "simple"
    assert _spec(p32, None, "auto", True).backend == "warpsplit"
    for p, split in ((p16, False), (p16, True), (p32, False)):
        with pytest.raises(ValueError, match=r"^backend: the FMA kernel .* 163 KB"):
            _spec(p, None, "simt", split)
    fp8 = with_fp8_cache(make_problem(rng, 1, 1, 4, [40], BF16), "e4m3")
    assert (_spec(fp8, None, "simt").backend, _spec(fp8, None, "simt").block_m) == ("simt", 16)
    monkeypatch.setattr(heuristics, "smem_per_block", lambda: 225 * 1024)  # 219 KB < it < 226
    assert (_spec(p16, None, "simt").backend, _spec(p16, None, "simt").block_m) == ("simt", 16)
    monkeypatch.setattr(heuristics, "smem_per_block", lambda: 232448)  # an H200's
    assert _spec(p16, None, "simt").block_m == 32


def test_mma_sync_config_fits_the_device(rng, monkeypatch):
    """The warp tensor-core kernel's config is read against the device's shared memory a
    block: its 32-row block (192 KB) is refused by name on an A100-sized one, and on an
    Ada-sized one neither it nor the FMA kernel's (208 KB) runs 32 rows of FP8, so ``"auto"``
    refuses that config by name too (with no config the A100 takes 16 rows, or the 32-row
    block's split-role form in three stages, 160 KB, where that is on); FP8 rows staged through
    shared memory run
    two tiles in flight at 16 rows too (``num_pipeline_stages=2`` is honoured there, 1 only
    where they are loaded by the warps; "v32" rows, which "auto" gives this kernel at any
    rows); "e4m3" rows take two raw stages, three tiles in flight (3), or one when the config
    asks for 2."""
    from numba_mla import heuristics, selector
    from numba_mla.kernels import mma_sync, mma_sync_roles

    p = make_problem(rng, 1, 1, 20, [40], BF16, "contiguous")  # 20 query rows
    monkeypatch.setattr(heuristics, "smem_per_block", lambda: 166912)  # an A100's
    with pytest.raises(ValueError, match=r"config\.num_queries_per_block: the 'mma_sync' "
                                         r"kernel for this call runs 16, got 32"):
        _spec(p, nm.MHAConfig(num_queries_per_block=32), "mma_sync")
    assert _spec(p, None, "mma_sync").block_m == 16
    monkeypatch.setattr(selector, "MMA_SYNC_ROLES_THREE_STAGES", True)
    spec = _spec(p, None, "mma_sync")
    assert (spec.backend, spec.block_m, spec.smem) == ("mma_sync_roles", 32,
                                                       mma_sync_roles.smem_bytes(3))

    for H, rows in ((20, 32), (16, 32)):  # (FP8 staged: 32 rows at 16 too)
        pf = with_fp8_cache(dataclasses.replace(p, q=p.q[:, :, :H]), "v32")
        monkeypatch.setattr(heuristics, "smem_per_block", lambda: 232448)  # an H200's
        spec = _spec(pf, nm.MHAConfig(num_pipeline_stages=2))  # "auto": mma_sync for "v32"
        assert (spec.backend, spec.block_m) == ("mma_sync", rows)
        with pytest.raises(ValueError, match=r"config\.num_pipeline_stages"):  # nor simt's 2
            _spec(pf, nm.MHAConfig(num_pipeline_stages=1))
        monkeypatch.setattr(heuristics, "smem_per_block", lambda: 101376)  # an Ada GPU's
        with pytest.raises(ValueError, match=r"^config\.num_queries_per_block: the FMA kernel"):
            _spec(pf, nm.MHAConfig(num_queries_per_block=32))
        assert _spec(pf, nm.MHAConfig(num_pipeline_stages=1)).backend == "mma_sync"
    pf = with_fp8_cache(p, "e4m3")
    monkeypatch.setattr(heuristics, "smem_per_block", lambda: 232448)
    for stages, raw in ((None, 2), (3, 2), (2, 1)):
        spec = _spec(pf, nm.MHAConfig(num_pipeline_stages=stages), "mma_sync")
        assert (spec.backend, spec.smem) == ("mma_sync", mma_sync.smem_bytes(32, "e4m3", raw))


@KERNEL
def test_config_runs(rng):
    """A call with a config gives the reference's result (FMA kernel, 32 rows a block)."""
    p = make_problem(rng, 1, 2, 9, [12], BF16)  # 18 rows: two row groups at 16, one at 32
    golden, same = references(p)
    output = np.full(p.out_shape, np.nan, p.dtype)
    nm.flare_mla_decoding(output, p.q, p.cache, None, None, None, p.scale, backend="simt",
                          config=nm.MHAConfig(num_queries_per_block=32, num_partitions=2))
    assert_three_way(output, same[0], golden[0], floor=fp32_floor(golden[0]), what="output")


# ---------------------------------------------------------------------------------------------
# MAX's call shapes, ported
# ---------------------------------------------------------------------------------------------
@KERNEL
def test_max_port_cache_overload(rng):
    """MAX's first overload: k a KV cache (paged), padded q, valid_length uint32, every
    keyword MAX has, given as MAX's defaults."""
    p = make_problem(rng, 2, 1, 2, [11, 6], np.float32, "paged", 4)
    golden, same = references(p, nm.CausalMask())
    output = np.full(p.out_shape, np.nan, p.dtype)
    got = nm.flare_mla_decoding(
        output, p.q, p.cache, nm.CausalMask(), None, p.lengths.astype(np.uint32), p.scale,
        q_max_seq_len=1, kv_input_row_offsets=None, num_partitions=None, use_score_mod=False,
        config=nm.MHAConfig(), ragged=False, decoding_warp_split_k=False)
    assert got is output
    assert_three_way(output, same[0], golden[0], floor=fp32_floor(golden[0]), what="output")


@KERNEL
def test_max_port_ragged_overload(rng):
    """MAX's second overload, ragged: q [T, H, 576] with valid_length = its B+1 row offsets,
    k a ragged tensor [rows, 1, 576] with kv_input_row_offsets (uint32, NaN rows between the
    runs), the score mod on, warp split-K on."""
    p = make_problem(rng, 2, 2, 2, [7, 10], np.float32, "ragged", ragged=True,
                     q_counts=[2, 1])
    # MAX's k: the runs back to back (each exactly its sequence), NaN rows before and after
    pad = np.full((2, 576), np.nan, np.float32)
    rows = np.concatenate([pad, *p.keys, pad])[:, None, :]             # [rows, 1, 576]
    off = 2 + np.concatenate([[0], np.cumsum(p.lengths)])
    score_mod = nm.SoftCapScoreMod(2.0)
    golden, same = references(p, nm.CausalMask(), score_mod)
    output = np.full(p.out_shape, np.nan, p.dtype)
    got = nm.flare_mla_decoding(
        output, p.q, rows, nm.CausalMask(), score_mod, p.q_offsets.astype(np.uint32), p.scale,
        q_max_seq_len=2, kv_input_row_offsets=off.astype(np.uint32), num_partitions=2,
        use_score_mod=True, config=None, ragged=True, decoding_warp_split_k=True)
    assert got is output
    assert_three_way(output, same[0], golden[0], floor=fp32_floor(golden[0], "warpsplit"),
                     what="output")


def test_max_port_padded_q_ragged_k_reference(rng):
    """Padded q with a ragged k tensor: valid_length (uint32) may shorten each run."""
    p = make_problem(rng, 2, 1, 2, [4, 6], np.float32, "ragged")
    rows, off = ragged_k(p)
    want = nm.reference.mla_decode(p.q, p.cache, p.scale)
    output = sentinel(p.out_shape, np.float32)
    nm.flare_mla_decoding(output, p.q, rows, None, None, p.lengths.astype(np.uint32), p.scale,
                          kv_input_row_offsets=off, backend="reference")
    np.testing.assert_array_equal(output, want.astype(np.float32))


# ---------------------------------------------------------------------------------------------
# Refused combinations (no launch; output untouched)
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def small(rng):
    return make_problem(rng, 2, 1, 2, [5, 3], np.float32, "ragged")


def _flare(p, out, k=None, valid_length=None, score_mod=None, **kw):
    return lambda: nm.flare_mla_decoding(out, p.q, p.cache if k is None else k, None,
                                         score_mod, valid_length, p.scale, **kw)


REFUSED = {
    # name: (keywords or a builder, exception, argument named)
    "ragged_true_padded_q": (dict(ragged=True), ValueError, "ragged"),
    "ragged_not_bool": (dict(ragged="yes"), TypeError, "ragged"),
    "score_mod_without_use_score_mod": (dict(score_mod=nm.AlibiScoreMod(2)), ValueError,
                                        "use_score_mod"),
    "use_score_mod_not_bool": (dict(use_score_mod=1), TypeError, "use_score_mod"),
    "warp_split_not_bool": (dict(decoding_warp_split_k="x"), TypeError,
                            "decoding_warp_split_k"),
    "warp_split_simt": (dict(decoding_warp_split_k=True, backend="simt"), ValueError,
                        "decoding_warp_split_k"),
    "warp_split_mma": (dict(decoding_warp_split_k=True, backend="mma"), ValueError,
                       "decoding_warp_split_k"),
    "warp_split_mma_sync": (dict(decoding_warp_split_k=True, backend="mma_sync"), ValueError,
                            "decoding_warp_split_k"),
    "q_max_seq_len_short": (dict(q_max_seq_len=0), ValueError, "q_max_seq_len"),
    "q_max_seq_len_float": (dict(q_max_seq_len=1.0), TypeError, "q_max_seq_len"),
    "q_max_seq_len_past_int32": (dict(q_max_seq_len=2**31), ValueError, "q_max_seq_len"),
    "config_not_mhaconfig": (dict(config={"num_partitions": 2}), TypeError, "config"),
    "config_partitions_disagree": (dict(config=nm.MHAConfig(num_partitions=2),
                                        num_partitions=3), ValueError,
                                   "config.num_partitions"),
    "config_rows_simt": (dict(config=nm.MHAConfig(num_queries_per_block=64),
                              backend="simt"), ValueError, "config.num_queries_per_block"),
    "config_rows_32_fp32": (dict(config=nm.MHAConfig(num_queries_per_block=32),
                                 backend="simt"), ValueError, "config.num_queries_per_block"),
    "config_keys_simt": (dict(config=nm.MHAConfig(num_keys_per_block=16), backend="simt"),
                         ValueError, "config.num_keys_per_block"),
    "config_stages_simple": (dict(config=nm.MHAConfig(num_pipeline_stages=2),
                                  backend="simple"), ValueError, "config.num_pipeline_stages"),
    "config_rows_warp_split": (dict(config=nm.MHAConfig(num_queries_per_block=16),
                                    decoding_warp_split_k=True), ValueError,
                               "config.num_queries_per_block"),
    "offsets_with_cache": (dict(kv_input_row_offsets=np.array([0, 5, 9], np.int32)),
                           ValueError, "kv_input_row_offsets"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_keyword(case, small):
    kw, exc, name = REFUSED[case]
    kw = dict(kw)
    out = sentinel(small.out_shape, np.float32)
    assert_refused(_flare(small, out, score_mod=kw.pop("score_mod", None), **kw), exc, name,
                   out)


def _ragged_k_case(p, case):
    """(k, keywords) of a refused ragged-k call on problem p (padded q, B = 2)."""
    rows, off = ragged_k(p)
    R = rows.shape[0]
    if case == "k_4d_with_offsets":
        return rows[None], dict(kv_input_row_offsets=off)
    if case == "k_ragged_without_offsets":
        return rows, {}
    if case == "offsets_decreasing":
        return rows, dict(kv_input_row_offsets=np.array([0, 6, 5], np.int32))
    if case == "offsets_past_rows":
        return rows, dict(kv_input_row_offsets=np.array([0, 5, R + 1], np.uint32))
    if case == "offsets_past_int32":
        return rows, dict(kv_input_row_offsets=np.array([0, 5, 2**31], np.uint32))
    if case == "offsets_count":
        return rows, dict(kv_input_row_offsets=off[:2])
    if case == "offsets_float":
        return rows, dict(kv_input_row_offsets=off.astype(np.float32))
    if case == "valid_length_past_run":
        runs = np.diff(off)
        return rows, dict(kv_input_row_offsets=off, valid_length=(runs + 1).astype(np.uint32))
    if case == "valid_length_past_int32":
        return rows, dict(kv_input_row_offsets=off,
                          valid_length=np.array([2**31, 0], np.uint32))
    raise AssertionError(case)


RAGGED_K_REFUSED = {
    "k_4d_with_offsets": (ValueError, "k"),
    "k_ragged_without_offsets": (ValueError, "k"),
    "offsets_decreasing": (ValueError, "kv_input_row_offsets"),
    "offsets_past_rows": (ValueError, "kv_input_row_offsets"),
    "offsets_past_int32": (ValueError, "kv_input_row_offsets"),
    "offsets_count": (ValueError, "kv_input_row_offsets"),
    "offsets_float": (TypeError, "kv_input_row_offsets"),
    "valid_length_past_run": (ValueError, "valid_length"),
    "valid_length_past_int32": (ValueError, "valid_length"),
}


@pytest.mark.parametrize("case", sorted(RAGGED_K_REFUSED))
def test_refused_ragged_k(case, small):
    exc, name = RAGGED_K_REFUSED[case]
    k, kw = _ragged_k_case(small, case)
    out = sentinel(small.out_shape, np.float32)
    assert_refused(_flare(small, out, k=k, **kw), exc, name, out)


def test_refused_ragged_false_with_ragged_q(rng):
    p = make_problem(rng, 2, 1, 2, [5, 3], np.float32, ragged=True, q_counts=[1, 1])
    out = sentinel(p.out_shape, np.float32)
    assert_refused(_flare(p, out, valid_length=p.q_offsets, ragged=False), ValueError,
                   "ragged", out)


def test_refused_ragged_q_max_seq_len_below_a_run(rng):
    p = make_problem(rng, 2, 3, 2, [5, 3], np.float32, ragged=True, q_counts=[3, 1])
    out = sentinel(p.out_shape, np.float32)
    assert_refused(_flare(p, out, valid_length=p.q_offsets.astype(np.uint32),
                          q_max_seq_len=2), ValueError, "q_max_seq_len", out)


@pytest.mark.parametrize("fields,exc", [(dict(num_queries_per_block=0), ValueError),
                                        (dict(num_partitions=2.0), TypeError),
                                        (dict(num_keys_per_block=True), TypeError)])
def test_refused_config_fields(fields, exc):
    name = "config." + next(iter(fields))
    assert_refused(lambda: nm.MHAConfig(**fields), exc, name)


@pytest.mark.parametrize("args,exc,name", [
    ((np.zeros((4, 512), np.float32), np.array([0, 4])), ValueError, "rows"),
    ((np.zeros((4, 576), np.float32), np.array([], np.int32)), ValueError, "row_offsets"),
    ((np.zeros((4, 576), np.float32), np.array([0, 2, 4]), np.array([3, 1])), ValueError,
     "lengths"),
    ((np.zeros((4, 576), np.float64), np.array([0, 4])), TypeError, "rows"),
])
def test_refused_ragged_cache(args, exc, name):
    assert_refused(lambda: nm.RaggedKVCache(*args), exc, name)
