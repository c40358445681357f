"""Split-K MLA decode written to be read first (``backend="simple"``): the partition kernel.

Step through it in the simulator (``NUMBA_ENABLE_CUDASIM=1``, a ``print`` or ``breakpoint()``
guarded by block and thread): docs/tutorial.md, "Your first kernel", shows how.

Notation
--------
- A query *row* is one (query token i, head h) pair of a sequence, r = i * H + h: a sequence
  with n query tokens has n * H rows.
- Grid ``(P, G, B)``: block (p, g, b) owns sequence b, rows ``[g*block_m, (g+1)*block_m)``
  and partition p of their keys: the keys the mask may keep for those rows are cut into tiles
  of BLOCK_N keys, and partition p walks the p-th of P runs of consecutive tiles, skipping
  the tiles the mask drops entirely.
- NTHREADS threads. Shared memory, static, fp32 (37.8 KB at block_m = 8):
      Qs [block_m][ROW]             the block's queries, loaded once
      Ks [BLOCK_N][ROW]             the current key tile; its first 512 dims are V
      Sp [SPLIT][block_m][BLOCK_N]  partial scores: SPLIT threads share a (row, key) score
      Ps [block_m][BLOCK_N]         the tile's scores in log2 units, then probabilities
      Ms, Ls, As [block_m]          running max (log2 units), running sum, this tile's rescale
- A tile takes four phases with a barrier between them: copy the keys, scores S = Q K^T,
  online softmax, O = alpha O + P V (the output in registers, fp32, across the tiles).
- Softmax in base 2: exp(x) = exp2(x * LOG2E), so scores are kept in log2 units.

Output: the partition's normalised ``part_out[t, h, p, :512]`` (fp32) and natural-log LSE
``part_lse[t, h, p]`` (-inf when it kept no key), merged by the combine kernel; with one
partition, ``out`` and ``lse`` themselves (``store`` converting to the storage dtype).

Traffic: a block reads its partition's keys and its queries once. Each score FMA reads two
values from shared memory, which bounds the speed; kernels/simt.py keeps tiles of scores and
outputs in registers instead, reusing every value it loads.
"""
import math

from numba import cuda, float32

from .._compat import INLINE, JIT_OPTIONS, SIMULATOR
from .common import (D_QK, D_V, LN2, LOG2E, NEG_INF, dot_in_runs, make_log2_score,
                     make_partition_walk, make_read_pair, make_tile_walk, mark_empty)

NTHREADS = 128  # 4 warps
BLOCK_M = 8  # query rows a block (the launcher's choice; Qs and Ks must fit in 48 KB)
BLOCK_N = 8  # keys a tile
ROW = D_QK + 1  # padded row: row (or key) n, dim d in bank (n + d) % 32, no bank conflicts
PAIRS = D_QK // 2  # a cache row as pairs of values (16-bit rows: one int32 word a pair)
KEY_THREADS = NTHREADS // BLOCK_N  # threads that copy one key (16)
PAIRS_PER_THREAD = PAIRS // KEY_THREADS  # (18)
DIMS_PER_THREAD = D_V // NTHREADS  # output dims a thread owns, in every row (4)
STATIC_LIMIT = 48 * 1024  # bytes of static shared memory a block may declare
# 2 blocks a multiprocessor, up to 255 registers (at 3, 168: combined masks and FP8 spill)
JIT = JIT_OPTIONS if SIMULATOR else dict(JIT_OPTIONS, launch_bounds=(NTHREADS, 2))


def smem_bytes(block_m):
    return 0  # dynamic shared memory: none, every shared array is static


