"""Tile sizes and the split-K factor, chosen from the shape and the device."""
import math

from ._compat import SIMULATOR

#: Streaming multiprocessors assumed when none can be queried (the simulator).
FALLBACK_SM_COUNT = 16


def simt_block_m(rows, packed):
    """Query rows per block of the FMA kernel: 32 where a sequence has more than 16 rows
    (fewer re-reads of each key tile, 2x the FMAs per shared-memory load), else 16. fp32
    storage doubles the KV tile, and only 16 rows then fit beside it in shared memory."""
    return 32 if packed and rows > 16 else 16


def sm_count():
    if SIMULATOR:
        return FALLBACK_SM_COUNT
    from numba import cuda

    return cuda.get_current_device().MULTIPROCESSOR_COUNT


def longest_key_range(mask, lengths, counts):
    """The most keys any sequence's queries may keep: its length, cut to the mask's key range
    (a sliding window of 256 over 65536 keys counts 256), which is what split-K divides."""
    longest = 0
    for length, n in zip(lengths.tolist(), counts.tolist()):
        if length and n:
            k0, k1 = mask.key_range(length - n, length - 1)
            longest = max(longest, min(k1, length) - max(k0, 0))
    return longest


#: A block's fixed cost (queries in, output out), in key tiles.
BLOCK_OVERHEAD_TILES = 2


def num_partitions(batch, row_groups, max_keys, block_n, sms=None, max_parts=256):
    """Split-K factor P for a kernel with one resident block per multiprocessor (both
    kernels' shared memory allows no more): the blocks run in waves of ``sms``, so the time is
    about (waves) x (tiles per partition + a block's fixed cost, ``BLOCK_OVERHEAD_TILES``:
    loading the queries, writing the output). Pick the P that minimises it, the smallest on
    ties (fewer partitions: a cheaper combine, none at all for P = 1)."""
    sms = sm_count() if sms is None else sms
    tiles = math.ceil(max_keys / block_n)
    if tiles <= 1:
        return 1
    blocks = max(1, batch * row_groups)
    best, best_cost = 1, None
    for P in range(1, min(tiles, max_parts) + 1):
        cost = math.ceil(blocks * P / sms) * (math.ceil(tiles / P) + BLOCK_OVERHEAD_TILES)
        if best_cost is None or cost < best_cost:
            best, best_cost = P, cost
    return best
