"""The simple kernel with warp split-K (``decoding_warp_split_k=True``): the partition kernel.

kernels/simple.py walks a block's keys with all its threads in step, four barriers a tile.
Here each of the block's NW warps takes its own share of the block's keys and runs its own
online softmax over them, synchronising only within the warp; the warps meet once, at the
end, and merge their results in shared memory. Split-K over blocks (``num_partitions``)
stays as it is: warp split-K divides a partition's keys once more, inside the block.

Notation
--------
- Rows, grid and partitions as in simple.py: block (p, g, b) owns sequence b, query rows
  ``[g*BLOCK_M, (g+1)*BLOCK_M)`` and partition p of their key tiles. Tiles are WN keys
  here; a partition's run of tiles ``[t_begin, t_end)`` is cut into NW consecutive runs, and
  warp w walks the w-th (skipping the tiles the mask drops entirely).
- NTHREADS = 32 NW threads; lane = tid % 32, warp = tid // 32. Shared memory, static, fp32
  (38.1 KB):
      Qs [BLOCK_M][ROW]            the block's queries, loaded once (all warps)
      Ks [NW * WN][ROW]            warp w's key tile at rows [w WN, (w+1) WN); after the
                                   loop, Os [BLOCK_M][512] (the merge) over its first 512
      Sp [NW][2][BLOCK_M][WN]      partial scores (two lanes share a score, 288 dims each)
      Ps [NW][BLOCK_M][WN]         a warp's tile of scores (log2 units), then probabilities
      Ms, Ls, As [NW][BLOCK_M]     a warp's running max, running sum, this tile's rescale
- A warp's tile takes simple.py's four phases (copy, S = Q K^T, online softmax,
  O = alpha O + P V) with ``syncwarp`` between them; lane l keeps the output dims
  l + 32 j (j < 16) of every row in registers.

The merge (base-2 units, row i; warp w kept keys K_w):

    m_w = max_{k in K_w} s_k,   l_w = sum_{k in K_w} 2^(s_k - m_w),
    o_w = sum_{k in K_w} 2^(s_k - m_w) v_k                       (each warp's state)
    m   = max_w m_w,            c_w = 2^(m_w - m)                (0 for a warp with K_w empty)
    l   = sum_w c_w l_w,        out = (sum_w c_w o_w) / l,       lse = (m + log2 l) ln 2

which is the softmax over the union of the K_w: every term 2^(s_k - m_w) becomes
2^(s_k - m) once scaled by c_w. A row no warp kept a key for has m = -inf: then c_w = 0,
l = 0, and the row is written as out = 0, lse = -inf. The warps add c_w o_w into Os one
after the other (a barrier between them), then every thread divides its share by l.
"""
import math

from numba import cuda, float32

from .. import ptx
from .._compat import INLINE, JIT_OPTIONS, SIMULATOR
from .common import (D_QK, D_V, LN2, LOG2E, NEG_INF, dot_in_runs, make_log2_score,
                     make_read_pair, make_tile_walk, partition_tiles)

NW = 4  # warps a block
NTHREADS = 32 * NW
BLOCK_M = 8  # query rows a block
WN = 2  # keys a warp's tile
KS_ROWS = NW * WN  # rows of Ks (a compile-time constant for the shared array's shape)
ROW = D_QK + 1  # shared row stride in words (the padding word: see simple.py)
PAIRS = D_QK // 2  # a cache row as pairs of values
KEY_LANES = 32 // WN  # lanes that copy one key (16)
PAIRS_PER_LANE = PAIRS // KEY_LANES  # (18)
HALF_PAIRS = PAIRS_PER_LANE // 2  # (9)
SPLIT = 32 // (BLOCK_M * WN)  # lanes that share one score (2)
PART = D_QK // SPLIT  # dims each of them sums (288)
DIMS_PER_LANE = D_V // 32  # output dims a lane owns, in every row (16)
STATIC_LIMIT = 48 * 1024
JIT = JIT_OPTIONS if SIMULATOR else dict(JIT_OPTIONS, launch_bounds=(NTHREADS, 2))


def smem_bytes(block_m):
    """Dynamic shared memory: none, every shared array is static."""
    return 0