def make_partition_kernel(*, load, store, unpack, locate, mask_apply, mask_classify,
                          mask_key_range, score_mod, fold_scale, block_m, heads, fp8=None,
                          key_count=None):
    """The kernel for one configuration; every argument is a compile-time constant (factory.py):
    ``load`` q element -> fp32, ``unpack`` a cache word of two 16-bit values -> two floats
    (None: fp32), ``store`` fp32 -> ``part_out``, ``fp8`` the FP8 layout (docs/fp8.md) or None."""
    SPLIT = NTHREADS // (block_m * BLOCK_N)  # threads that share one score
    PART = D_QK // SPLIT  # dims each of them sums
    assert SPLIT * block_m * BLOCK_N == NTHREADS and PART * SPLIT == D_QK
    assert 4 * (ROW * (block_m + BLOCK_N) + (SPLIT + 1) * block_m * BLOCK_N
                + 3 * block_m) <= STATIC_LIMIT
    assert KEY_THREADS * PAIRS_PER_THREAD == PAIRS and DIMS_PER_THREAD * NTHREADS == D_V
    H = heads
    key_tiles, next_tile = make_tile_walk(mask_classify, mask_key_range, BLOCK_N, heads,
                                          key_count=key_count)
    first_tiles = make_partition_walk(key_tiles, next_tile)
    log2_score = make_log2_score(mask_apply, score_mod, fold_scale)

    read_pair = make_read_pair(unpack, fp8)

    @cuda.jit(device=True, **INLINE)
    def copy_tile(Ks, storage, block_table, b, k0, k1, tid, kv_scale):
        """Keys [k0, k1) of sequence b into Ks in fp32, zeros past k1 (P is 0 there, but 0 * NaN
        is NaN). KEY_THREADS threads a key, a warp reading adjacent words; a thread's loads all
        go out before its first store, so their latencies overlap."""
        n, c0 = tid // KEY_THREADS, tid % KEY_THREADS
        pair = cuda.local.array((PAIRS_PER_THREAD, 2), float32)
        for j in range(PAIRS_PER_THREAD):
            pair[j, 0] = pair[j, 1] = float32(0.0)
        if k0 + n < k1:
            page, slot = locate(block_table, storage.shape[1], storage.shape[0], b, k0 + n)
            for j in range(PAIRS_PER_THREAD):
                pair[j, 0], pair[j, 1] = read_pair(storage, page, slot, c0 + KEY_THREADS * j,
                                                   kv_scale)
        for j in range(PAIRS_PER_THREAD):
            c = c0 + KEY_THREADS * j
            Ks[n, 2 * c] = pair[j, 0]
            Ks[n, 2 * c + 1] = pair[j, 1]

    @cuda.jit(**JIT)
    def partition_kernel(q, q_offsets, storage, block_table, lengths, bias, scale, chunk,
                         part_out, part_lse):
        # q [T, H, 576], q_offsets [B+1], storage [pages, page_size, words], chunk: tiles a
        # partition (common.partition_tiles), part_out [T, H, P, 512], part_lse [T, H, P];
        # FP8 caches: scale + 1j * kv_scale (a real scale's imaginary part is 0, unused).
        kv_scale, sm_scale = float32(scale.imag), float32(scale.real)
        p, nparts, b = cuda.blockIdx.x, cuda.gridDim.x, cuda.blockIdx.z
        tid = cuda.threadIdx.x
        Qs = cuda.shared.array((block_m, ROW), float32)
        Ks = cuda.shared.array((BLOCK_N, ROW), float32)
        Sp = cuda.shared.array((SPLIT, block_m, BLOCK_N), float32)
        Ps = cuda.shared.array((block_m, BLOCK_N), float32)
        Ms = cuda.shared.array(block_m, float32)
        Ls = cuda.shared.array(block_m, float32)
        As = cuda.shared.array(block_m, float32)

        row0 = q_offsets[b]  # first q row of sequence b
        nq = q_offsets[b + 1] - row0  # its query tokens
        length = lengths[b]
        r0 = cuda.blockIdx.y * block_m  # first row of this block
        nrows = min(block_m, nq * H - r0)  # rows this block owns (the same in every thread)
        if nrows <= 0:
            return  # every thread of the block leaves: no barrier is skipped

        # This partition's tiles: [t, t_end), t the first the mask keeps (key_tiles, then
        # partition_tiles, then next_tile: common.make_partition_walk).
        q_lo, q_hi, kstart, kend, t, t_end = first_tiles(length, nq, r0, nrows, p, nparts,
                                                            chunk)
        if t >= t_end and nparts > 1:  # (one partition writes out itself: zeros, below)
            mark_empty(part_lse, row0, r0, nrows, p, H, tid, NTHREADS)
            return  # the same in every thread, as above

        # -- the block's queries into Qs (zeros for rows past nrows), the softmax state --
        for c in range(tid, block_m * D_QK, NTHREADS):
            i, d = c // D_QK, c % D_QK
            Qs[i, d] = load(q[row0 + (r0 + i) // H, (r0 + i) % H, d]) if i < nrows else 0
        if tid < block_m:
            Ms[tid] = float32(NEG_INF)
            Ls[tid] = float32(0.0)
        acc = cuda.local.array((block_m, DIMS_PER_THREAD), float32)  # O: dims tid + 128 j
        for i in range(block_m):
            for j in range(DIMS_PER_THREAD):
                acc[i, j] = float32(0.0)

        # This thread's score: row s_i, key s_n, dims part s_part; its softmax row (tid <
        # block_m): query token my_i at position my_pos, head my_h.
        s_part, s_i, s_n = tid // (block_m * BLOCK_N), tid // BLOCK_N % block_m, tid % BLOCK_N
        my_i, my_h = (r0 + tid) // H, (r0 + tid) % H
        my_pos = length - nq + my_i
        fold = float32(sm_scale * LOG2E)  # (used where the scale folds into LOG2E: common.py)

        while t < t_end:
            k0 = kstart + t * BLOCK_N
            k1 = min(k0 + BLOCK_N, kend)
            cls = mask_classify(k0, k1, q_lo, q_hi)  # FULL: the tile needs no mask work
            # Wait until every thread is done with the previous tile (P V reads Ks and Ps).
            cuda.syncthreads()

            # -- phase 1: copy the key tile into Ks --
            copy_tile(Ks, storage, block_table, b, k0, k1, tid, kv_scale)
            # Wait for the whole tile (on the first tile, for Qs and Ms, Ls too).
            cuda.syncthreads()

            # -- phase 2: partial scores: q_(s_i) . k_(s_n) over this thread's PART dims --
            d0 = s_part * PART
            # (summed in runs of 16 products, then the runs: more accurate than one chain)
            Sp[s_part, s_i, s_n] = dot_in_runs(Qs[s_i, d0:d0 + PART], Ks[s_n, d0:d0 + PART],
                                               PART)
            # Wait for every partial score.
            cuda.syncthreads()

            # -- phase 3: online softmax, thread i < block_m owns row i --
            if tid < block_m:
                i = tid
                row_max = float32(NEG_INF)
                for n in range(BLOCK_N):
                    s = float32(NEG_INF)
                    if i < nrows and k0 + n < k1:
                        s = Sp[0, i, n]
                        for part in range(1, SPLIT):
                            s += Sp[part, i, n]
                        # ---- apply score mod and mask (compiled in), to log2 units ----
                        s = log2_score(s, fold, sm_scale, cls, b, my_h, my_i, my_pos, k0 + n,
                                       bias)
                    Ps[i, n] = s
                    row_max = max(row_max, s)
                m_old = Ms[i]
                m_new = max(m_old, row_max)
                # A row with no kept key so far keeps m = -inf; exp2 then sees -inf - 0.
                m_ref = m_new if m_new != float32(NEG_INF) else float32(0.0)
                row_sum = float32(0.0)
                for n in range(BLOCK_N):
                    Ps[i, n] = math.exp2(Ps[i, n] - m_ref)
                    row_sum += Ps[i, n]
                As[i] = math.exp2(m_old - m_ref)
                Ls[i] = Ls[i] * As[i] + row_sum
                Ms[i] = m_new
            # Wait for the probabilities and the rescale factors.
            cuda.syncthreads()

            # -- phase 4: O = alpha O + P V, V = the tile's first 512 dims --
            v = cuda.local.array(DIMS_PER_THREAD, float32)
            for i in range(block_m):
                for j in range(DIMS_PER_THREAD):
                    acc[i, j] *= As[i]
            for n in range(BLOCK_N):
                for j in range(DIMS_PER_THREAD):
                    v[j] = Ks[n, tid + NTHREADS * j]  # adjacent threads, adjacent dims
                for i in range(block_m):
                    for j in range(DIMS_PER_THREAD):
                        acc[i, j] += Ps[i, n] * v[j]  # (Ps[i, n]: one address, a broadcast)
            t = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi)

        # -- the partition's normalised output and LSE, from registers --
        # Wait for the softmax state (when the partition kept no tile: its initial values).
        cuda.syncthreads()
        for i in range(block_m):
            if i < nrows:
                t_row, h = row0 + (r0 + i) // H, (r0 + i) % H
                l = Ls[i]
                empty = l == 0.0  # no kept key (a NaN score gives l = NaN: not empty, NaN out)
                inv = float32(0.0) if empty else float32(1.0) / l
                for j in range(DIMS_PER_THREAD):
                    part_out[t_row, h, p, tid + NTHREADS * j] = store(acc[i, j] * inv)
                if tid == i:
                    part_lse[t_row, h, p] = (float32(NEG_INF) if empty
                                             else (Ms[i] + math.log2(l)) * float32(LN2))

    return partition_kernel
