"""Tensor cores without wgmma (``backend="mma_sync"``, sm_80 and later): the partition kernel.

Ampere and Ada GPUs (A100, L40S, RTX 30xx/40xx) have warp-level ``mma.sync`` but not Hopper's
wgmma, TMA or mbarriers. This kernel uses only sm_80 instructions: ``mma.sync`` m16n8k16
(16-bit inputs, fp32 accumulators) and ``ldmatrix`` (ptx/mma_sync.py, fragments there).

Second version (FlashAttention-2's structure within a tile): the scores stay in registers,
split over the warps by keys, and the softmax runs on them there. A 16-bit tile is copied by
``cp.async`` in one stage (all of it in flight at once, one wait a tile); FP8 rows by loads
that convert them. docs/kernels/mma_sync.md says what each costs and the next steps.

Notation
--------
- Rows, grid and partitions as in simple.py: block (p, g, b) owns sequence b, query rows
  ``[g*BLOCK_M, (g+1)*BLOCK_M)`` (r = i * H + h; BLOCK_M = 16, one m16 tile) and partition p
  of their key tiles (common.partition_tiles), skipping the tiles the mask drops entirely.
- NW = 4 warps; lane l = 4 gr + tq (gr = l // 4, tq = l % 4), as in the fragment tables: a
  lane holds rows gr and gr + 8 of every fragment.
- Shared memory, dynamic, at word offsets (``layout``; no array views, whose shapes would
  take registers), int32 words of two 16-bit values unless said (96,256 bytes):
      Qs [BLOCK_M][ROWW]     the block's queries (288 words a row + 4 padding)
      Ks [BLOCK_N][ROWW]     the key tile (64 keys); its first 256 words (512 dims) are V
      Ps [BLOCK_M][PROWW]    the tile's probabilities, 16-bit (32 words + 4 padding)
      Mx, Sx [NW][BLOCK_M]   fp32: each warp's row maxima and row sums over its 16 keys
  A row of Qs and Ks is 1168 bytes, of Ps 144: odd multiples of 16 bytes, so the 8 rows an
  ``ldmatrix`` reads fall in 8 different groups of 4 banks (no bank conflict).
- A tile of 64 keys, four phases with a barrier between them:
  1. copy: 16-bit rows by ``cp.async``, 8 lanes a row (a warp's instruction reads 128
     contiguous bytes of each of 4 rows), 16 rows a pass, 4 passes, 36 16-byte pieces a
     thread (4-byte pieces when the cache does not start 16-byte aligned); FP8 rows by
     loads, each warp every fourth key row, 32 lanes along it; zeros past the end;
  2. S = Q K^T: warp w takes keys [16 w, 16 w + 16) over all 576 dims, 36 steps of two
     m16n8k16, the scores in its registers (s[8]: rows gr, gr + 8, keys 2 tq, 2 tq + 1 of
     each n8 tile); mask and score mod applied there; the row maxima of its keys to Mx;
  3. softmax: every lane reads the 4 warps' maxima of its rows, so each warp computes the same
     new running max m and rescale alpha; P = 2^(s - m) rounded to 16 bits into Ps (a lane's
     two keys are one word), the row sums of its keys to Sx;
  4. O = alpha O + P V: warp w owns output dims [128 w, 128 w + 128) (16 n8 tiles, 64 fp32
     accumulators a lane) over all 64 keys, 4 steps of 16; A = P (ldmatrix from Ps), B = V
     (ldmatrix .trans from Ks); the running sum l = alpha l + (the 4 warps' sums).
  The running max and sum of a lane's two rows live in its registers, the same in every warp.
- Accumulator element k of n8 tile j (acc[4j + k]) is O[gr + 8 (k // 2), 128 w + 8 j +
  2 tq + k % 2]; score element k of n8 tile j (s[4j + k]) is S[gr + 8 (k // 2), 16 w + 8 j +
  2 tq + k % 2].

Output: the partition's normalised ``part_out[t, h, p, :512]`` and natural-log LSE
``part_lse[t, h, p]`` (-inf when it kept no key), merged by the combine kernel; with one
partition, ``out`` and ``lse`` themselves.
"""
import math

from numba import cuda, float32, int32

from .. import ptx
from .._compat import INLINE, JIT_OPTIONS, SIMULATOR
from .common import (D_QK, D_V, LN2, LOG2E, NEG_INF, make_log2_score, make_partition_walk,
                     make_tile_walk, mark_empty)

