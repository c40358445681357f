"""The split-K heuristic: enough blocks to fill the device, never more partitions than key
tiles can feed, and the key count taken from what the mask can keep."""
import numpy as np
import pytest

import numba_mla as nm
from numba_mla import heuristics


@pytest.mark.parametrize("mask,lengths,counts,want", [
    (nm.NullMask(), [65536, 100], [1, 1], 65536),
    (nm.SlidingWindowCausalMask(256), [65536, 100], [1, 1], 256),
    (nm.SlidingWindowCausalMask(256), [65536], [4], 259),   # 4 queries: the window slides 3
    (nm.ChunkedMask(64), [1000], [2], 1000 - 960),           # the last chunk, cut at the length
    (nm.CausalMask(), [0, 7], [0, 7], 7),                    # an empty sequence counts nothing
], ids=["null", "window", "window-Sq4", "chunked", "causal-empty"])
def test_longest_key_range(mask, lengths, counts, want):
    got = heuristics.longest_key_range(mask, np.array(lengths), np.array(counts))
    assert got == want


def test_num_partitions():
    """One resident block per multiprocessor: the fewest partitions that minimise
    waves x tiles per partition, plus the workspace's round trip of a split."""
    sms = 132
    # B=1, H=128 (2 row groups), 1024 tiles: 64 partitions of 16 tiles, one wave of 128 blocks
    # (66 would be no faster: still 16 tiles for some partition).
    assert heuristics.num_partitions(1, 2, 65536, 64, sms) == 64
    # 128 blocks already (almost) fill the device: no split, no combine.
    assert heuristics.num_partitions(64, 2, 4096, 64, sms) == 1
    # 64 blocks: two partitions make one full wave.
    assert heuristics.num_partitions(64, 1, 4096, 64, sms) == 2
    assert heuristics.num_partitions(1, 1, 64, 64, sms) == 1
    assert heuristics.num_partitions(1, 1, 0, 64, sms) == 1
    for blocks, keys in [(1, 65536), (3, 5000), (16, 32768), (200, 1000)]:
        P = heuristics.num_partitions(blocks, 1, keys, 64, sms)
        tiles = -(-keys // 64)

        def cost(n):
            return (-(-blocks * n // sms) * (-(-tiles // n) + heuristics.BLOCK_OVERHEAD_TILES)
                    + (n > 1) * heuristics.WORKSPACE_TILES * blocks * n / sms)

        assert all(cost(P) <= cost(n) for n in range(1, min(tiles, 256) + 1))


def test_combine_split():
    """Partition groups of a combine block: several for one long row (B=1: 128 rows, 64
    partitions), one where rows alone fill the device or a step takes all partitions."""
    from numba_mla.kernels import combine

    assert combine.split(128, 64, 132) == combine.MAX_SPLIT
    assert combine.split(2048, 4, 132) == 1
    assert combine.split(1024, 2, 132) == 1
    assert combine.split(128, 2 * combine.UNROLL, 132) == 2
    assert combine.split(1, 1, 132) == 1


def test_mma_sync_block_m():
    """The warp tensor-core kernel's 32-row block where a sequence has more than 16 query
    rows and a block may take its 192 KB (an H100 or H200: 227 KB), else 16 rows (an A100:
    163 KB; Ada and sm_86: 99 KB)."""
    from numba_mla.kernels import mma_sync

    assert mma_sync.smem_bytes(32) == 196096 and mma_sync.threads(32) == 256
    assert heuristics.mma_sync_block_m(128, limit=232448) == 32
    assert heuristics.mma_sync_block_m(17, limit=232448) == 32
    assert heuristics.mma_sync_block_m(16, limit=232448) == 16
    assert heuristics.mma_sync_block_m(128, limit=166912) == 16  # A100
    assert heuristics.mma_sync_block_m(128, limit=101376) == 16  # sm_86 / sm_89
    # FP8 rows staged (an H100 or H200): 32 rows at 16 too, 8 warps sharing the conversion;
    # loaded by the warps (an Ada GPU's 99 KB): 16
    for fp8 in ("e4m3", "v32"):
        assert heuristics.mma_sync_shape(16, fp8, limit=232448) == (32, 2 if fp8 == "e4m3" else 1)
        assert heuristics.mma_sync_shape(1, fp8, limit=101376) == (16, False)
    assert heuristics.resident_blocks(mma_sync.smem_bytes(32), mma_sync.min_blocks(32),
                                      per_sm=233472, reserved=1024) == 1


def test_mma_sync_shape_for_fp8_rows():
    """FP8 rows: staged through shared memory where a block may take it (155-160 KB at 32
    rows, 132-137 at 16), the rows a block as for 16-bit caches; loaded by the warps on an
    Ada GPU (99 KB a block: neither staged block fits). Staged, they take 32 rows at 16 rows
    too (8 warps share the conversion), where that block fits."""
    from numba_mla.kernels import mma_sync

    assert mma_sync.smem_bytes(32, "e4m3", True) == 158208
    assert mma_sync.smem_bytes(16, "v32", True) == 140032
    for fp8 in ("e4m3", "v32"):
        assert heuristics.mma_sync_shape(16, fp8, limit=232448) == (32, 2 if fp8 == "e4m3" else 1)
        assert heuristics.mma_sync_shape(16, fp8, limit=144000) == (16, True)
        assert heuristics.mma_sync_shape(20, fp8, limit=166912) == (32, True)  # 163 KB
        assert heuristics.mma_sync_shape(128, fp8, limit=144000) == (16, True)
        assert heuristics.mma_sync_shape(128, fp8, limit=101376) == (16, False)  # Ada
    assert heuristics.mma_sync_shape(16, None, limit=232448) == (16, False)


def test_resident_blocks():
    """Blocks a multiprocessor holds, by shared memory (plus the driver's 1 KB a block) and
    the launch bound: the warp tensor-core kernel's 98,048 bytes fit twice in an H200's or an
    A100's multiprocessor, once in an Ada or sm_86 one; and the split model then sees two
    slots a multiprocessor: 128 sequences of 128 tiles, one row group, split in two on the
    H200's 264 slots, not on its 132."""
    from numba_mla.kernels import mma_sync

    smem = mma_sync.smem_bytes()
    assert smem == 98048
    assert heuristics.resident_blocks(smem, 2, per_sm=233472, reserved=1024) == 2  # H200
    assert heuristics.resident_blocks(smem, 2, per_sm=167936, reserved=1024) == 1  # A100: 164 KB
    assert heuristics.resident_blocks(smem, 2, per_sm=102400, reserved=1024) == 1  # sm_86/89
    assert heuristics.resident_blocks(smem, 1, per_sm=233472, reserved=1024) == 1  # the bound
    assert heuristics.resident_blocks(300_000, 2, per_sm=233472, reserved=1024) == 1  # at least 1
    assert heuristics.balanced_split([8192] * 128, 64, 1, sms=132)[1] == 1
    assert heuristics.balanced_split([8192] * 128, 64, 1, sms=264)[1] == 2
