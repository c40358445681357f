"""Tensor cores without wgmma (``backend="mma_sync"``, sm_80 and later): the partition kernel.

Ampere and Ada GPUs (A100, L40S, RTX 30xx/40xx) have warp-level ``mma.sync`` but not Hopper's
wgmma, TMA or mbarriers. This kernel uses only sm_80 instructions: ``mma.sync`` m16n8k16
(16-bit inputs, fp32 accumulators) and ``ldmatrix`` (ptx/mma_sync.py, fragments there).

First version: correctness and structure first. The tiles are copied by plain loads (no
cp.async pipeline yet) and a tile is 16 keys: docs/kernels/mma_sync.md says what that costs
and the next steps.

Notation
--------
- Rows, grid and partitions as in simple.py: block (p, g, b) owns sequence b, query rows
  ``[g*block_m, (g+1)*block_m)`` (r = i * H + h) and partition p of their key tiles
  (common.partition_tiles), skipping the tiles the mask drops entirely. ``block_m`` is 16
  (one m16 tile of rows; the code is written for several, see docs/kernels/mma_sync.md).
- 4 warps an m16 tile: warp w takes the tile mt = w // 4 of rows and the quarter wq = w % 4
  of the dims; lane l = 4 gr + tq (gr = l // 4, tq = l % 4), as in the fragment tables.
- Shared memory, dynamic (``layout``), as int32 words of two 16-bit values unless said
  (42.6 KB at 16 rows):
      Qs [block_m][ROWW]          the block's queries (row r: 288 words + 4 padding)
      Ks [BLOCK_N][ROWW]          the key tile; its first 256 words (512 dims) are V
      Sp [4][block_m][BLOCK_N]    fp32: quarter wq's partial scores over its 144 dims
      Ps [block_m][PROWW]         the tile's probabilities, 16-bit (8 words + 4 padding)
      Ms, Ls, As [block_m]        fp32: running max (log2 units), running sum, rescale
  A row of Qs and Ks is 1168 bytes, of Ps 48: odd multiples of 16 bytes, so the 8 rows an
  ``ldmatrix`` reads fall in 8 different groups of 4 banks (no bank conflict).
- A tile, four phases with a barrier between them:
  1. copy: the tile's 16 keys into Ks (zeros past the last key);
  2. S = Q K^T: warp (mt, wq) takes rows [16 mt, 16 mt + 16) and dims [144 wq, 144 wq + 144),
     9 steps of 16, two m16n8k16 a step (keys 0-7 and 8-15), and leaves its partial in Sp;
  3. online softmax (as simple.py; thread i < block_m owns row i): the 4 partials summed, the
     mask and score mod applied, P = 2^(s - m) rounded to the 16-bit type into Ps;
  4. O = alpha O + P V: warp (mt, wq) owns rows [16 mt, 16 mt + 16) and output dims
     [128 wq, 128 wq + 128), 16 n8 tiles, 64 fp32 accumulators a lane; A = P (ldmatrix from
     Ps), B = V (ldmatrix .trans from Ks: V is stored keys x dims, the B fragment wants pairs
     along the keys).
- Accumulator element k of n8 tile j (acc[4j + k]) is O[16 mt + gr + 8 (k // 2),
  128 wq + 8 j + 2 tq + k % 2].

Output: the partition's normalised ``part_out[t, h, p, :512]`` and natural-log LSE
``part_lse[t, h, p]`` (-inf when it kept no key), merged by the combine kernel; with one
partition, ``out`` and ``lse`` themselves.
"""
import math

from numba import cuda, float32, int32

from .. import ptx
from .._compat import INLINE, JIT_OPTIONS, SIMULATOR
from .common import (D_QK, D_V, LN2, LOG2E, NEG_INF, make_log2_score, make_tile_walk, mark_empty,
                     partition_tiles)

BLOCK_MS = (16,)  # query rows a block: one m16 tile (64 rows: docs/kernels/mma_sync.md)
BLOCK_N = 16  # keys a tile: two n8 tiles of S, one k16 step of P V
WORDS = D_QK // 2  # a row as int32 words of two 16-bit values (288)
ROWW = WORDS + 4  # words a row of Qs / Ks (1168 bytes)
ROW_BYTES = 4 * ROWW
PROWW = BLOCK_N // 2 + 4  # words a row of Ps (48 bytes)
P_ROW_BYTES = 4 * PROWW


WQ = 4  # warps an m16 tile of rows: each takes a quarter of the dims of S and of O


