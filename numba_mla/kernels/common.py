"""What the partition kernels (simt.py, mma.py, seesaw.py, simple.py) share: the score step
(score mod, mask, and the move to log2 units for exp2), the walk over a block's key tiles
(which keys its queries may keep, which tiles the mask drops, and which of them a split-K
partition takes), and the constants of the softmax. The row widths D_QK and D_V are
re-exported from ``numba_mla.constants`` for the kernels."""
import math

from numba import cuda, float32

from .. import ptx
from .._compat import INLINE
from ..constants import D_QK, D_V  # noqa: F401  (576-wide rows; V = the first 512 dims)
from ..mods import EMPTY, PARTIAL

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # log(x) = log2(x) * LN2
NEG_INF = -math.inf  # (a Python float: kernels cast it, float32(NEG_INF), to stay in fp32)
DOT_RUN = 16  # products a run of dot_in_runs


@cuda.jit(device=True, **INLINE)
def dot_in_runs(x, y, n):
    """``sum(x[d] * y[d] for d < n)`` in fp32, for the kernels that sum a score's products
    one by one (simple.py, warpsplit.py): DOT_RUN products into a run's sum, then the runs'
    sums into the total. A float32 sum's rounding error grows with the terms added to one
    total: with 288 products in one chain, fp32 outputs came out up to 3 times less accurate
    than NumPy's float32 run (whose ``q @ K.T`` sums in blocks); in runs, up to 9 times (median
    2) more accurate than the chain on the same data (docs/testing.md, "The simple kernel's
    sums")."""
    s = float32(0.0)
    d = 0
    while d < n:  # (while loops: a range loop here would cost integer work every step)
        run = float32(0.0)
        end = min(d + DOT_RUN, n)
        while d < end:
            run += x[d] * y[d]
            d += 1
        s += run
    return s


def make_log2_score(mask_apply, score_mod, fold_scale):
    """The score step both kernels share, as a device function
    ``log2_score(s, fold, scale, cls, b, h, i, q_pos, k, bias)``: a product ``s`` of q and k
    in, the score in log2 units out (the softmax uses exp2), score mod and mask applied.

    - ``fold_scale`` (a boolean mask and no score mod): the scores need not be seen in natural
      units, so scale and LOG2E come in one multiply, by ``fold`` (1 when the kernel already
      folded them into q);
    - otherwise ``s * scale`` goes through the score mod (computed as the mod likes, kept in
      fp32), then the mask, then to log2 units.

    The mask runs only on tiles it keeps in part (``cls == PARTIAL``): a tile it keeps whole
    needs no per-element work."""

    @cuda.jit(device=True)
    def log2_score(s, fold, scale, cls, b, h, i, q_pos, k, bias):
        if fold_scale:
            s = s * fold
            if cls == PARTIAL:
                s = float32(mask_apply(s, b, h, i, q_pos, k, bias))
            return s
        s = float32(score_mod(s * scale, b, h, q_pos, k))
        if cls == PARTIAL:
            s = float32(mask_apply(s, b, h, i, q_pos, k, bias))
        return s * float32(LOG2E)

    return log2_score