def make_partition_kernel(*, load, store, unpack, locate, mask_apply, mask_classify,
                          mask_key_range, score_mod, fold_scale, block_m, heads, key_count=None,
                          fp8=None):
    """The stage-1 kernel with warp split-K; arguments as simple.make_partition_kernel's
    (FP8 caches too: their codes are dequantized as the tile is copied, as there)."""
    assert block_m == BLOCK_M and KS_ROWS >= BLOCK_M  # Ks doubles as Os [BLOCK_M][512]
    assert SPLIT * BLOCK_M * WN == 32 and PART * SPLIT == D_QK
    assert KEY_LANES * PAIRS_PER_LANE == PAIRS and DIMS_PER_LANE * 32 == D_V
    assert 4 * (ROW * (BLOCK_M + KS_ROWS) + NW * (SPLIT + 1) * BLOCK_M * WN
                + 3 * NW * BLOCK_M) <= STATIC_LIMIT
    H = heads
    key_tiles, next_tile = make_tile_walk(mask_classify, mask_key_range, WN, heads,
                                          key_count=key_count)
    log2_score = make_log2_score(mask_apply, score_mod, fold_scale)

    read_pair = make_read_pair(unpack, fp8)

    @cuda.jit(device=True, **INLINE)
    def copy_tile(Ks, kw0, storage, block_table, b, k0, k1, lane, kv_scale):
        """Keys [k0, k1) of sequence b into rows kw0.. of Ks in fp32, zeros past k1 (P is 0
        there, but 0 * NaN is NaN): KEY_LANES lanes a key, loads before stores half a row at
        a time (a lane's registers hold its 128 accumulators: a whole row staged spills)."""
        n, c0 = lane // KEY_LANES, lane % KEY_LANES
        valid = k0 + n < k1
        page, slot = locate(block_table, storage.shape[1], storage.shape[0], b,
                            k0 + n if valid else k0)
        for half in range(2):  # loads before stores, half a row at a time
            pair = cuda.local.array((HALF_PAIRS, 2), float32)
            for j in range(HALF_PAIRS):
                pair[j, 0] = pair[j, 1] = float32(0.0)
                if valid:
                    pair[j, 0], pair[j, 1] = read_pair(storage, page, slot,
                                                       c0 + KEY_LANES * (half * HALF_PAIRS + j),
                                                       kv_scale)
            for j in range(HALF_PAIRS):
                c = c0 + KEY_LANES * (half * HALF_PAIRS + j)
                Ks[kw0 + n, 2 * c] = pair[j, 0]
                Ks[kw0 + n, 2 * c + 1] = pair[j, 1]

    @cuda.jit(**JIT)
    def partition_kernel(q, q_offsets, storage, block_table, lengths, bias, scale, chunk,
                         part_out, part_lse):
        # Arguments as simple.py's: q [T, H, 576], q_offsets [B+1], storage [pages,
        # page_size, words], part_out [T, H, P, 512], part_lse [T, H, P] f32. FP8 caches:
        # scale + 1j * kv_scale (a real scale's imaginary part is 0, unused).
        kv_scale, scale = float32(scale.imag), float32(scale.real)
        p, nparts, b = cuda.blockIdx.x, cuda.gridDim.x, cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        Qs = cuda.shared.array((BLOCK_M, ROW), float32)
        Ks = cuda.shared.array((KS_ROWS, ROW), float32)
        Sp = cuda.shared.array((NW, SPLIT, BLOCK_M, WN), float32)
        Ps = cuda.shared.array((NW, BLOCK_M, WN), float32)
        Ms = cuda.shared.array((NW, BLOCK_M), float32)
        Ls = cuda.shared.array((NW, BLOCK_M), float32)
        As = cuda.shared.array((NW, BLOCK_M), float32)

        row0 = q_offsets[b]
        nq = q_offsets[b + 1] - row0
        length = lengths[b]
        r0 = cuda.blockIdx.y * BLOCK_M
        nrows = min(BLOCK_M, nq * H - r0)
        if nrows <= 0:
            return  # the whole block leaves: no barrier is skipped

        # -- the block's queries (all warps), each warp's softmax state --
        for c in range(tid, BLOCK_M * D_QK, NTHREADS):
            i, d = c // D_QK, c % D_QK
            Qs[i, d] = load(q[row0 + (r0 + i) // H, (r0 + i) % H, d]) if i < nrows else 0
        if lane < BLOCK_M:
            Ms[warp, lane] = float32(NEG_INF)
            Ls[warp, lane] = float32(0.0)
        acc = cuda.local.array((BLOCK_M, DIMS_PER_LANE), float32)  # o_w: dims lane + 32 j
        for i in range(BLOCK_M):
            for j in range(DIMS_PER_LANE):
                acc[i, j] = float32(0.0)
        cuda.syncthreads()  # Qs complete (the only barrier before the merge)

        s_part, s_i, s_n = lane // (BLOCK_M * WN), lane // WN % BLOCK_M, lane % WN
        my_i, my_h = (r0 + lane) // H, (r0 + lane) % H  # lane < BLOCK_M: softmax row lane
        my_pos = length - nq + my_i
        fold = float32(scale * LOG2E)
        kw0 = warp * WN  # this warp's rows of Ks

        # This partition's tiles [t_begin, t_end), then this warp's share [t, w_end).
        q_lo, q_hi, kstart, kend, ntiles = key_tiles(length, nq, r0, nrows)
        t_begin, t_end = partition_tiles(ntiles, p, nparts, chunk)
        per_warp = (t_end - t_begin + NW - 1) // NW
        w_end = min(t_begin + (warp + 1) * per_warp, t_end)
        t = next_tile(min(t_begin + warp * per_warp, t_end), w_end, kstart, kend, q_lo, q_hi)
        while t < w_end:
            k0 = kstart + t * WN
            k1 = min(k0 + WN, kend)
            cls = mask_classify(k0, k1, q_lo, q_hi)
            ptx.syncwarp(tid)  # the warp is done with its previous tile

            # -- phase 1: this warp's key tile into its rows of Ks --
            copy_tile(Ks, kw0, storage, block_table, b, k0, k1, lane, kv_scale)
            ptx.syncwarp(tid)

            # -- phase 2: partial scores over PART dims --
            d0 = s_part * PART
            Sp[warp, s_part, s_i, s_n] = dot_in_runs(Qs[s_i, d0:d0 + PART],
                                                     Ks[kw0 + s_n, d0:d0 + PART], PART)
            ptx.syncwarp(tid)

            # -- phase 3: online softmax, lane i < BLOCK_M owns row i --
            if lane < BLOCK_M:
                i = lane
                row_max = float32(NEG_INF)
                for n in range(WN):
                    s = float32(NEG_INF)
                    if i < nrows and k0 + n < k1:
                        s = Sp[warp, 0, i, n]
                        for part in range(1, SPLIT):
                            s += Sp[warp, part, i, n]
                        s = log2_score(s, fold, scale, cls, b, my_h, my_i, my_pos, k0 + n,
                                       bias)
                    Ps[warp, i, n] = s
                    row_max = max(row_max, s)
                m_old = Ms[warp, i]
                m_new = max(m_old, row_max)
                m_ref = m_new if m_new != float32(NEG_INF) else float32(0.0)
                row_sum = float32(0.0)
                for n in range(WN):
                    Ps[warp, i, n] = math.exp2(Ps[warp, i, n] - m_ref)
                    row_sum += Ps[warp, i, n]
                As[warp, i] = math.exp2(m_old - m_ref)
                Ls[warp, i] = Ls[warp, i] * As[warp, i] + row_sum
                Ms[warp, i] = m_new
            ptx.syncwarp(tid)

            # -- phase 4: o_w = alpha o_w + P V --
            for i in range(BLOCK_M):
                a = As[warp, i]
                for j in range(DIMS_PER_LANE):
                    acc[i, j] *= a
            for n in range(WN):
                for j in range(DIMS_PER_LANE):
                    v = Ks[kw0 + n, lane + 32 * j]
                    for i in range(BLOCK_M):
                        acc[i, j] += Ps[warp, i, n] * v
            t = next_tile(t + 1, w_end, kstart, kend, q_lo, q_hi)

        # -- the merge: warps add c_w o_w into Os (over Ks) in turn --
        cuda.syncthreads()  # every warp's loop is done (Ks is free; Ms, Ls final)
        for w in range(NW):
            if warp == w:
                for i in range(BLOCK_M):
                    m = Ms[0, i]
                    for u in range(1, NW):
                        m = max(m, Ms[u, i])
                    m_ref = m if m != float32(NEG_INF) else float32(0.0)
                    c = math.exp2(Ms[w, i] - m_ref)  # c_w (0 for a warp that kept no key)
                    for j in range(DIMS_PER_LANE):
                        prev = Ks[i, lane + 32 * j] if w > 0 else float32(0.0)
                        Ks[i, lane + 32 * j] = prev + c * acc[i, j]
            cuda.syncthreads()  # warp w's terms are in before warp w + 1 adds its own

        # -- the block's normalised output and LSE --
        for c in range(tid, BLOCK_M * D_V, NTHREADS):
            i, d = c // D_V, c % D_V
            if i < nrows:
                m = Ms[0, i]
                for u in range(1, NW):
                    m = max(m, Ms[u, i])
                m_ref = m if m != float32(NEG_INF) else float32(0.0)
                l = float32(0.0)
                for u in range(NW):
                    l += Ls[u, i] * math.exp2(Ms[u, i] - m_ref)
                empty = l == 0.0  # no kept key (a NaN score: l = NaN, not empty)
                inv = float32(0.0) if empty else float32(1.0) / l
                t_row, h = row0 + (r0 + i) // H, (r0 + i) % H
                part_out[t_row, h, p, d] = store(Ks[i, d] * inv)
                if d == 0:
                    part_lse[t_row, h, p] = (float32(NEG_INF) if empty
                                             else (m + math.log2(l)) * float32(LN2))

    return partition_kernel
