"""Decode context parallel, in one process: a cache split N ways (interleaved, as vLLM lays it
out, or in blocks of C tokens), each shard decoded with its global positions, the shards
merged by the combine kernel, and the result checked three ways against the float64 reference
of the WHOLE cache (tests/helpers.py). Every mask and score mod of the table runs at least
once, on paged and contiguous shards, with Sq up to 8 and lengths shorter than N (shards with
no key of a sequence). The position map's device functions are checked against brute force:
the key range is exact (tile skipping still skips) and the tile classes sound.
The multi-process (gloo) path is in test_dcp_gloo.py.
"""
import itertools

import numpy as np
import pytest

import numba_mla as nm
from numba_mla import factory
from numba_mla.distributed import merge
from numba_mla.mods import EMPTY, FULL, KEY_MAX
from numba_mla.positions import PositionMap
from numba_mla.sharding import ShardedKVCache, local_rows, shard_cache
from numba_mla.testing import UNUSED_PAGE, paged_layout

from helpers import (D_QK, DTYPES, MASKS, SCORE_MODS, assert_three_way, fp32_floor,
                     make_problem, references)


# ---------------------------------------------------------------------------------------------
# Sharding a problem
# ---------------------------------------------------------------------------------------------
def positions_of(layout, rank, world, lengths):
    """Rank ``rank``'s map: interleaved, or blocks of C = ceil(longest / world) tokens."""
    if layout == "interleaved":
        return PositionMap.interleaved(rank, world)
    block = max(1, -(-int(max(lengths)) // world))
    return PositionMap.blocks(rank, block)


def local_cache(rng, p, positions, kind, page_size=4):
    """The shard of problem p's keys under ``positions``, as a cache of local keys: NaN in
    every slot past a sequence's local keys, shuffled pages, UNUSED_PAGE past the used ones."""
    counts = positions.local_count(p.lengths).astype(np.int32)
    rows = [local_rows(k, positions) for k in p.keys]
    cap = int(counts.max(initial=0)) + 2
    if kind == "contiguous":
        kv = np.full((p.batch, cap, D_QK), np.nan, p.dtype)
        for b, r in enumerate(rows):
            kv[b, :len(r)] = r
        return nm.ContiguousKVCache(kv, counts)
    layout = paged_layout(rng, counts, page_size, -(-cap // page_size), spare_pages=1)
    pages = np.full((layout.num_pages, page_size, D_QK), np.nan, p.dtype)
    for b, r in enumerate(rows):
        for j in range(int(layout.used[b])):
            t0, t1 = j * page_size, min(len(r), (j + 1) * page_size)
            pages[layout.block_table[b, j], :t1 - t0] = r[t0:t1]
    assert (layout.block_table[layout.block_table >= layout.num_pages] == UNUSED_PAGE).all()
    return nm.PagedKVCache(pages, layout.block_table, counts)


def sharded_decode(rng, p, world, layout, kind, mask, score_mod, backend="simt"):
    """Each shard's decode (return_lse), merged by the combine kernel: (out, lse)."""
    outs, lses = [], []
    for rank in range(world):
        pm = positions_of(layout, rank, world, p.lengths)
        shard = shard_cache(local_cache(rng, p, pm, kind), p.lengths, pm)
        out, lse = nm.mla_decode(p.q, shard, p.scale, mask=mask, score_mod=score_mod,
                                 return_lse=True, backend=backend)
        outs.append(out)
        lses.append(lse)
    return merge(np.stack(outs), np.stack(lses))


# (mask, score mod, N, layout, cache kind, dtype, B, Sq, H, lengths): every mask and every
# score mod at least once, both layouts and kinds, N = 2 and 3, lengths below N.
CASES = [
    ("null", "identity", 2, "interleaved", "contiguous", "fp32", 2, 1, 2, [5, 1]),
    ("causal", "alibi", 3, "blocks", "paged", "fp32", 1, 4, 2, [11]),
    ("window3", "softcap", 2, "blocks", "contiguous", "fp32", 1, 2, 1, [9]),
    ("window1", "user_fn", 3, "interleaved", "paged", "fp32", 1, 1, 2, [7]),
    ("chunked3", "user_fn_scalar", 2, "interleaved", "paged", "fp32", 1, 3, 1, [8]),
    ("chunked_causal4", "identity", 3, "interleaved", "contiguous", "fp32", 1, 8, 1, [10]),
    ("bias_B_Sq_S", "alibi", 2, "blocks", "paged", "fp32", 2, 2, 1, [6, 2]),
    ("bias_B_H_Sq_S", "identity", 3, "interleaved", "contiguous", "fp32", 1, 2, 2, [5]),
    ("user_fn", "softcap", 2, "interleaved", "contiguous", "fp32", 1, 1, 1, [7]),
    ("user_fn_scalar", "identity", 2, "blocks", "paged", "fp32", 1, 1, 1, [6]),
    ("causal&user_fn", "user_fn", 3, "blocks", "contiguous", "fp32", 1, 2, 1, [8]),
    ("chunked4|window2", "identity", 2, "interleaved", "paged", "bf16", 1, 1, 2, [9]),
    ("user_fn_scalar|causal", "alibi", 2, "blocks", "contiguous", "fp32", 1, 1, 1, [4]),
    ("(chunked3&causal)|window1", "softcap", 3, "interleaved", "paged", "fp32", 1, 2, 1, [2]),
]


def _case_id(c):
    return f"{c[0]}-{c[1]}-N{c[2]}-{c[3]}-{c[4]}-{c[5]}"


def check_sharded(rng, mask_id, mod_id, world, layout, kind, dtype, B, Sq, H, lengths,
                  backend="simt"):
    p = make_problem(rng, B, Sq, H, lengths, DTYPES[dtype], "contiguous")
    mask = MASKS[mask_id].make(p, rng)
    score_mod = SCORE_MODS[mod_id].make(p)
    golden, same = references(p, mask, score_mod)
    out, lse = sharded_decode(rng, p, world, layout, kind, mask, score_mod, backend)
    assert out.dtype == p.dtype and out.shape == p.out_shape and lse.shape == p.lse_shape
    assert_three_way(out, same[0], golden[0], floor=fp32_floor(golden[0], backend), what="out")
    assert_three_way(lse, same[1], golden[1], floor=fp32_floor(golden[1], backend), what="lse")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_sharded_decode_matches_whole_cache(rng, case):
    check_sharded(rng, *case)


def test_every_mask_and_score_mod_is_covered():
    assert {c[0] for c in CASES} == set(MASKS)
    assert {c[1] for c in CASES} == set(SCORE_MODS)
    assert {(c[3], c[4]) for c in CASES} == set(itertools.product(
        ("interleaved", "blocks"), ("contiguous", "paged")))
    assert any(min(c[9]) < c[2] for c in CASES) and max(c[7] for c in CASES) == 8


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("layout", ["interleaved", "blocks"])
def test_eight_shards(rng, layout):
    """N = 8 (a GPU test: 16 shard decodes take about 100 s in the simulator, which runs it
    when the ``gpu`` marker is removed)."""
    check_sharded(rng, "causal", "alibi", 8, layout, "paged", "fp32", 2, 2, 1, [19, 5])


# ---------------------------------------------------------------------------------------------
# The position map's device functions, against brute force
# ---------------------------------------------------------------------------------------------
MAP_MASKS = ["null", "causal", "window3", "chunked3", "chunked_causal4", "chunked4|window2"]


def mapped_functions(mask, positions):
    return positions.device_functions(dict(
        mask_apply=mask.device_apply(), mask_classify=mask.device_classify(),
        mask_key_range=mask.device_key_range(),
        score_mod=nm.IdentityScoreMod().device_fn()))


@pytest.mark.simulator
@pytest.mark.parametrize("mask_id", MAP_MASKS)
@pytest.mark.parametrize("positions", [PositionMap.interleaved(0, 3), PositionMap.interleaved(2, 3),
                                       PositionMap.blocks(1, 5), PositionMap(4, 1, 3)],
                         ids=["il0of3", "il2of3", "block1of5", "stride4cap3"])
def test_local_key_range_is_exact_and_tiles_sound(mask_id, positions):
    """(In the simulator the device functions run as Python.) The local key range holds
    exactly the local keys whose global key lies in the mask's global range (so a shard walks
    no more tiles than its share); ``key_count`` is the shard's share of L keys; a local tile
    classified EMPTY keeps nothing, FULL keeps everything, over every query span."""
    mask = MASKS[mask_id].make(None, None)
    fns = mapped_functions(mask, positions)
    for L in range(0, 14):
        assert fns["key_count"](L) == positions.local_count(L) == sum(
            1 for j in range(40) if j * positions.stride + positions.offset < L
            and (positions.capacity is None or j < positions.capacity))
    for q_lo, q_hi in [(0, 0), (3, 5), (7, 7), (9, 12)]:
        g0, g1 = mask.key_range(q_lo, q_hi)
        j0, j1 = fns["mask_key_range"](q_lo, q_hi)
        want = [j for j in range(60) if g0 <= j * positions.stride + positions.offset < g1]
        got = [j for j in range(60) if j0 <= j < j1]
        assert got == want or (g1 == KEY_MAX and j1 == KEY_MAX and got[:len(want)] == want)
        for k0 in range(0, 8):
            for k1 in range(k0 + 1, k0 + 5):
                cls = fns["mask_classify"](k0, k1, q_lo, q_hi)
                kept = [bool(mask.keep(0, 0, q, j * positions.stride + positions.offset))
                        for j in range(k0, k1) for q in range(q_lo, q_hi + 1)]
                assert cls != EMPTY or not any(kept), (k0, k1, q_lo, q_hi)
                assert cls != FULL or all(kept), (k0, k1, q_lo, q_hi)


@pytest.mark.simulator
def test_local_mods_see_global_keys():
    pm = PositionMap.interleaved(2, 4)
    fns = mapped_functions(nm.CausalMask(), pm)
    alibi = pm.device_functions(dict(fns, score_mod=nm.AlibiScoreMod(2).device_fn()))
    # local key 3 is global 14: kept by a query at 14, dropped by one at 13
    assert fns["mask_apply"](1.5, 0, 0, 0, 14, 3, None) == 1.5
    assert fns["mask_apply"](1.5, 0, 0, 0, 13, 3, None) == -np.inf
    assert alibi["score_mod"](0.0, 0, 0, 14, 3) == 0.0
    assert alibi["score_mod"](0.0, 0, 0, 16, 3) == pytest.approx(-2 * 2.0 ** -4)


# ---------------------------------------------------------------------------------------------
# The identity map, kernels' keys, bad shards
# ---------------------------------------------------------------------------------------------
def test_whole_caches_compile_as_before(rng):
    """A plain cache brings no map: the kernel key and device functions are today's."""
    p = make_problem(rng, 1, 1, 1, [3], np.float32)
    mask, mod = nm.CausalMask(), nm.IdentityScoreMod()
    cls = type(p.cache)
    assert factory._mods_key(mask, mod, cls) == (mask.cache_key(), mod.cache_key(), cls.kind,
                                                 True)
    assert "key_count" not in factory._device_functions(mask, mod, cls)
    assert shard_cache(p.cache, p.lengths, PositionMap()) is p.cache


def test_shards_of_other_maps_are_other_kernels(rng):
    p = make_problem(rng, 1, 1, 1, [6], np.float32)
    mask, mod = nm.CausalMask(), nm.IdentityScoreMod()
    keys = set()
    for pm in (PositionMap.interleaved(0, 2), PositionMap.interleaved(1, 2),
               PositionMap.blocks(1, 3)):
        shard = shard_cache(local_cache(rng, p, pm, "paged"), p.lengths, pm)
        assert isinstance(shard, ShardedKVCache) and shard.kind == "paged"
        keys.add(factory._mods_key(mask, mod, type(shard)))
        keys.add(shard.layout_key)
    assert len(keys) == 6


def test_bad_shards_are_refused(rng):
    p = make_problem(rng, 2, 1, 1, [6, 3], np.float32)
    pm = PositionMap.interleaved(1, 2)
    local = local_cache(rng, p, pm, "contiguous")
    with pytest.raises(ValueError, match=r"cache: sequence 0 of global length 8 has 4 keys"):
        shard_cache(local, np.array([8, 3], np.int32), pm)
    with pytest.raises(TypeError, match="positions: expected a PositionMap"):
        shard_cache(local, p.lengths, (2, 1))
    with pytest.raises(ValueError, match="rank: expected 0 <= rank < 2"):
        PositionMap.interleaved(2, 2)
    shard = shard_cache(local, p.lengths, pm)
    with pytest.raises(NotImplementedError, match="a shard holds only its share"):
        nm.mla_decode(p.q, shard, p.scale, backend="reference")
    moved = shard.with_lengths(np.array([7, 4], np.int32))
    assert moved.local.lengths_host.tolist() == [3, 2] and moved.lengths_host.tolist() == [7, 4]


# The tensor-core kernels (16-bit caches): the cp.async one on paged shards of small pages,
# the copy-engine one (seesaw.py) on contiguous shards.
MMA_CASES = [
    ("causal", "softcap", 2, "interleaved", "paged", "bf16", 1, 2, 2, [70]),
    ("window3", "alibi", 3, "blocks", "contiguous", "fp16", 1, 1, 2, [100]),
]


@pytest.mark.parametrize("case", MMA_CASES, ids=_case_id)
def test_sharded_decode_tensor_cores(rng, case):
    from helpers import kernel_backends

    if "mma" not in kernel_backends(case[5]):
        pytest.skip("no tensor-core backend here")
    check_sharded(rng, *case, backend="mma")


@pytest.mark.parametrize("backend", ["simple"])
def test_sharded_decode_other_kernels(rng, backend):
    """Every partition kernel takes a shard's position map (the simple kernel did not)."""
    check_sharded(rng, "causal", "alibi", 2, "interleaved", "paged", "fp32", 1, 2, 1, [7],
                  backend=backend)