def make_read_pair(unpack, fp8):
    """``read_pair(storage, page, slot, c, kv_scale)``: values 2c and 2c + 1 of a cache row in
    fp32, for the kernels that read rows a pair of values at a time (simple.py,
    warpsplit.py). ``unpack``: a packed 16-bit pair to two floats (None: fp32 storage, two
    adjacent values); ``fp8``: the FP8 layout (docs/fp8.md; rows seen as int32 words, codes
    times their scale: ``kv_scale``, or "v32"'s group scale), or None."""
    if fp8:  # FP8 rows as int32 words: dims 2c, 2c + 1 are half of word c // 2, times a scale
        V32 = fp8 == "v32"

        @cuda.jit(device=True, **INLINE)
        def read_pair(storage, page, slot, c, kv_scale):
            if V32 and c >= D_V // 2:  # "v32" rope: bf16 pairs after 512 codes, 4 scales
                return ptx.bf16x2_to_f32(storage[page, slot, c - D_V // 2 + D_V // 4 + 4])
            sc = kv_scale
            if V32:  # the scale of the row's group of 128 latent dims (words 128..131)
                sc = ptx.i32_as_f32(storage[page, slot, D_V // 4 + c // 64])
            x0, x1, x2, x3 = ptx.e4m3x4_to_f32(storage[page, slot, c // 2])
            if c % 2:
                return x2 * sc, x3 * sc
            return x0 * sc, x1 * sc
    elif unpack is None:  # fp32 storage: a pair is two adjacent values
        @cuda.jit(device=True, **INLINE)
        def read_pair(storage, page, slot, c, kv_scale):
            return storage[page, slot, 2 * c], storage[page, slot, 2 * c + 1]
    else:  # 16-bit storage, seen as int32 words: a pair is one word
        @cuda.jit(device=True, **INLINE)
        def read_pair(storage, page, slot, c, kv_scale):
            return unpack(storage[page, slot, c])
    return read_pair


def make_tile_run(locate):
    """``tile_run(block_table, page_size, npages, b, k0, k1)`` -> ``(page, slot, run)``: where
    key k0 of sequence b lies, and whether keys [k0, k1) lie in consecutive slots of that one
    page (then key k0 + n is at slot + n, and a tile's copy needs no lookup a row). One
    lookup: the run holds exactly when the last key's slot, ``slot + (k1 - 1 - k0)``, is still
    below ``page_size``. For a paged cache the last key is then in the same table entry (the
    same page after the same clamps) at that slot, and past it in another entry at a slot
    that differs from it; a contiguous cache's ``page_size`` is its capacity and a ragged
    one's its row count, where ``locate`` clamps the slot to ``page_size - 1``: below it the
    slots step by one, at it they stop. So the rows found this way are the rows ``locate``
    finds one by one (tests/test_kernels.py checks the three kinds against looking up both
    ends)."""

    @cuda.jit(device=True, **INLINE)
    def tile_run(block_table, page_size, npages, b, k0, k1):
        page, slot = locate(block_table, page_size, npages, b, k0)
        return page, slot, slot + (k1 - 1 - k0) < page_size

    return tile_run


def make_tile_walk(mask_classify, mask_key_range, block_n, heads, align=1, key_count=None):
    """Device functions over key tiles of ``block_n`` keys:

    - ``key_tiles(length, nq, r0, nrows)``: for a block owning query rows [r0, r0 + nrows) of a
      sequence of ``length`` keys and ``nq`` query tokens: the query positions it spans
      (``q_lo``, ``q_hi``), the key range its mask may keep, cut to the sequence (``kstart``,
      ``kend``; kstart rounded down to a multiple of ``align``: the keys added are ones the
      mask drops), and the tiles that range holds;
    - ``next_tile(t, t_end, kstart, kend, q_lo, q_hi)``: the first tile at or after t that the
      mask does not drop entirely (or t_end).

    ``key_count(length)``, given for a shard of each sequence (positions.py): the keys the
    cache holds of a sequence of ``length`` global keys. The mask functions then take local key
    indices, ``length`` stays global (so do the query positions) and tiles end at
    ``key_count(length)``."""
    H = heads
    if key_count is None:  # a whole sequence: its keys are its length (inlined: no cost)

        @cuda.jit(device=True)
        def key_count(length):
            return length

    @cuda.jit(device=True)
    def key_tiles(length, nq, r0, nrows):
        # Query positions of the block's rows: i in [i_lo, i_hi], q_pos = length - nq + i.
        q_lo = length - nq + r0 // H
        q_hi = length - nq + (r0 + nrows - 1) // H
        kstart, kend = mask_key_range(q_lo, q_hi)
        kstart = max(kstart, 0)
        kend = min(kend, key_count(length))
        if align > 1 and kend > kstart:
            kstart -= kstart % align
        ntiles = (kend - kstart + block_n - 1) // block_n if kend > kstart else 0
        return q_lo, q_hi, kstart, kend, ntiles

    @cuda.jit(device=True)
    def next_tile(t, t_end, kstart, kend, q_lo, q_hi):
        while t < t_end:
            k0 = kstart + t * block_n
            if mask_classify(k0, min(k0 + block_n, kend), q_lo, q_hi) != EMPTY:
                break
            t += 1
        return t

    return key_tiles, next_tile


def make_partition_walk(key_tiles, next_tile):
    """``first_tiles(length, nq, r0, nrows, p, nparts, chunk)``: where a block of split-K
    partition ``p`` starts (``make_tile_walk``'s functions, then ``partition_tiles``): the
    query positions and key range of its rows (``q_lo, q_hi, kstart, kend``), its first tile
    the mask keeps (``t``; ``t_end`` when there is none) and the end of its run (``t_end``)."""

    @cuda.jit(device=True)
    def first_tiles(length, nq, r0, nrows, p, nparts, chunk):
        q_lo, q_hi, kstart, kend, ntiles = key_tiles(length, nq, r0, nrows)
        t, t_end = partition_tiles(ntiles, p, nparts, chunk)
        return q_lo, q_hi, kstart, kend, next_tile(t, t_end, kstart, kend, q_lo, q_hi), t_end

    return first_tiles


@cuda.jit(device=True)
def partition_tiles(ntiles, p, nparts, chunk):
    """The tiles ``[t0, t1)`` of a row block's ``ntiles`` that split-K partition ``p`` of
    ``nparts`` walks: consecutive runs of ``per_part`` tiles from the first, with ``per_part``
    the larger of

    - ``chunk``, the same for every sequence of a launch (heuristics.balanced_split): a short
      sequence then fills its first few partitions and finds the rest empty, so the work of a
      block is about the same whatever its sequence's length;
    - ``ceil(ntiles / nparts)``, the even split: what ``chunk = 0`` gives (an explicit
      num_partitions), and what still covers every tile when a sequence holds more than
      ``nparts * chunk`` (lengths changed on the device after the chunk was chosen).

    The runs of the partitions are disjoint and together cover ``[0, ntiles)``: each tile is
    walked exactly once."""
    even = ptx.divmod_u32(ntiles + nparts - 1, nparts)[0]
    per_part = max(chunk, even)
    t0 = min(p * per_part, ntiles)
    return t0, min(t0 + per_part, ntiles)


@cuda.jit(device=True)
def prefetch_first_entry(block_table, b, p, chunk, block_n, page_size):
    """(One thread, at a block's entry) Start bringing into L2 the page-table entry of split-K
    partition ``p``'s first tile, guessed before the sequence's length is loaded: its tile
    ``p * chunk`` of ``block_n`` keys from key 0 (``partition_tiles``), right for masks that
    keep the first keys; a wrong guess costs a line. Nothing without a ``chunk``; the indices
    are clamped to the table (a contiguous cache's is a placeholder). A block starts on a
    chain of dependent loads (the sequence's offsets and length, this entry, the tile's
    rows), each a trip to memory: this takes the entry's off it."""
    if chunk > 0 and block_table.shape[0] > 0 and block_table.shape[1] > 0:
        entry = ptx.divmod_u32(p * chunk * block_n, page_size)[0]
        ptx.prefetch_l2(block_table, min(b, block_table.shape[0] - 1),
                        min(entry, block_table.shape[1] - 1))


@cuda.jit(device=True)
def mark_empty(part_lse, row0, r0, nrows, p, heads, tid, nthreads):
    """Partition ``p`` keeps no key of the block's rows ``[r0, r0 + nrows)`` (of the sequence
    whose first q row is ``row0``): LSE -inf for each, and nothing else. The combine gives
    such a partition weight 0 and never uses its output (the one-step combine reads it and
    ignores it), so the block can leave at once."""
    for m in range(tid, nrows, nthreads):
        r = r0 + m
        part_lse[row0 + r // heads, r % heads, p] = float32(NEG_INF)