def threads(block_m):
    return 32 * WQ * (block_m // 16)


def layout(block_m):
    """Word offsets of Qs, Ks, Sp, Ps, Ms, Ls, As in dynamic shared memory, and its size in
    words (every offset a multiple of 4 words: 16-byte aligned for ldmatrix)."""
    sizes = (block_m * ROWW, BLOCK_N * ROWW, WQ * block_m * BLOCK_N, block_m * PROWW,
             block_m, block_m, block_m)
    offs, at = [], 0
    for n in sizes:
        offs.append(at)
        at += -(-n // 4) * 4
    return tuple(offs), at


def smem_bytes(block_m):
    return 4 * layout(block_m)[1]


def _make_pv(tag, o_dims):
    """``pv(acc, Ks, kaddr, a0, a1, a2, a3, tid)``: acc += P . V over one 16-key step for the
    warp's 16 n8 tiles; ``kaddr`` is this lane's ldmatrix address for the first pair of tiles
    (each pair is 16 dims = 32 bytes further). Written out: ``mma`` takes its accumulator
    offset as a compile-time constant, so that the accumulators stay in registers."""
    lines = ["def pv(acc, Ks, kaddr, a0, a1, a2, a3, tid):"]
    for pair in range(o_dims // 16):
        lines += [f"    m0, m1, m2, m3 = ldsm_t(Ks, kaddr + {32 * pair}, tid)",
                  f"    mma(acc, {8 * pair}, a0, a1, a2, a3, m0, m1, tid)",
                  f"    mma(acc, {8 * pair + 4}, a0, a1, a2, a3, m2, m3, tid)"]
    scope = {"ldsm_t": ptx.ldmatrix_x4_trans, "mma": ptx.mma_m16n8k16(tag)}
    exec("\n".join(lines), scope)  # (generated here, from the lines above: no outside input)
    return cuda.jit(device=True, **INLINE)(scope["pv"])


def make_partition_kernel(*, tag, to16, store, locate, mask_apply, mask_classify,
                          mask_key_range, score_mod, fold_scale, block_m, heads, key_count=None):
    """The kernel for one configuration (factory.py): ``tag`` "bf16" or "f16", ``to16`` fp32
    -> the 16-bit type (P for the tensor cores), ``store`` fp32 -> ``part_out``, ``block_m``
    16 or 64 query rows a block."""
    assert block_m in BLOCK_MS
    S_DIMS, O_DIMS = D_QK // WQ, D_V // WQ  # dims of S a warp sums (144), of O it owns (128)
    NACC = O_DIMS // 8 * 4  # accumulators a lane (64)
    assert S_DIMS % 16 == 0 and O_DIMS % 16 == 0
    NTHREADS = threads(block_m)
    KEY_THREADS = NTHREADS // BLOCK_N  # threads that copy one key (8 or 32)
    WORDS_PER_THREAD = WORDS // KEY_THREADS  # (36 or 9)
    # words of a key row a thread loads before storing them (the accumulators stay live
    # across the copy: a whole row staged would spill)
    STAGE = 9
    assert KEY_THREADS * WORDS_PER_THREAD == WORDS and WORDS_PER_THREAD % STAGE == 0
    (Q_OFF, K_OFF, S_OFF, P_OFF, M_OFF, L_OFF, A_OFF), _ = layout(block_m)
    # two blocks a multiprocessor at least (up to 255 registers; 168 used)
    jit = JIT_OPTIONS if SIMULATOR else dict(JIT_OPTIONS, launch_bounds=(NTHREADS, 2))
    H = heads
    key_tiles, next_tile = make_tile_walk(mask_classify, mask_key_range, BLOCK_N, heads,
                                          key_count=key_count)
    log2_score = make_log2_score(mask_apply, score_mod, fold_scale)
    mma = ptx.mma_m16n8k16(tag)
    pv = _make_pv(tag, O_DIMS)
    scale_acc = ptx.acc_scale(NACC)

    @cuda.jit(device=True, **INLINE)
    def copy_tile(words, storage, block_table, b, k0, k1, tid):
        """Keys [k0, k1) of sequence b into Ks as words, zeros past k1 (P is 0 there, but
        0 * NaN is NaN): KEY_THREADS threads a key, loads before stores, STAGE words at a
        time."""
        n, c0 = tid // KEY_THREADS, tid % KEY_THREADS
        valid = k0 + n < k1
        page, slot = locate(block_table, storage.shape[1], storage.shape[0], b,
                            k0 + n if valid else k0)
        for part in range(WORDS_PER_THREAD // STAGE):
            w = cuda.local.array(STAGE, int32)
            for j in range(STAGE):
                w[j] = 0
                if valid:
                    w[j] = storage[page, slot, c0 + KEY_THREADS * (part * STAGE + j)]
            for j in range(STAGE):
                words[K_OFF + n * ROWW + c0 + KEY_THREADS * (part * STAGE + j)] = w[j]

    @cuda.jit(**jit)
    def partition_kernel(q, q_offsets, storage, block_table, lengths, bias, scale, chunk,
                         part_out, part_lse):
        # q [T, H, 288] and storage [pages, page_size, 288]: int32 words of 16-bit pairs;
        # q_offsets [B+1], chunk: tiles a partition, part_out [T, H, P, 512], part_lse [T, H, P].
        p, nparts, b = cuda.blockIdx.x, cuda.gridDim.x, cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        mt, wq = warp // WQ, warp % WQ  # this warp's m16 tile of rows, and share of the dims
        # Dynamic shared memory (layout()), its buffers at word offsets (no views: a view's
        # shape and strides would take registers): Qs[i] is words[Q_OFF + i], Sp[i] is
        # floats[S_OFF + i], and so on.
        words = cuda.shared.array(0, int32)
        floats = cuda.shared.array(0, float32)  # the same memory, seen as fp32
        base = ptx.smem_addr(words)

        row0 = q_offsets[b]
        nq = q_offsets[b + 1] - row0
        length = lengths[b]
        r0 = cuda.blockIdx.y * block_m
        nrows = min(block_m, nq * H - r0)
        if nrows <= 0:
            return  # the whole block leaves: no barrier is skipped

        q_lo, q_hi, kstart, kend, ntiles = key_tiles(length, nq, r0, nrows)
        t, t_end = partition_tiles(ntiles, p, nparts, chunk)
        t = next_tile(t, t_end, kstart, kend, q_lo, q_hi)
        if t >= t_end and nparts > 1:  # (one partition writes out itself: zeros, below)
            mark_empty(part_lse, row0, r0, nrows, p, H, tid, NTHREADS)
            return  # uniform in the block, before any barrier

        # -- the block's queries into Qs (zeros past nrows), the softmax state --
        for c in range(tid, block_m * WORDS, NTHREADS):
            i, d = c // WORDS, c % WORDS
            words[Q_OFF + i * ROWW + d] = (q[row0 + (r0 + i) // H, (r0 + i) % H, d]
                                           if i < nrows else 0)
        if tid < block_m:
            floats[M_OFF + tid] = float32(NEG_INF)
            floats[L_OFF + tid] = float32(0.0)
        acc = cuda.local.array(NACC, float32)  # O: 16 rows x this warp's O_DIMS dims
        for k in range(NACC):
            acc[k] = float32(0.0)
        s_acc = cuda.local.array(8, float32)  # S: keys 0-7 at 0, keys 8-15 at 4

        gr, tq = lane // 4, lane % 4
        m0 = 16 * mt  # the warp's first row
        my_i, my_h = (r0 + tid) // H, (r0 + tid) % H  # tid < block_m: softmax row tid
        my_pos = length - nq + my_i
        sm_scale = float32(scale)
        fold = float32(sm_scale * LOG2E)
        # This lane's ldmatrix addresses (bytes). A fragments (Q, P): row l % 8 + 8 (l // 8 % 2),
        # 16-bit column 8 (l // 16) of the step. B of S (K, not transposed): key l % 8 +
        # 8 (l // 16), column 8 (l // 8 % 2). B of P V (V, .trans): key l % 8 + 8 (l // 8 % 2),
        # column 8 (l // 16).
        a_row, a_col = m0 + lane % 8 + 8 * (lane // 8 % 2), 8 * (lane // 16)
        q_addr = base + 4 * Q_OFF + a_row * ROW_BYTES + 2 * (a_col + S_DIMS * wq)
        p_addr = base + 4 * P_OFF + a_row * P_ROW_BYTES + 2 * a_col
        k_addr = (base + 4 * K_OFF + (lane % 8 + 8 * (lane // 16)) * ROW_BYTES
                  + 2 * (8 * (lane // 8 % 2) + S_DIMS * wq))
        v_addr = (base + 4 * K_OFF + (lane % 8 + 8 * (lane // 8 % 2)) * ROW_BYTES
                  + 2 * (a_col + O_DIMS * wq))

        while t < t_end:
            k0 = kstart + t * BLOCK_N
            k1 = min(k0 + BLOCK_N, kend)
            cls = mask_classify(k0, k1, q_lo, q_hi)
            cuda.syncthreads()  # every warp is done with the previous tile (Ks, Ps)

            # -- phase 1: the key tile into Ks --
            copy_tile(words, storage, block_table, b, k0, k1, tid)
            cuda.syncthreads()  # the whole tile (on the first, Qs and Ms, Ls too)

            # -- phase 2: partial S of the warp's 16 rows over its 144 dims --
            for k in range(8):
                s_acc[k] = float32(0.0)
            for step in range(S_DIMS // 16):
                a0, a1, a2, a3 = ptx.ldmatrix_x4(words, q_addr + 32 * step, tid)
                b0, b1, b2, b3 = ptx.ldmatrix_x4(words, k_addr + 32 * step, tid)
                mma(s_acc, 0, a0, a1, a2, a3, b0, b1, tid)  # keys 0-7
                mma(s_acc, 4, a0, a1, a2, a3, b2, b3, tid)  # keys 8-15
            for k in range(8):
                row = m0 + gr + 8 * (k % 4 // 2)
                floats[S_OFF + (wq * block_m + row) * BLOCK_N + 8 * (k // 4) + 2 * tq
                       + k % 2] = s_acc[k]
            cuda.syncthreads()

            # -- phase 3: online softmax, thread i < block_m owns row i --
            if tid < block_m:
                i = tid
                row_max = float32(NEG_INF)
                for n in range(BLOCK_N):
                    s = float32(NEG_INF)
                    if i < nrows and k0 + n < k1:
                        s = float32(0.0)
                        for part in range(WQ):
                            s += floats[S_OFF + (part * block_m + i) * BLOCK_N + n]
                        s = log2_score(s, fold, sm_scale, cls, b, my_h, my_i, my_pos, k0 + n,
                                       bias)
                    floats[S_OFF + i * BLOCK_N + n] = s  # (part 0's place: read just above)
                    row_max = max(row_max, s)
                m_old = floats[M_OFF + i]
                m_new = max(m_old, row_max)
                m_ref = m_new if m_new != float32(NEG_INF) else float32(0.0)
                row_sum = float32(0.0)
                for n in range(0, BLOCK_N, 2):
                    x0 = math.exp2(floats[S_OFF + i * BLOCK_N + n] - m_ref)
                    x1 = math.exp2(floats[S_OFF + i * BLOCK_N + n + 1] - m_ref)
                    row_sum += x0 + x1
                    words[P_OFF + i * PROWW + n // 2] = ((int32(to16(x0)) & 0xFFFF)
                                                         | (int32(to16(x1)) << 16))
                alpha = math.exp2(m_old - m_ref)
                floats[A_OFF + i] = alpha
                floats[L_OFF + i] = floats[L_OFF + i] * alpha + row_sum
                floats[M_OFF + i] = m_new
            cuda.syncthreads()

            # -- phase 4: O = alpha O + P V on the warp's 16 rows and 128 dims --
            scale_acc(acc, floats[A_OFF + m0 + gr], floats[A_OFF + m0 + gr + 8])
            a0, a1, a2, a3 = ptx.ldmatrix_x4(words, p_addr, tid)
            pv(acc, words, v_addr, a0, a1, a2, a3, tid)
            t = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi)

        # -- the partition's normalised output and LSE --
        cuda.syncthreads()  # the softmax state (initial values when no tile was kept)
        for half in range(2):
            i = m0 + gr + 8 * half
            if i < nrows:
                t_row, h = row0 + (r0 + i) // H, (r0 + i) % H
                l = floats[L_OFF + i]
                inv = float32(0.0) if l == 0.0 else float32(1.0) / l
                for j in range(NACC // 4):
                    d = O_DIMS * wq + 8 * j + 2 * tq
                    part_out[t_row, h, p, d] = store(acc[4 * j + 2 * half] * inv)
                    part_out[t_row, h, p, d + 1] = store(acc[4 * j + 2 * half + 1] * inv)
        if tid < nrows:
            l = floats[L_OFF + tid]
            part_lse[row0 + (r0 + tid) // H, (r0 + tid) % H, p] = (
                float32(NEG_INF) if l == 0.0
                else (floats[M_OFF + tid] + math.log2(l)) * float32(LN2))

    return partition_kernel
