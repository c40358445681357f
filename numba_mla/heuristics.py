"""Tile sizes and the split-K factor, chosen from the shape and the device."""
import functools
import heapq
import math

import numpy as np

from . import mods
from ._compat import SIMULATOR

#: Streaming multiprocessors assumed when none can be queried (the simulator).
FALLBACK_SM_COUNT = 16


def simt_block_m(rows, packed, fp8=None, limit=None):
    """Query rows per block of the FMA kernel: 32 where a sequence has more than 16 rows
    (fewer re-reads of each key tile, 2x the FMAs per shared-memory load) and the device gives
    a block its shared memory (``limit``, default the current device's), else 16. fp32
    storage doubles the KV tile, and only 16 rows then fit beside it in shared memory."""
    if packed and rows > 16:
        from .kernels import simt

        limit = smem_per_block() if limit is None else limit
        if simt.smem_bytes(32, packed, fp8) <= limit:
            return 32
    return 16


def sm_count():
    if SIMULATOR:
        return FALLBACK_SM_COUNT
    from numba import cuda

    return cuda.get_current_device().MULTIPROCESSOR_COUNT


#: Dynamic shared memory a block may take, assumed in the simulator (an H100's or H200's).
FALLBACK_SMEM_PER_BLOCK = 227 * 1024


def smem_per_block():
    """The most dynamic shared memory the current device gives one block (opted in)."""
    if SIMULATOR:
        return FALLBACK_SMEM_PER_BLOCK
    from numba import cuda

    try:
        return cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    except Exception:  # (an attribute this driver does not know)
        return 48 * 1024


def mma_sync_block_m(rows, limit=None, fp8=None):
    """Query rows a block of the warp tensor-core kernel: 32 (8 warps, two key tiles in
    flight, 192 KB; FP8 rows staged: 155-160 KB) where a sequence has more than 16 rows and the
    device gives a block that much shared memory (``limit``, default the current device's: an
    H100 or H200, not an A100 or an Ada GPU); else 16 (4 warps, one tile, 96 KB)."""
    return mma_sync_shape(rows, fp8, limit)[0]


def mma_sync_fits(block_m, fp8=None, limit=None):
    """``(staged, fits)`` of the warp tensor-core kernel's block of ``block_m`` rows: the
    stages of FP8 rows copied as they are by ``cp.async`` and converted in shared memory (2 for
    "e4m3" rows where they fit: the next two tiles' copies in flight while this one is
    converted and multiplied, 190.5 KB at 32 rows, an H100/H200; else 1: the next tile's copy in
    flight while this one is multiplied, 155-160 KB at 32 rows, 132-137 at 16; an A100 would
    take one, but FP8 needs sm_89), else 0: loaded and converted by the warps (an Ada GPU's
    99 KB, no copy in flight); and whether the block fits the shared memory a block may take
    (``limit``, default the current device's). (On the H200 two stages took the time of one
    for "e4m3" rows, and without the 72-byte spill one has at 32 rows and 16 heads; "v32" rows
    took 9-11% longer with two: docs/fp8.md.)"""
    from .kernels import mma_sync

    limit = smem_per_block() if limit is None else limit
    staged = 0
    if fp8 is not None:
        staged = max((n for n in ((1, 2) if fp8 == "e4m3" else (1,))
                      if mma_sync.smem_bytes(block_m, fp8, n) <= limit), default=0)
    return staged, mma_sync.smem_bytes(block_m, fp8, staged) <= limit


def mma_sync_shape(rows, fp8=None, limit=None):
    """``(block_m, staged)`` of the warp tensor-core kernel: its rows a block
    (``mma_sync_block_m``) and whether FP8 rows are staged (``mma_sync_fits``). FP8 rows
    staged through shared memory take the 32-row block at 16 rows too: the conversion of
    each tile bounds that kernel, and 8 warps share it where 4 would (0.86x the 16-row
    block's time on the H200 at 64 x 16 x 4096 and 128 x 16 x 8192, docs/fp8.md), though
    half its rows are then empty."""
    limit = smem_per_block() if limit is None else limit
    if rows > 16 or fp8:
        staged, fits = mma_sync_fits(32, fp8, limit)
        if fits and (rows > 16 or staged):
            return 32, staged
    return 16, mma_sync_fits(16, fp8, limit)[0]