BLOCK_M = 16  # query rows a block: one m16 tile (64 rows: docs/kernels/mma_sync.md)
BLOCK_N = 64  # keys a tile: 16 a warp in S, four k16 steps of P V
NW = 4  # warps a block
NTHREADS = 32 * NW
WORDS = D_QK // 2  # a row as int32 words of two 16-bit values (288)
ROWW = WORDS + 4  # words a row of Qs / Ks (1168 bytes)
ROW_BYTES = 4 * ROWW
PROWW = BLOCK_N // 2 + 4  # words a row of Ps (144 bytes)
P_ROW_BYTES = 4 * PROWW
O_DIMS = D_V // NW  # output dims a warp owns (128: 16 n8 tiles)
NACC = O_DIMS // 8 * 4  # accumulators a lane (64)
STAGE = WORDS // 32  # words of a key row a lane loads before storing them (9; FP8 rows)
ROWS_A_PASS = NTHREADS // 8  # key rows a cp.async pass copies (8 lanes a row: 16)
MIN_BLOCKS = 2  # blocks a multiprocessor the registers are budgeted for (launch bound)
JIT = JIT_OPTIONS if SIMULATOR else dict(JIT_OPTIONS, launch_bounds=(NTHREADS, MIN_BLOCKS))


def layout():
    """Word offsets of Qs, Ks, Ps, Mx, Sx in dynamic shared memory, and its size in words
    (every offset a multiple of 4 words: 16-byte aligned for ldmatrix)."""
    sizes = (BLOCK_M * ROWW, BLOCK_N * ROWW, BLOCK_M * PROWW, NW * BLOCK_M, NW * BLOCK_M)
    offs, at = [], 0
    for n in sizes:
        offs.append(at)
        at += -(-n // 4) * 4
    return tuple(offs), at


def smem_bytes():
    return 4 * layout()[1]


def _make_pv(tag):
    """``pv(acc, sm, kaddr, a0, a1, a2, a3, tid)``: acc += P . V over one 16-key step for the
    warp's 16 n8 tiles; ``kaddr`` is this lane's ldmatrix address for the first pair of tiles
    (each pair is 16 dims = 32 bytes further). Written out: ``mma`` takes its accumulator
    offset as a compile-time constant, so that the accumulators stay in registers."""
    lines = ["def pv(acc, sm, kaddr, a0, a1, a2, a3, tid):"]
    for pair in range(O_DIMS // 16):
        lines += [f"    m0, m1, m2, m3 = ldsm_t(sm, kaddr + {32 * pair}, tid)",
                  f"    mma(acc, {8 * pair}, a0, a1, a2, a3, m0, m1, tid)",
                  f"    mma(acc, {8 * pair + 4}, a0, a1, a2, a3, m2, m3, tid)"]
    scope = {"ldsm_t": ptx.ldmatrix_x4_trans, "mma": ptx.mma_m16n8k16(tag)}
    exec("\n".join(lines), scope)  # (generated here, from the lines above: no outside input)
    return cuda.jit(device=True, **INLINE)(scope["pv"])


def make_partition_kernel(*, tag, to16, store, locate, mask_apply, mask_classify,
                          mask_key_range, score_mod, fold_scale, block_m, heads, fp8=None,
                          wide=True, key_count=None):
    """The kernel for one configuration (factory.py): ``tag`` "bf16" or "f16" (q's type, and
    the tiles' in shared memory), ``to16`` fp32 -> that type (P, and FP8 rows), ``store`` fp32
    -> ``part_out``, ``fp8`` the cache's FP8 layout (docs/fp8.md) or None, ``wide`` whether
    the cache starts 16-byte aligned (16-byte copies; else 4-byte ones)."""
    assert block_m == BLOCK_M and STAGE * 32 == WORDS and O_DIMS % 16 == 0
    (Q_OFF, K_OFF, P_OFF, MX_OFF, SX_OFF), _ = layout()
    H = heads
    key_tiles, next_tile = make_tile_walk(mask_classify, mask_key_range, BLOCK_N, heads,
                                          key_count=key_count)
    first_tiles = make_partition_walk(key_tiles, next_tile)
    log2_score = make_log2_score(mask_apply, score_mod, fold_scale)
    mma = ptx.mma_m16n8k16(tag)
    pv = _make_pv(tag)
    scale_acc = ptx.acc_scale(NACC)

    V32 = fp8 == "v32"
    # "e4m3" (one scale for the cache): the codes go into the tiles exactly (e4m3 values are
    # bf16 and fp16 values) and the scale multiplies the scores and the output instead, once
    # each, not rounded into every element. "v32" scales each 128 dims of a row apart: there
    # the scaled values are rounded to the tiles' type.
    FOLD = fp8 == "e4m3"

    @cuda.jit(device=True, **INLINE)
    def pack(x0, x1):
        return (int32(to16(x0)) & 0xFFFF) | (int32(to16(x1)) << 16)

    @cuda.jit(device=True, **INLINE)
    def row_word(storage, page, slot, c):
        """Word c (dims 2c, 2c + 1) of a key row as two 16-bit values of the tiles' type: the
        cache's word itself, or two FP8 codes (as they are in "e4m3"; times the scale of the
        row's group in "v32", whose 64 rope dims are bf16 pairs after the codes and 4
        scales)."""
        if not fp8:
            return storage[page, slot, c]
        if V32 and c >= D_V // 2:
            x0, x1 = ptx.bf16x2_to_f32(storage[page, slot, c - D_V // 2 + D_V // 4 + 4])
            return pack(x0, x1)
        sc = float32(1.0)
        if V32:
            sc = ptx.i32_as_f32(storage[page, slot, D_V // 4 + c // 64])
        x0, x1, x2, x3 = ptx.e4m3x4_to_f32(storage[page, slot, c // 2])
        if c % 2:
            return pack(x2 * sc, x3 * sc)
        return pack(x0 * sc, x1 * sc)

    PIECE = 16 if wide else 4  # bytes a cp.async
    PIECES = 4 * WORDS // PIECE // 8  # a thread's pieces of a row (9 or 36)
    assert PIECES * PIECE * 8 == 4 * WORDS and BLOCK_N % ROWS_A_PASS == 0
    cp_async = ptx.cp_async16_at if wide else ptx.cp_async4_at

    @cuda.jit(device=True, **INLINE)
    def issue_tile(words, base, storage, block_table, b, k0, k1, tid):
        """Start the copy of keys [k0, k1) of sequence b (16-bit rows) into Ks, zeros past k1
        (P is 0 there, but 0 * NaN is NaN): thread tid copies pieces tid % 8, + 8, ... of
        rows tid // 8 + 16 j; one page lookup a row (keys past k1 look up key k1 - 1, a real
        one, and copy nothing)."""
        npages, page_size = storage.shape[0], storage.shape[1]
        for j in range(BLOCK_N // ROWS_A_PASS):
            n = tid // 8 + ROWS_A_PASS * j
            page, slot = locate(block_table, page_size, npages, b, min(k0 + n, k1 - 1))
            src = ptx.global_addr(storage, page, slot, 0) + PIECE * (tid % 8)
            dst = base + 4 * (K_OFF + n * ROWW) + PIECE * (tid % 8)
            for u in range(PIECES):
                cp_async(words, dst + 8 * PIECE * u, src + 8 * PIECE * u, k0 + n < k1)
        ptx.cp_async_commit()

    @cuda.jit(device=True, **INLINE)
    def copy_tile(words, storage, block_table, b, k0, k1, warp, lane):
        """Keys [k0, k1) of sequence b into Ks as words, zeros past k1 (P is 0 there, but
        0 * NaN is NaN): warp w copies keys w, w + 4, ..., its lanes along the row (a load
        reads 128 contiguous bytes; FP8 rows, 64), STAGE loads before their stores."""
        for kk in range(BLOCK_N // NW):
            n = NW * kk + warp
            valid = k0 + n < k1
            page, slot = locate(block_table, storage.shape[1], storage.shape[0], b,
                                k0 + n if valid else k0)
            w = cuda.local.array(STAGE, int32)
            for j in range(STAGE):
                w[j] = row_word(storage, page, slot, lane + 32 * j) if valid else 0
            for j in range(STAGE):
                words[K_OFF + n * ROWW + lane + 32 * j] = w[j]

    @cuda.jit(**JIT)
    def partition_kernel(q, q_offsets, storage, block_table, lengths, bias, scale, chunk,
                         part_out, part_lse):
        # q [T, H, 288] and storage [pages, page_size, 288]: int32 words of 16-bit pairs (FP8
        # rows: of four codes); q_offsets [B+1], chunk: tiles a partition, part_out [T, H, P,
        # 512], part_lse [T, H, P]; FP8 caches: scale + 1j * kv_scale (simt.py's convention).
        p, nparts, b = cuda.blockIdx.x, cuda.gridDim.x, cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        words = cuda.shared.array(0, int32)
        floats = cuda.shared.array(0, float32)  # the same memory, seen as fp32
        base = ptx.smem_addr(words)

        row0 = q_offsets[b]
        nq = q_offsets[b + 1] - row0
        length = lengths[b]
        r0 = cuda.blockIdx.y * BLOCK_M
        nrows = min(BLOCK_M, nq * H - r0)
        if nrows <= 0:
            return  # the whole block leaves: no barrier is skipped

        q_lo, q_hi, kstart, kend, t, t_end = first_tiles(length, nq, r0, nrows, p, nparts,
                                                            chunk)
        if t >= t_end and nparts > 1:  # (one partition writes out itself: zeros, below)
            mark_empty(part_lse, row0, r0, nrows, p, H, tid, NTHREADS)
            return  # uniform in the block, before any barrier

        # -- the block's queries into Qs (zeros past nrows) --
        for c in range(tid, BLOCK_M * WORDS, NTHREADS):
            i, d = c // WORDS, c % WORDS
            words[Q_OFF + i * ROWW + d] = (q[row0 + (r0 + i) // H, (r0 + i) % H, d]
                                           if i < nrows else 0)
        acc = cuda.local.array(NACC, float32)  # O: 16 rows x this warp's 128 dims
        for k in range(NACC):
            acc[k] = float32(0.0)
        s = cuda.local.array(8, float32)  # S: this warp's 16 keys, rows gr and gr + 8
        m_run = cuda.local.array(2, float32)  # running max, sum of rows gr, gr + 8
        l_run = cuda.local.array(2, float32)
        for half in range(2):
            m_run[half] = float32(NEG_INF)
            l_run[half] = float32(0.0)

        gr, tq = lane // 4, lane % 4
        sm_scale, kv_scale = float32(scale.real), float32(scale.imag)
        folded = kv_scale if FOLD else float32(1.0)  # the scale the tiles leave out
        fold = float32(sm_scale * LOG2E)
        # This lane's ldmatrix addresses (bytes). A fragments (Q, P): row l % 8 + 8 (l // 8 % 2),
        # 16-bit column 8 (l // 16) of the step. B of S (K, not transposed): key l % 8 +
        # 8 (l // 16) of the warp's 16, column 8 (l // 8 % 2). B of P V (V, .trans): key
        # l % 8 + 8 (l // 8 % 2) of the step, column 8 (l // 16) of the warp's 128 dims.
        a_row, a_col = lane % 8 + 8 * (lane // 8 % 2), 8 * (lane // 16)
        q_addr = base + 4 * Q_OFF + a_row * ROW_BYTES + 2 * a_col
        p_addr = base + 4 * P_OFF + a_row * P_ROW_BYTES + 2 * a_col
        k_addr = (base + 4 * K_OFF + (16 * warp + lane % 8 + 8 * (lane // 16)) * ROW_BYTES
                  + 2 * 8 * (lane // 8 % 2))
        v_addr = base + 4 * K_OFF + a_row * ROW_BYTES + 2 * (a_col + O_DIMS * warp)

        while t < t_end:
            k0 = kstart + t * BLOCK_N
            k1 = min(k0 + BLOCK_N, kend)
            cls = mask_classify(k0, k1, q_lo, q_hi)
            cuda.syncthreads()  # every warp is done with the previous tile (Ks, Ps, Mx, Sx)

            # -- phase 1: the key tile into Ks --
            if fp8:
                copy_tile(words, storage, block_table, b, k0, k1, warp, lane)
            else:
                issue_tile(words, base, storage, block_table, b, k0, k1, tid)
                ptx.cp_async_wait_all()  # this thread's pieces; the barrier: everyone's
            cuda.syncthreads()  # the whole tile (on the first, Qs too)

            # -- phase 2: this warp's 16 keys of S, in registers; mask, score mod, maxima --
            for k in range(8):
                s[k] = float32(0.0)
            for step in range(D_QK // 16):
                a0, a1, a2, a3 = ptx.ldmatrix_x4(words, q_addr + 32 * step, tid)
                b0, b1, b2, b3 = ptx.ldmatrix_x4(words, k_addr + 32 * step, tid)
                mma(s, 0, a0, a1, a2, a3, b0, b1, tid)  # keys 16 w + 0..7
                mma(s, 4, a0, a1, a2, a3, b2, b3, tid)  # keys 16 w + 8..15
            for half in range(2):
                i = gr + 8 * half  # the block's row
                r = r0 + i
                qi, h = r // H, r % H
                q_pos = length - nq + qi
                row_max = float32(NEG_INF)
                for k in range(4):  # this row's 4 scores: n8 tile k // 2, key 2 tq + k % 2
                    e = 4 * (k // 2) + 2 * half + k % 2
                    key = k0 + 16 * warp + 8 * (k // 2) + 2 * tq + k % 2
                    x = float32(NEG_INF)
                    if i < nrows and key < k1:
                        x = log2_score(s[e] * folded, fold, sm_scale, cls, b, h, qi, q_pos,
                                       key, bias)
                    s[e] = x
                    row_max = max(row_max, x)
                row_max = max(row_max, ptx.shfl_xor(row_max, 1, tid))  # the quad's 4 lanes
                row_max = max(row_max, ptx.shfl_xor(row_max, 2, tid))
                if tq == 0:
                    floats[MX_OFF + warp * BLOCK_M + i] = row_max
            cuda.syncthreads()  # every warp's maxima

            # -- phase 3: the new running max (the same in every warp), P, the row sums --
            alpha = cuda.local.array(2, float32)
            for half in range(2):
                i = gr + 8 * half
                m_new = m_run[half]
                for u in range(NW):
                    m_new = max(m_new, floats[MX_OFF + u * BLOCK_M + i])
                m_ref = m_new if m_new != float32(NEG_INF) else float32(0.0)
                alpha[half] = math.exp2(m_run[half] - m_ref)
                m_run[half] = m_new
                row_sum = float32(0.0)
                for j in range(2):  # n8 tile j: keys 16 w + 8 j + 2 tq, + 1 -> one word
                    x0 = math.exp2(s[4 * j + 2 * half] - m_ref)
                    x1 = math.exp2(s[4 * j + 2 * half + 1] - m_ref)
                    row_sum += x0 + x1
                    words[P_OFF + i * PROWW + 8 * warp + 4 * j + tq] = pack(x0, x1)
                row_sum += ptx.shfl_xor(row_sum, 1, tid)
                row_sum += ptx.shfl_xor(row_sum, 2, tid)
                if tq == 0:
                    floats[SX_OFF + warp * BLOCK_M + i] = row_sum
            cuda.syncthreads()  # P and every warp's sums

            # -- phase 4: O = alpha O + P V on this warp's 128 dims, 4 steps of 16 keys --
            for half in range(2):
                i = gr + 8 * half
                tile_sum = float32(0.0)
                for u in range(NW):
                    tile_sum += floats[SX_OFF + u * BLOCK_M + i]
                l_run[half] = l_run[half] * alpha[half] + tile_sum
            scale_acc(acc, alpha[0], alpha[1])
            for step in range(BLOCK_N // 16):
                a0, a1, a2, a3 = ptx.ldmatrix_x4(words, p_addr + 32 * step, tid)
                pv(acc, words, v_addr + 16 * ROW_BYTES * step, a0, a1, a2, a3, tid)
            t = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi)

        # -- the partition's normalised output and LSE, from registers --
        for half in range(2):
            i = gr + 8 * half
            if i < nrows:
                t_row, h = row0 + (r0 + i) // H, (r0 + i) % H
                l = l_run[half]
                inv = float32(0.0) if l == 0.0 else folded / l
                for j in range(NACC // 4):
                    d = O_DIMS * warp + 8 * j + 2 * tq
                    part_out[t_row, h, p, d] = store(acc[4 * j + 2 * half] * inv)
                    part_out[t_row, h, p, d + 1] = store(acc[4 * j + 2 * half + 1] * inv)
                if warp == 0 and tq == 0:
                    part_lse[t_row, h, p] = (float32(NEG_INF) if l == 0.0 else
                                             (m_run[half] + math.log2(l)) * float32(LN2))

    return partition_kernel
