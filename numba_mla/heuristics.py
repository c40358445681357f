"""Tile sizes and the split-K factor, chosen from the shape and the device."""
import math

from ._compat import SIMULATOR

#: Streaming multiprocessors assumed when none can be queried (the simulator).
FALLBACK_SM_COUNT = 16


def simt_tiles():
    """(BLOCK_M, BLOCK_N) of the FMA kernel. The simulator runs Python threads and pays ~30 ms a
    barrier, so it uses narrow key tiles; the kernel source is the same."""
    return (16, 8) if SIMULATOR else (16, 32)


def sm_count():
    if SIMULATOR:
        return FALLBACK_SM_COUNT
    from numba import cuda

    return cuda.get_current_device().MULTIPROCESSOR_COUNT


def num_partitions(batch, row_groups, max_keys, block_n, sms=None, blocks_per_sm=1):
    """Split-K factor P: enough blocks (B x G x P) to give every multiprocessor about two
    blocks, but at least two key tiles per partition so the combine stays cheap."""
    sms = sm_count() if sms is None else sms
    tiles = math.ceil(max_keys / block_n)
    if tiles <= 1:
        return 1
    blocks = max(1, batch * row_groups)
    want = math.ceil(2 * sms * blocks_per_sm / blocks)
    return max(1, min(want, math.ceil(tiles / 2)))