def resident_blocks(smem_bytes, bound, per_sm=None, reserved=None):
    """Blocks of a kernel one multiprocessor holds at once: as many as its shared memory
    takes (``smem_bytes`` each, plus the ``reserved`` bytes the driver keeps a block: 1 KB
    from sm_80 on), at most ``bound`` (the kernel's launch bound, for which its registers were
    budgeted). ``per_sm`` and ``reserved`` default to the current device's; 1 in the simulator
    or where the device does not say. The split model's waves are this many blocks a
    multiprocessor (the warp tensor-core kernel's 96 KB: 2 on an H100 or H200, whose
    multiprocessors have 228 KB; 1 on an A100, 164 KB, or an RTX 30xx/40xx or L40S, 100 KB)."""
    if per_sm is None:
        if SIMULATOR:
            return 1
        from numba import cuda

        try:
            dev = cuda.get_current_device()
            per_sm = dev.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
            reserved = dev.RESERVED_SHARED_MEMORY_PER_BLOCK if reserved is None else reserved
        except Exception:  # (an attribute this driver does not know)
            return 1
    reserved = 1024 if reserved is None else reserved
    return max(1, min(bound, per_sm // (smem_bytes + reserved)))


def key_counts(mask, lengths, counts, positions=None):
    """Per sequence, the keys its queries may keep: its length cut to the mask's key range (a
    sliding window of 256 over 65536 keys counts 256; a sequence without keys or queries, 0).
    That range is what split-K divides; tiles outside it are never walked, so they count as no
    work. (Tiles a mask drops inside the range are counted: only the kernel sees them.)
    ``positions``: a shard's PositionMap (positions.py): the keys counted are the shard's
    local keys in that range, as its kernels walk them."""
    lengths = np.asarray(lengths, np.int64)
    counts = np.asarray(counts, np.int64)
    if positions is not None and positions.identity:
        positions = None
    if type(mask).key_range is mods.Mask.key_range and mask.range_rule() is mods._unbounded_range:
        # every key of every sequence (no loop)
        held = lengths if positions is None else positions.local_count(lengths)
        return np.where(counts > 0, held, 0)
    keys = np.zeros(lengths.shape[0], np.int64)
    for b, (length, n) in enumerate(zip(lengths.tolist(), counts.tolist())):
        if length and n:
            k0, k1 = mask.key_range(length - n, length - 1)
            k0, k1 = max(k0, 0), min(k1, length)
            if positions is not None:  # global [k0, k1) -> local j with k0 <= j*s + off < k1
                s, off = positions.stride, positions.offset
                k0, k1 = (max(0, -(-(k - off) // s)) for k in (k0, k1))
                k1 = min(k1, positions.local_count(length))
            keys[b] = max(0, k1 - k0)
    return keys


def longest_key_range(mask, lengths, counts, positions=None):
    """The most keys any sequence's queries may keep (``key_counts``)."""
    return int(key_counts(mask, lengths, counts, positions).max(initial=0))


#: A block's fixed cost (queries in, the pipeline filled, output out), in key tiles. With
#: WORKSPACE_TILES, fitted to the tensor-core backend's 30 timings of two H200 benches
#: (c54d4db and a2e8613: 6 equal-length shapes, 9 spread ones, each twice, with different
#: splits of the spread 64 x 128 ones; docs/performance.md): the model's time is within 2.4%
#: of the measured one on average, 9% at worst, a time per tile fitted for each shape.
#: Earlier fits: 2 tiles and no workspace term (21% off on average; 64 x 128 heads with
#: spread lengths split 3-5 ways, 1.7x the time of one partition), then 4 tiles and a
#: workspace term that did not depend on the rows (4% on average, 15% at worst; it still
#: split 64 x 128 heads at spread 0.5 four ways, 243 us where one partition takes ~220).
BLOCK_OVERHEAD_TILES = 5
#: A split block's partial output written to the workspace and read back by the combine, in
#: key tiles (64 keys x 576 x 2 bytes), for a block of 64 real query rows (64 x 512 fp32,
#: 128 KB), in proportion for fewer (H = 16 fills 16 of a 64-row block): moved at the whole
#: device's bandwidth, so a launch of n split blocks adds n x this / sms.
WORKSPACE_TILES = 8.8
WORKSPACE_ROWS = 64  # the rows WORKSPACE_TILES is given for
#: The cost of a block whose partition is empty (it reads its sequence's length and offsets,
#: writes LSE -inf and leaves), in key tiles: an estimate (a dependent pair of global loads
#: against about 2 us of HBM time a 64-key tile takes a multiprocessor), not a measurement.
EMPTY_BLOCK_TILES = 0.5


def num_partitions(batch, row_groups, max_keys, block_n, sms=None, max_parts=256, rows=None):
    """Split-K factor P for a kernel with one resident block per multiprocessor (both
    kernels' shared memory allows no more): the blocks run in waves of ``sms``, so the time is
    about (waves) x (tiles per partition + a block's fixed cost, ``BLOCK_OVERHEAD_TILES``:
    loading the queries, writing the output), plus for P > 1 the workspace's round trip
    (``WORKSPACE_TILES`` a block of 64 real rows, at the device's bandwidth; ``rows``: a
    sequence's query rows, all its row groups together, 64 a group when not given). Pick the
    P that minimises it, the smallest on ties (fewer partitions: a cheaper combine, none at
    all for P = 1)."""
    sms = sm_count() if sms is None else sms
    tiles = math.ceil(max_keys / block_n)
    if tiles <= 1:
        return 1
    blocks = max(1, batch * row_groups)
    workspace = WORKSPACE_TILES * _row_share(rows, row_groups)
    best, best_cost = 1, None
    for P in range(1, min(tiles, max_parts) + 1):
        cost = math.ceil(blocks * P / sms) * (math.ceil(tiles / P) + BLOCK_OVERHEAD_TILES)
        if P > 1:
            cost += workspace * blocks * P / sms
        if best_cost is None or cost < best_cost:
            best, best_cost = P, cost
    return best


def partition_range(ntiles, p, nparts, chunk):
    """The host form of kernels/common.partition_tiles (the tiles ``[t0, t1)`` partition ``p``
    of ``nparts`` walks), for the cost model and the tests."""
    per_part = max(chunk, -(-ntiles // nparts))
    t0 = min(p * per_part, ntiles)
    return t0, min(t0 + per_part, ntiles)


def _row_share(rows, row_groups):
    """A block's real query rows over WORKSPACE_ROWS (``rows``: a sequence's, all its groups;
    None: full 64-row blocks)."""
    groups = max(1, row_groups)
    return 1.0 if rows is None else rows / groups / WORKSPACE_ROWS


#: Batches up to SMALL_BATCH sequences of up to SMALL_TILES tiles take balanced_split's
#: plain-Python form: there the NumPy form's fixed cost (a dozen array operations) is most of
#: a call's schedule (on this project's CPU: 3 against 7 us for one short sequence, 50 against
#: 52 us for four of 128 tiles; longer ones are faster in NumPy).
SMALL_BATCH = 4
SMALL_TILES = 128


def _balanced_split_small(keys, block_n, row_groups, sms, max_parts, rows):
    """``balanced_split`` for a short list of key counts, in plain Python: the same
    candidates in the same order and the same floating-point operations, so the same
    result (tests/test_schedule.py compares the two)."""
    tiles = [t for t in (-(-k // block_n) for k in keys) if t > 0]
    longest = max(tiles, default=0)
    if longest <= 1:
        return 0, 1
    groups = max(1, row_groups)
    total, n = sum(tiles), len(tiles)
    workspace = WORKSPACE_TILES * _row_share(rows, groups)
    best, best_cost = None, None
    for chunk in sorted({-(-longest // p) for p in range(1, min(longest, max_parts) + 1)},
                        reverse=True):  # the fewest partitions first
        parts = -(-longest // chunk)
        used = sum(-(-t // chunk) for t in tiles)
        work = groups * (total + BLOCK_OVERHEAD_TILES * used
                         + EMPTY_BLOCK_TILES * (n * parts - used))
        longest_block = chunk + BLOCK_OVERHEAD_TILES
        cost = float(math.ceil(work / (sms * longest_block)) * longest_block)
        cost += workspace * groups * used / sms if parts > 1 else 0.0
        if best_cost is None or cost < best_cost:
            best, best_cost = (chunk, parts), cost
    return best


def balanced_split(keys, block_n, row_groups, sms=None, max_parts=256, rows=None):
    """The balanced split-K schedule for sequences of ``keys`` keys (``key_counts``): returns
    ``(chunk, P)``, every partition walking ``chunk`` tiles of ``block_n`` keys
    (kernels/common.partition_tiles), a sequence of ``n`` tiles using the first
    ``ceil(n / chunk)`` of the ``P = ceil(longest / chunk)`` partitions, the rest finding
    theirs empty. One partition (P = 1) is the direct kernel, no combine.

    Why one chunk for all: the blocks of a launch (P x row groups x B) then carry about the
    same work whatever their sequence's length, and the hardware hands each multiprocessor a
    new block as soon as it is free; a split factor from the longest sequence alone gives the
    short ones short partitions, so their multiprocessors idle behind the long ones.

    The chunk minimises a cost model, the fewest partitions on ties (a cheaper combine, none
    at all for P = 1): with ``W`` the total work (kept tiles, plus ``BLOCK_OVERHEAD_TILES`` a
    block with work and ``EMPTY_BLOCK_TILES`` an empty one) and ``L = chunk +
    BLOCK_OVERHEAD_TILES`` the longest block, the time is ``ceil(W / (sms L))`` waves of
    ``L``, plus the workspace's round trip for P > 1 (``WORKSPACE_TILES`` a block with work
    and 64 real rows, in proportion for fewer; ``rows``: a sequence's query rows, Sq x H):
    for equal lengths exactly ``num_partitions``' model (the blocks come in waves of
    ``sms``), for unequal ones the work packed into waves of the longest block. Candidates
    are the distinct ``ceil(longest / P)`` for P = 1 ... ``max_parts`` (about
    2 sqrt(tiles) of them), each costed in one vectorised pass over the batch."""
    sms = sm_count() if sms is None else sms
    if len(keys) <= SMALL_BATCH and max(keys, default=0) <= SMALL_TILES * block_n:
        # (the same arithmetic in plain Python: microseconds less where it is short)
        return _balanced_split_small([int(k) for k in keys], block_n, row_groups, sms,
                                     max_parts, rows)
    tiles = -(-np.asarray(keys, np.int64) // block_n)
    tiles = tiles[tiles > 0]
    longest = int(tiles.max(initial=0))
    if longest <= 1:
        return 0, 1
    groups = max(1, row_groups)
    total = int(tiles.sum())
    chunks = np.unique(-(-longest // np.arange(1, min(longest, max_parts) + 1)))[::-1]
    parts = -(-longest // chunks)  # ascending: the fewest partitions first
    used = (-(-tiles[None, :] // chunks[:, None])).sum(axis=1)  # blocks with work, a group
    empty = tiles.size * parts - used
    work = groups * (total + BLOCK_OVERHEAD_TILES * used + EMPTY_BLOCK_TILES * empty)
    longest_block = chunks + BLOCK_OVERHEAD_TILES
    cost = np.ceil(work / (sms * longest_block)) * longest_block
    workspace = WORKSPACE_TILES * _row_share(rows, groups)
    cost += np.where(parts > 1, workspace * groups * used / sms, 0.0)
    best = int(np.argmin(cost))  # the first of equal minima: the fewest partitions
    return int(chunks[best]), int(parts[best])


# ---------------------------------------------------------------------------------------------
# The listed schedule: a piece count for each sequence, blocks launched longest first
# ---------------------------------------------------------------------------------------------
#: The listed schedule is taken where its modelled time is below this fraction of the
#: balanced one's. Measured on the H200 (three varlen sweeps in one session, the listed
#: schedule wherever the model gave any gain, then nowhere, then again; docs/performance.md):
#: where the balanced schedule split, modelled 0.92 / 0.95 / 0.95 gave 0.91 / 0.95 / 0.97 of
#: its time. Where it ran one partition (64 x 128 x 4096, spread 0.5), modelled 0.96 took
#: 1.13x with the first combine, and the listed schedule was kept to split launches; with the
#: one-step combine (25bd3fc) a probe of forced targets there took 0.90x (48 tiles, two
#: pieces at most) to 1.07x (one piece: workspace and combine for nothing) of its time.
LISTED_GAIN = 0.97
#: The most pieces the listed schedule cuts a sequence into, and how many of its candidates
#: (those of the lowest bounds) are costed in full.
LISTED_MAX_PIECES = 16
LISTED_CANDIDATES = 4
#: Besides the targets ``ceil(longest / k)``, the listed schedule costs, for 1 ... this many
#: waves of blocks, the smallest target whose blocks fit in that many waves of ``sms``: the
#: pieces are then as short as the waves allow (on the varlen bench's draws these were the
#: best targets of all in the model, e.g. 128 x 16 x 8192 at spread 0.5: 83 tiles and 263
#: blocks, 0.93x the modelled time of the best ``ceil(longest / k)``).
LISTED_WAVES = 3
#: Where the balanced schedule is one partition (the direct kernel, no merge), the listed one
#: also pays the merge kernel's launch and its run, which the workspace term (a share of the
#: device's bandwidth for each block) leaves out: about 5 us (Nsight Compute, the one-step
#: merge at 64 x 16 x 4096), about two tiles' time. An estimate, not fitted.
MERGE_TILES = 2.0
#: The launch order of the listed schedule's blocks of equal cost: False, a sequence's row
#: groups one after the other (each group's pieces in turn, so that the two groups' blocks of
#: one piece are ``pieces`` apart); True, each piece's row groups side by side, so that the
#: blocks that read the same tiles start together and meet in L2 (the balanced grid's
#: order puts them P apart too; the runs schedule's blocks side by side). True since an H100
#: A/B (two rounds): 0.954x / 0.971x the time at 16 x 128 x 32768, spread 0.25 / 0.5,
#: 0.987x at 64 x 128 x 4096, spread 0.5, the rest 0.999-1.001x (docs/performance.md)
LISTED_GROUPS_SIDE_BY_SIDE = True


def _greedy_makespan(sizes, sms):
    """About the time blocks of ``sizes`` take on ``sms`` multiprocessors when they are
    launched largest first and the hardware hands each to the multiprocessor that frees first
    (the longest-processing-time rule), a round of ``sms`` blocks at a time: a round's blocks,
    largest first, go to the multiprocessors least loaded first. (Within 2% of the rule taken
    block by block on 300 random lists of 2-1200 blocks, in a tenth of its time.)"""
    ordered = np.sort(np.asarray(sizes, np.float64))[::-1]
    rounds = -(-ordered.size // sms)
    ordered = np.concatenate([ordered, np.zeros(rounds * sms - ordered.size)])
    loads = np.zeros(sms)
    for round_sizes in ordered.reshape(rounds, sms):
        loads = np.sort(loads) + round_sizes
    return float(loads.max(initial=0.0))


def _in_order_makespan(sizes, sms):
    """The time blocks of ``sizes`` take on ``sms`` multiprocessors when the hardware hands
    them out in launch order, each to the multiprocessor that frees first: how a grid's
    blocks run (one resident block a multiprocessor). Exact under the model (a heap of the
    multiprocessors' loads; about 0.5 ms for 2000 blocks)."""
    loads = [0.0] * sms
    for size in np.asarray(sizes, np.float64).tolist():
        heapq.heapreplace(loads, loads[0] + size)
    return max(loads)


def _balanced_blocks(tiles, chunk, parts, groups):
    """The block costs of the balanced schedule (chunk, parts) over sequences of ``tiles``,
    in launch order: its grid is (P, G, B), the partition varying fastest."""
    per = np.maximum(chunk, -(-tiles // parts))[:, None]
    t0 = np.minimum(np.arange(parts)[None, :] * per, tiles[:, None])
    n = np.minimum(t0 + per, tiles[:, None]) - t0
    cost = np.where(n > 0, n + BLOCK_OVERHEAD_TILES, EMPTY_BLOCK_TILES)  # [B, P]
    return np.repeat(cost[:, None, :], groups, axis=1).ravel().astype(np.float64)


def _balanced_cost(tiles, chunk, parts, groups, sms, share):
    """The balanced schedule's modelled time in tile-times: its blocks in grid order, and a
    split launch's workspace (``share``: a 64-row block's WORKSPACE_TILES times its real rows'
    share). One partition is the direct kernel, which writes out itself: no workspace, no
    merge."""
    blocks = _balanced_blocks(tiles, chunk, parts, groups)
    used = int((blocks > EMPTY_BLOCK_TILES).sum())
    return _in_order_makespan(blocks, sms) + (share * used / sms if parts > 1 else 0.0)


def _listed_cost(pieces, tiles, groups, sms, share, merge):
    """The listed schedule's modelled time for ``pieces`` (a sequence's piece count each):
    its blocks largest first, every block with work writing the workspace, and ``merge``
    (MERGE_TILES where the balanced launch would have had no merge, else 0)."""
    pieces = np.asarray(pieces, np.int64)
    P = int(pieces.max())
    piece = -(-tiles // pieces) + BLOCK_OVERHEAD_TILES
    sizes = np.concatenate([np.repeat(piece, pieces * groups),
                            np.full(int(groups * (tiles.size * P - pieces.sum())),
                                    EMPTY_BLOCK_TILES)])
    used = groups * int(pieces.sum())  # (blocks with work)
    return _greedy_makespan(sizes, sms) + share * used / sms + merge


def listed_split(keys, block_n, row_groups, sms=None, rows=None, max_pieces=LISTED_MAX_PIECES,
                 balanced=None):
    """The listed schedule for sequences of ``keys`` keys, where it beats the balanced one
    (``balanced_split``) in the cost model; else None. Returns ``pieces``: int32 [B], sequence
    b's tiles cut into ``pieces[b]`` runs of equal length (kernels/common.partition_tiles with
    chunk 0), each a block; ``P = pieces.max()`` partitions in the workspace, a sequence of
    fewer pieces filling the rest with empty blocks (so the combine is the usual one).
    ``list_blocks`` orders the blocks.

    Why: the balanced schedule gives every block the same chunk, so a batch of spread lengths
    either leaves its longest sequences whole (their blocks the launch's tail) or cuts every
    sequence as if it were long (a block's fixed cost for each piece). Here each sequence is
    cut only as far as a common target length needs, and the blocks are launched longest
    first, so that the short ones fill in behind the long ones (the hardware hands each block
    to the multiprocessor that frees first).

    The model: a block costs its tiles plus ``BLOCK_OVERHEAD_TILES``, an empty one
    ``EMPTY_BLOCK_TILES``; every block with work writes the workspace (``WORKSPACE_TILES`` a
    block of 64 real rows, at the device's bandwidth); the blocks are handed out longest
    first (``_greedy_makespan``). The balanced schedule's blocks are handed out in its grid's
    order (``_in_order_makespan``): a sequence's pieces side by side, long and short as the
    batch has them, so that with spread lengths a multiprocessor may take two long pieces
    where others take short ones (16 x 128 x 32768 at spread 0.5 on the varlen bench's draw:
    169 tile-times in grid order, 132 largest first, 123 the work over 132 multiprocessors).
    The listed one is taken where it is below ``LISTED_GAIN`` times that (a one-partition
    balanced launch, which writes ``out`` directly, costs no workspace and no merge: the
    listed one is charged ``MERGE_TILES`` more there). Candidates: a
    target of ``ceil(longest / k)`` tiles for k = 1 ... ``max_pieces``, and the targets that
    fill 1 ... ``LISTED_WAVES`` waves (``_wave_targets``); the ``LISTED_CANDIDATES`` with the
    lowest bound (the larger of the longest block and the total work over ``sms``) and the
    wave-filling ones are costed in full where that bound is below the best cost so far.
    ``balanced``: ``balanced_split``'s result for these arguments, when the caller has it.
    Host time: 0.2-0.3 ms for 64-512 sequences of spread lengths (once a cache object)."""
    sms = sm_count() if sms is None else sms
    tiles = -(-np.asarray(keys, np.int64) // block_n)
    if tiles.size < 2 or tiles.max(initial=0) <= 1 or tiles.min() == tiles.max():
        return None  # one sequence, or equal lengths: the balanced schedule is the best
    groups = max(1, row_groups)
    share = WORKSPACE_TILES * _row_share(rows, groups)
    chunk, parts = balanced or balanced_split(keys, block_n, groups, sms=sms, rows=rows)
    balanced_cost = _balanced_cost(tiles, chunk, parts, groups, sms, share)
    merge = MERGE_TILES if parts == 1 else 0.0
    longest = int(tiles.max())
    waves = _wave_targets(tiles, groups, sms, -(-longest // max_pieces), longest)
    targets = np.unique(np.concatenate([
        -(-longest // np.arange(1, min(longest, max_pieces) + 1)), waves]))
    filling = np.isin(targets, waves)
    pieces = np.maximum(1, -(-tiles[None, :] // targets[:, None]))  # [candidates, B]
    piece = -(-tiles[None, :] // pieces) + BLOCK_OVERHEAD_TILES
    P = pieces.max(axis=1)
    work = groups * ((pieces * piece).sum(axis=1)
                     + EMPTY_BLOCK_TILES * (tiles.size * P - pieces.sum(axis=1)))
    bound = (np.maximum(piece.max(axis=1), work / sms)
             + share * groups * pieces.sum(axis=1) / sms + merge)
    best, best_cost = None, balanced_cost * LISTED_GAIN
    order = np.argsort(bound, kind="stable")
    lowest = order[:LISTED_CANDIDATES]
    for i in np.concatenate([lowest, order[filling[order] & ~np.isin(order, lowest)]]).tolist():
        if bound[i] >= best_cost:
            continue  # (cannot do better)
        if P[i] == 1:
            continue  # every sequence whole: the balanced schedule's one partition, direct
        cost = _listed_cost(pieces[i], tiles, groups, sms, share, merge)
        if cost < best_cost:
            best, best_cost = i, cost
    return None if best is None else pieces[best].astype(np.int32)


def _wave_targets(tiles, groups, sms, lo, hi):
    """For w = 1 ... ``LISTED_WAVES``: the smallest target T in [lo, hi] whose blocks
    (``groups`` x the sum of ceil(tiles / T)) fit in w waves of ``sms``, where one does (the
    count falls as T grows: a bisection)."""
    def blocks(T):
        return groups * int((-(-tiles // T)).sum())

    found = []
    for waves in range(1, LISTED_WAVES + 1):
        if blocks(hi) > waves * sms:
            continue
        a, b = lo, hi  # blocks(b) fits
        while a < b:
            m = (a + b) // 2
            if blocks(m) <= waves * sms:
                b = m
            else:
                a = m + 1
        found.append(a)
    return np.asarray(found, np.int64)


def list_blocks(pieces, tiles, row_groups):
    """The listed schedule's blocks in launch order: int32 [N, 4] rows ``(b, g, p, n)``
    (sequence, row group, piece, the sequence's pieces), one for every sequence, row group and
    piece ``p < P = max(pieces)`` (``p >= n``: an empty block, which marks its LSEs -inf for
    the combine), ordered by the modelled cost of the block, largest first; ties in (b, g, p)
    order, or (b, p, g) with ``LISTED_GROUPS_SIDE_BY_SIDE``. ``tiles``: each sequence's key
    tiles as planned (the kernel walks the tiles its lengths hold when it runs:
    partition_tiles with chunk 0 covers them whatever they are)."""
    pieces = np.asarray(pieces, np.int64)
    tiles = np.asarray(tiles, np.int64)
    B, P, G = pieces.size, int(pieces.max(initial=1)), max(1, row_groups)
    grid = np.meshgrid(np.arange(B), np.arange(G), np.arange(P), indexing="ij")
    if LISTED_GROUPS_SIDE_BY_SIDE:  # (ties piece by piece: (b, p, g))
        grid = [a.transpose(0, 2, 1) for a in grid]
    b, g, p = (a.ravel() for a in grid)
    n = pieces[b]
    cost = np.where(p < n, -(-tiles[b] // np.maximum(n, 1)) + BLOCK_OVERHEAD_TILES,
                    EMPTY_BLOCK_TILES)
    order = np.argsort(-cost, kind="stable")
    return np.stack([b, g, p, n], axis=1)[order].astype(np.int32)


#: The runs schedule (``run_schedule``; the seesaw kernel's ``runs`` form, where
#: ``runs_split`` takes it or selector.SEESAW_RUNS forces it): an item's fixed cost in
#: tile-times besides its tiles (its queries' copy, its first tiles' wait, its output), and
#: the shortest piece it cuts off a sequence.
RUN_ITEM_TILES = 2
RUN_MIN_PIECE = 4


def _cut_runs(tiles, cap):
    """The greedy cut of the sequences' tiles, in order, into runs of at most ``cap``
    tile-times (an item costs its tiles plus ``RUN_ITEM_TILES``) where it can: a list of
    runs, each a list of items ``(b, t0, t1)``. Where a sequence's tiles do not fit in the
    run, it is cut so that both pieces have at least ``RUN_MIN_PIECE`` tiles, as much as fits
    in the run; where no such cut exists the run ends (a run of its own is cut anyway, at
    least a tile). So a run that ends leaves less than ``RUN_ITEM_TILES + 2 *
    RUN_MIN_PIECE`` of its cap unused. An empty sequence is an item ``(b, 0, 0)``."""
    runs, run, load = [], [], 0
    for b, n in enumerate(tiles.tolist()):
        t = 0
        while True:
            left = n - t
            room = cap - load - RUN_ITEM_TILES
            take = left
            if left > room:
                take = min(room, left - RUN_MIN_PIECE)
                if take < RUN_MIN_PIECE:
                    if run:
                        runs.append(run)
                        run, load = [], 0
                        continue
                    take = max(1, take)
            run.append((b, t, t + take))
            load += take + RUN_ITEM_TILES
            t += take
            if t >= n:
                break
    if run:
        runs.append(run)
    return runs


def _runs_work(tiles):
    """The batch's work in a runs schedule, in tile-times: each sequence's tiles plus
    ``RUN_ITEM_TILES`` (what one run holding every sequence whole costs)."""
    return int(tiles.sum()) + RUN_ITEM_TILES * tiles.size


def _runs_bound(tiles, nruns):
    """The least cap a run may have: the batch's work (``_runs_work``) over ``nruns`` runs, in
    whole tile-times."""
    return -(-_runs_work(tiles) // nruns)


def run_schedule(tiles, row_groups, sms=None):
    """The runs schedule over sequences of ``tiles`` key tiles (FlashMLA's kind: one wave of
    persistent blocks, each walking a run of (sequence, tiles) items that may cross sequence
    boundaries). The sequences' tiles are laid end to end and cut into at most ``sms //
    row_groups`` runs of equal cost (``_cut_runs`` at the smallest cap that needs no more: a
    bisection); each run becomes one block for each row group, side by side, so that the
    groups' reads of the same tiles meet in L2. A sequence's pieces take workspace partitions
    0, 1, ... in order.

    Returns int32 ``[N + I, 5]``: rows 0 .. N-1 a block's ``(first item row, items, 0, 0,
    0)``, then the item rows ``(b, g, slot, t0, t1)``: tiles [t0, t1) of sequence b's row
    group g into partition ``slot``, ``t1 = -1`` for a sequence's last piece: to whatever
    tiles it holds when the kernel runs, its partitions past ``slot`` marked empty (so lengths
    changed on the device since planning are still covered exactly once). ``P``, the
    partitions a sequence may have, is the most pieces of any: ``runs_partitions``."""
    sms = sm_count() if sms is None else sms
    tiles = np.asarray(tiles, np.int64)
    G = max(1, row_groups)
    nruns = max(1, sms // G)
    lo = max(1, _runs_bound(tiles, nruns))
    hi = _runs_work(tiles) + RUN_MIN_PIECE
    # (the count of runs falls as the cap grows; a greedy cut leaves little of each run's
    # cap unused, so the cap is near the bound ``lo``: steps that double from it find a
    # bracket first, so that the bisection cuts a few times rather than ~log2(hi))
    step = 8
    while lo + step < hi and len(_cut_runs(tiles, lo + step)) > nruns:
        lo += step + 1
        step *= 2
    hi = min(hi, lo + step)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_cut_runs(tiles, mid)) <= nruns:
            hi = mid
        else:
            lo = mid + 1
    runs = _cut_runs(tiles, lo)
    last = {b: t1 for run in runs for b, _, t1 in run}  # (a sequence's last piece: the latest)
    slot = np.zeros(tiles.size, np.int64)
    items = []
    for run in runs:
        its = []
        for b, t0, t1 in run:
            its.append((b, int(slot[b]), t0, -1 if t1 == last[b] else t1))
            slot[b] += 1
        items.append(its)
    return runs_table(items, G)


#: Whole-sequence runs (``whole_runs``): an item's fixed cost in tile-times there (its first
#: tiles' wait and its output, the queries copied under the item before: seesaw.RUNS_Q_EARLY),
#: fitted to an H100's A/B of whole sequences two to a block at 128 x 128 x 1024 (4.2)
WHOLE_ITEM_TILES = 4
#: ... and the modelled share of the other schedule's time below which they are taken. The
#: model is 7-10% optimistic for them (an H100's A/B at d5e1d0c, docs/performance.md: modelled
#: 0.735-0.892, measured 0.829-0.976, every one a gain); below 0.90 is where it was measured
WHOLE_GAIN = 0.90
#: ... and at equal lengths: True takes the whole runs there too, past one pair a
#: multiprocessor, whatever the model says (it gives them 0.976 of the grid's time at
#: 128 x 128 x 1024, two sequences a block; measured 0.967-0.982 on an H100 in two calls, and
#: 0.981 in a third at 61179e1, the other shapes unchanged; on since then)
WHOLE_EQUAL = True


def _longest_block(table, item_cost):
    """The most any block of a runs table (``runs_table``) costs: the sum of its items'
    ``item_cost`` (one a row of the table's items)."""
    nblocks = int(table[0, 0])
    return max(float(item_cost[f:f + n].sum()) for f, n in
               zip((table[:nblocks, 0] - nblocks).tolist(), table[:nblocks, 1].tolist()))


def _whole_nruns(nseqs, groups, sms):
    """The runs of ``whole_runs``: one a block for each row group, no more than a wave of
    blocks and no more than there are sequences (at least one)."""
    return max(1, min(sms // groups, nseqs))


def _whole_pack(tiles, nruns):
    """The longest-processing-time packing of ``whole_runs``: each sequence's run (in
    ``tiles``' order) and the longest run's load (its items' tiles plus ``WHOLE_ITEM_TILES``
    each). A heap of the runs' (load, run); ties go to the lower run."""
    order = np.argsort(-tiles, kind="stable")
    loads = [(0, r) for r in range(nruns)]
    run_of = np.empty(tiles.size, np.int64)
    for b, t in zip(order.tolist(), tiles[order].tolist()):
        load, r = heapq.heappop(loads)
        run_of[b] = r
        heapq.heappush(loads, (load + t + WHOLE_ITEM_TILES, r))
    return order, run_of, max(load for load, _ in loads)


def whole_runs(tiles, row_groups, sms=None, packed=None):
    """The runs schedule's table (``runs_table``) of whole sequences for a batch of more
    (sequence, row group) pairs than one wave: the sequences packed, longest first, each into
    the run that is least loaded so far (the longest-processing-time rule; an item costs its
    tiles plus ``WHOLE_ITEM_TILES``), into ``sms // row_groups`` runs (fewer where there are
    fewer sequences), each run a block for each row group, side by side. No sequence is cut,
    so every item writes ``out`` itself (one partition: no workspace, no merge); a run walks
    its sequences longest first. Where the grid hands out its blocks in launch order (the
    balanced schedule's one partition), a block may take two long sequences while another
    takes two short ones; here the loads are levelled before the launch. (With more row
    groups than multiprocessors this is one run, ``row_groups`` blocks: ``runs_split`` does
    not ask for it there.) ``packed``: ``_whole_pack``'s answer for these tiles, if made."""
    sms = sm_count() if sms is None else sms
    tiles = np.asarray(tiles, np.int64)
    G = max(1, row_groups)
    nruns = _whole_nruns(tiles.size, G, sms)
    order, run_of, _ = packed or _whole_pack(tiles, nruns)
    # the items run by run, each run's in the packing's order (longest first)
    seq = order[np.argsort(run_of[order], kind="stable")]
    run = run_of[seq]  # (nondecreasing)
    count = np.bincount(run_of, minlength=nruns)
    first = np.concatenate([[0], np.cumsum(count)[:-1]])  # a run's first item in ``seq``
    nblocks = nruns * G
    table = np.zeros((nblocks + G * tiles.size, 5), np.int32)
    r = np.repeat(np.arange(nruns), G)
    g = np.tile(np.arange(G), nruns)
    table[:nblocks, 0] = nblocks + G * first[r] + g * count[r]
    table[:nblocks, 1] = count[r]
    row0 = nblocks + G * first[run] + np.arange(tiles.size) - first[run]  # group 0's rows
    for gg in range(G):
        rows = row0 + gg * count[run]
        table[rows, 0] = seq
        table[rows, 1] = gg
        table[rows, 4] = -1
    return table


def _whole_cost(table, tiles):
    """``whole_runs``' modelled time in tile-times: its longest block, each item's tiles plus
    ``WHOLE_ITEM_TILES``, the first item's fixed cost the block's own ``BLOCK_OVERHEAD_TILES``
    (every item writes out itself: no workspace, no merge)."""
    cost = tiles[table[int(table[0, 0]):, 0]] + WHOLE_ITEM_TILES
    return _longest_block(table, cost) + BLOCK_OVERHEAD_TILES - WHOLE_ITEM_TILES


def runs_table(runs, row_groups):
    """The runs schedule's table (``run_schedule``) of ``runs``, each a list of items ``(b,
    slot, t0, t1)``: a block for each run and row group, side by side."""
    head, rows = [], []
    first = len(runs) * row_groups
    for its in runs:
        for g in range(row_groups):
            head.append((first + len(rows), len(its), 0, 0, 0))
            rows.extend((b, g, s, t0, t1) for b, s, t0, t1 in its)
    return np.asarray(head + rows, np.int32).reshape(-1, 5)


def runs_whole_items(table):
    """Whether a runs table (``runs_table``) has an item that is a whole sequence (its first
    piece, to its last tile: slot 0, ``t1 = -1``), which the mixed form (``MIXED_RUNS``)
    writes into out itself."""
    items = table[int(table[0, 0]) if len(table) else 0:]
    return bool(((items[:, 2] == 0) & (items[:, 4] < 0)).any())


def runs_partitions(table):
    """The workspace partitions ``run_schedule``'s table writes: the most pieces a sequence
    has."""
    nblocks = int(table[0, 0]) if len(table) else 0
    return int(table[nblocks:, 2].max(initial=0)) + 1


#: Where the selector takes the runs schedule by itself (``runs_split``): batches of at most
#: this many (sequence, row group) pairs a multiprocessor (few long sequences, so that a run
#: holds one or two items and a cut costs a sequence one or two more pieces; with many short
#: sequences the runs kernel's items each pay a start and the workspace where the grid
#: kernel's one partition writes out), and a modelled time below ``RUNS_GAIN`` of the
#: schedule it replaces (the balanced one, or the listed one where that is taken). Fitted to
#: the H100 A/Bs of the varlen sweep (docs/performance.md, "The runs schedule"): the model
#: is 0-14% optimistic for the runs form there; with these two rules it takes 16 x 128 x
#: 32768 at spread 0.25 and 0.5 (modelled 0.920 / 0.924, measured 0.949 / 0.962 at 188293c,
#: 0.965 / 0.972 with this rule at 9b77a38) and 64 x 16 x 4096 at 0.5 (0.885; 0.981, then
#: 0.987), and none of the configurations that measured
#: slower (64 x 16 x 4096 at 0.25: modelled 0.934, measured 1.028; 64 x 128 x 4096 at 0.5:
#: 128 pairs, modelled 0.925, measured 1.052).
RUNS_PAIRS_SHARE = 0.5
RUNS_GAIN = 0.93
#: Mixed runs: where the runs schedule cuts some sequences,
#: the items that are whole sequences write out and lse themselves (the runs kernel's
#: ``mixed`` form, the merge leaving their rows) where every item wrote the workspace, and
#: ``runs_split`` weighs the runs of ``mixed_runs`` too, which cut only the sequences that do
#: not fit; the pairs' bound (``RUNS_PAIRS_SHARE``) is then one pair a multiprocessor, since
#: a sequence that is not cut costs no workspace. Of the varlen sweep the model takes them at
#: 64 x 128 x 4096, spread 0.5, where they cut 30 of the 64 sequences
#: (scripts/schedule_model.py): 0.954x the listed schedule's time there on an H100 (f84eb99;
#: modelled 0.859); compute-sanitizer's four tools clean on the form (docs/performance.md)
MIXED_RUNS = True
#: ... the caps ``mixed_runs`` tries, from the work's lower bound up (and no cap at all). On
#: 320 random batches of 8-128 sequences, spread 0.25-0.9, the best of 48 caps was never
#: more than 7 above the bound, and these 12 and the uncapped packing matched it every time
MIXED_CAPS = 12


def _mixed_pack(tiles, nruns, cap):
    """``mixed_runs``' packing at ``cap`` tile-times a run (an item costs its tiles plus
    ``RUN_ITEM_TILES``): ``(runs, longest, cut)``, ``nruns`` runs each a list of items ``(b,
    t0, t1)``, the most a run costs, and the items of the sequences cut (of one row group).
    Sequences longest first; each goes whole into the least-loaded run where it fits, else
    that run is filled to the cap with a piece of it (at least ``RUN_MIN_PIECE`` tiles,
    leaving at least as many) and the rest goes on to the next least-loaded run; where no
    such cut exists the rest stays whole there (over the cap). An empty sequence is an item
    ``(b, 0, 0)``. Ties go to the lower run."""
    loads = [(0, r) for r in range(nruns)]
    runs = [[] for _ in range(nruns)]
    cut = 0
    for b in np.argsort(-tiles, kind="stable").tolist():
        n, t, pieces = int(tiles[b]), 0, 0
        while True:
            load, r = heapq.heappop(loads)
            room = cap - load - RUN_ITEM_TILES
            take = n - t
            if take > room and room >= RUN_MIN_PIECE and take - room >= RUN_MIN_PIECE:
                take = room
            runs[r].append((b, t, t + take))
            heapq.heappush(loads, (load + take + RUN_ITEM_TILES, r))
            t += take
            pieces += 1
            if t >= n:
                break
        if pieces > 1:
            cut += pieces
    return runs, max(load for load, _ in loads), cut


def _slotted(runs):
    """The items of ``runs`` (lists of ``(b, t0, t1)``) with their partitions, as
    ``runs_table`` takes them: a sequence's pieces take slots 0, 1, ... in the order of their
    tiles, its last piece ``t1 = -1``; empty runs dropped."""
    spans = {}
    for run in runs:
        for b, t0, t1 in run:
            spans.setdefault(b, []).append((t0, t1))
    slot_of, last = {}, {}
    for b, pieces in spans.items():
        pieces.sort()
        for k, (t0, _) in enumerate(pieces):
            slot_of[b, t0] = k
        last[b] = pieces[-1][0]
    return [[(b, slot_of[b, t0], t0, -1 if t0 == last[b] else t1) for b, t0, t1 in run]
            for run in runs if run]


def mixed_runs(tiles, row_groups, sms=None, share=None):
    """The runs schedule's table (``runs_table``) of the mixed runs (``MIXED_RUNS``):
    ``_mixed_pack`` into ``sms // row_groups`` runs at the cap, among ``MIXED_CAPS`` from the
    work's lower bound and none (nothing cut: the longest-first packing), that the model
    (``_mixed_time``, as ``_mixed_cost`` gives it for the table) puts least (``share``: a
    block's workspace in tile-times, WORKSPACE_TILES for 64 rows), each run a block for each
    row group, side by side. Only the sequences that do not fit are cut. The caps are weighed
    on the packing's own loads; one table is made."""
    sms = sm_count() if sms is None else sms
    tiles = np.asarray(tiles, np.int64)
    G = max(1, row_groups)
    share = WORKSPACE_TILES if share is None else share
    nruns = max(1, sms // G)
    lo = max(1, _runs_bound(tiles, nruns))
    best = None
    uncapped = _runs_work(tiles)
    for cap in list(range(lo, min(lo + MIXED_CAPS, uncapped))) + [uncapped]:
        runs, longest, cut = _mixed_pack(tiles, nruns, cap)
        cost = _mixed_time(longest, cut * G, sms, share)
        if best is None or cost < best[0]:
            best = (cost, runs)
    return runs_table(_slotted(best[1]), G)


def _item_costs(table, tiles):
    """A runs table's item rows and each item's cost in tile-times: its tiles (to the
    sequence's ``tiles`` where it runs to the last) plus ``RUN_ITEM_TILES``."""
    items = table[int(table[0, 0]):]
    t1 = np.where(items[:, 4] < 0, tiles[items[:, 0]], items[:, 4])
    return items, t1 - items[:, 3] + RUN_ITEM_TILES


def _runs_cost(table, tiles, sms, share):
    """The runs schedule's modelled time in tile-times: its longest block (an item's tiles
    plus ``RUN_ITEM_TILES``, the first item's fixed cost the block's own
    ``BLOCK_OVERHEAD_TILES``), and where it cuts a sequence every item's workspace and the
    merge."""
    items, cost = _item_costs(table, tiles)
    cut = runs_partitions(table) > 1
    return (_longest_block(table, cost) + BLOCK_OVERHEAD_TILES - RUN_ITEM_TILES
            + (share * len(items) / sms + MERGE_TILES if cut else 0.0))


def _mixed_time(longest, cut, sms, share):
    """The mixed runs' modelled time: the longest block's items (``longest`` tile-times), the
    first item's fixed cost the block's own ``BLOCK_OVERHEAD_TILES``, the workspace of the
    ``cut`` items (of sequences cut in pieces, every row group's) and the merge where any."""
    return (longest + BLOCK_OVERHEAD_TILES - RUN_ITEM_TILES
            + (share * cut / sms + MERGE_TILES if cut else 0.0))


def _mixed_cost(table, tiles, sms, share):
    """A runs table's modelled time where the items of whole sequences write out themselves
    (``MIXED_RUNS``): ``_mixed_time`` of its longest block as ``_runs_cost`` has it and its
    cut sequences' items."""
    items, cost = _item_costs(table, tiles)
    pieces = np.bincount(items[:, 0], minlength=tiles.size)  # (items of all row groups)
    groups = max(1, int(items[:, 1].max(initial=0)) + 1)
    cut = int(pieces[pieces > groups].sum())  # (the items of sequences cut in pieces)
    return _mixed_time(_longest_block(table, cost), cut, sms, share)


def runs_split(keys, block_n, row_groups, sms=None, rows=None, balanced=None, pieces=None):
    """The runs schedule's table (``run_schedule``) where the model takes it over the
    schedule the launch has otherwise (the balanced one, ``balanced`` = its (chunk, P), or
    the listed one's ``pieces`` where ``listed_split`` gave them): a batch of at most
    ``RUNS_PAIRS_SHARE`` (sequence, row group) pairs a multiprocessor (one pair with
    ``MIXED_RUNS``, which weighs the mixed runs too), with a modelled time below
    ``RUNS_GAIN`` of the other's; past one pair a multiprocessor, the whole-sequence runs
    (``whole_runs``) below ``WHOLE_GAIN``; else None. A plan asks twice (its key, then the
    selector), so the last few answers are kept (the table is read, never written).
    Host time (this project's CPU): 1-4 ms for 16-128 sequences of spread lengths up to the
    pairs' bound (1-2 ms without the mixed runs), 0.2-1.2 ms for 128-1024 past one pair a
    multiprocessor (the packing, and its table where it is taken); none at equal lengths."""
    sms = sm_count() if sms is None else sms
    tiles = -(-np.asarray(keys, np.int64) // block_n)
    groups = max(1, row_groups)
    # (more pairs than a wave: whole sequences, packed; not with more row groups than
    # multiprocessors, where even one run's blocks are more than a wave)
    whole = tiles.size * groups > sms and groups <= sms
    if tiles.max(initial=0) <= 1:
        return None
    if tiles.min() == tiles.max():  # (equal lengths: the balanced schedule, 1.02x faster at
        if WHOLE_EQUAL and whole:   # 16 x 128 x 32768 than the cut runs; WHOLE_EQUAL above)
            return _whole_equal(tiles.tobytes(), groups, sms)
        return None
    if not whole and tiles.size * groups > (1.0 if MIXED_RUNS else RUNS_PAIRS_SHARE) * sms:
        return None
    balanced = tuple(balanced or balanced_split(keys, block_n, groups, sms=sms, rows=rows))
    return _runs_split(tiles.tobytes(), groups, sms, rows, balanced,
                       None if pieces is None else np.asarray(pieces, np.int64).tobytes(),
                       whole, MIXED_RUNS)


@functools.lru_cache(maxsize=16)
def _whole_equal(tiles, groups, sms):
    """``runs_split``'s whole runs at equal lengths (``WHOLE_EQUAL``), kept as its answers are."""
    table = whole_runs(np.frombuffer(tiles, np.int64), groups, sms=sms)
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=16)
def _runs_split(tiles, groups, sms, rows, balanced, pieces, whole=False, mixed=False):
    """``runs_split`` past its quick refusals, on hashable arguments (the arrays' bytes);
    ``whole``: the whole-sequence runs (``whole_runs``) are the candidate; ``mixed``
    (``MIXED_RUNS``): the cut runs as the mixed form costs them, and the mixed runs."""
    tiles = np.frombuffer(tiles, np.int64)
    share = WORKSPACE_TILES * _row_share(rows, groups)
    chunk, parts = balanced
    if pieces is not None:
        other = _listed_cost(np.frombuffer(pieces, np.int64), tiles, groups, sms, share,
                             MERGE_TILES if parts == 1 else 0.0)
    else:
        other = _balanced_cost(tiles, chunk, parts, groups, sms, share)
    if whole:  # (the packing's longest run decides before any table is made)
        packed = _whole_pack(tiles, _whole_nruns(tiles.size, groups, sms))
        if packed[2] + BLOCK_OVERHEAD_TILES - WHOLE_ITEM_TILES >= WHOLE_GAIN * other:
            return None
        table = whole_runs(tiles, groups, sms=sms, packed=packed)
        table.flags.writeable = False
        return table
    nruns = max(1, sms // groups)  # (no run is shorter than the work over the runs)
    bound = _runs_bound(tiles, nruns)
    if bound + BLOCK_OVERHEAD_TILES - RUN_ITEM_TILES >= RUNS_GAIN * other:
        return None
    if mixed:
        tables = [mixed_runs(tiles, groups, sms=sms, share=share)]
        if tiles.size * groups <= RUNS_PAIRS_SHARE * sms:
            tables.append(run_schedule(tiles, groups, sms=sms))
        cost, i = min((_mixed_cost(t, tiles, sms, share), i) for i, t in enumerate(tables))
        table = tables[i]
    else:
        table = run_schedule(tiles, groups, sms=sms)
        cost = _runs_cost(table, tiles, sms, share)
    table.flags.writeable = False  # (kept: shared by the plans that ask again)
    return table if cost < RUNS_GAIN * other else None
