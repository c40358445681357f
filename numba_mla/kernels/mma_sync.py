"""Tensor cores without wgmma (``backend="mma_sync"``, sm_80 and later): the partition kernel.

Ampere and Ada GPUs (A100, L40S, RTX 30xx/40xx) have warp-level ``mma.sync`` but not Hopper's
wgmma, TMA or mbarriers. This kernel uses only sm_80 instructions: ``mma.sync`` m16n8k16
(16-bit inputs, fp32 accumulators) and ``ldmatrix`` (ptx/mma_sync.py, fragments there).

FlashAttention-2's structure within a tile: the scores stay in registers, split over the warps
by keys, and the softmax runs on them there. A 16-bit tile is copied by ``cp.async`` (all of
it in flight at once, one wait a tile); FP8 rows too, as they are, into a buffer Fs, then
converted into the tile by all warps ("staged"), or, where Fs does not fit (an Ada GPU), by
loads that convert them. Two block shapes
(``block_m``): 16 query rows, 4 warps and one tile in shared memory (96 KB: two blocks a
multiprocessor on an H100/H200); 32 rows, 8 warps and two tiles, the next one's copy in flight
while this one's products run (192 KB: one block, on GPUs that give a block that much).
docs/kernels/mma_sync.md says what each costs and the next steps.

Notation
--------
- Rows, grid and partitions as in simple.py: block (p, g, b) owns sequence b, query rows
  ``[g*BM, (g+1)*BM)`` (r = i * H + h; BM = 16 MT rows, MT = 1 or 2 m16 tiles) and
  partition p of their key tiles (common.partition_tiles), skipping the tiles the mask drops.
- NW = 4 MT warps; lane l = 4 gr + tq (gr = l // 4, tq = l % 4), as in the fragment tables: a
  lane holds rows gr and gr + 8 of every m16 tile. Warp w computes S for m16 tile
  sm = w // 4 and keys [16 kg, 16 kg + 16), kg = w % 4 (with warp w ^ 1: below); it owns
  output dims [OD w, OD w + OD) of all BM rows, OD = 512 / NW (128 or 64: 64 fp32
  accumulators a lane either way).
- Shared memory, dynamic, at word offsets (``layout``; no array views, whose shapes would
  take registers), int32 words of two 16-bit values unless said:
      Qs [BM][ROWW]             the block's queries (288 words a row + 4 padding)
      Ks [STAGES][BLOCK_N][ROWW] the key tiles (64 keys; STAGES = MT, 1 when staged); the
                                first 256 words (512 dims) of a row are V
      Ps [BM][PROWW]            the tile's probabilities, 16-bit (32 words + 4 padding);
                                before them, S's partial scores passed between warps (Xs
                                [NW][2][32][4] fp32: warp, half, lane; the region is the
                                larger of the two)
      Mx, Sx [4][BM]            fp32: each key group's row maxima and row sums (its 16 keys)
      Fs [RS][BLOCK_N][FW]      staged FP8 rows as they are (FW = 144 or 164 words), RS = 1
                                or 2 raw stages (``staged``; two where they fit)
  A row of Qs and Ks is 1168 bytes, of Ps 144: odd multiples of 16 bytes, so the 8 rows an
  ``ldmatrix`` reads fall in 8 different groups of 4 banks (no bank conflict); with
  ``K_SWIZZLE`` (on, for a 16-byte aligned 16-bit cache) Ks's rows are 1,152 bytes apart,
  unit u of row r at u ^ (r & 7).
- A tile of 64 keys, in phases with a barrier between them:
  1. copy: 16-bit rows by ``cp.async``, 8 lanes a row (a warp's instruction reads 128
     contiguous bytes of each of 4 rows), 16 MT rows a pass, 36 16-byte pieces a row's 8
     lanes share (4-byte pieces when the cache does not start 16-byte aligned); staged FP8
     rows the same way into Fs (issued RS tiles ahead), then, after a wait and a barrier,
     each warp converts every NW-th row of the tile's Fs stage into Ks, a lane a word of 4
     codes, a barrier, and the copy of the tile RS ahead is issued into that stage (with
     two, a copy is in flight while a tile is converted as well as while it is multiplied);
     FP8 rows not staged by loads, each warp every NW-th key row, 32 lanes along it; zeros
     past the end. With one stage: a barrier (every warp done with the previous tile), the
     copy, its wait, a barrier. With two: wait for this tile (issued during the previous
     one), a barrier (every warp done with the previous tile, in the other stage), then
     issue the next tile's copy into the other stage;
  2. S = Q K^T: warps w and w ^ 1 (kg = 2 kh + dh, dh = 0 and 1) score the same 32 keys
     [32 kh, 32 kh + 32), each over its half of the 576 dims (dh: 18 steps of one Q and two
     K ``ldmatrix`` for four m16n8k16, where 16 keys over all dims took one and one for two:
     a quarter fewer shared-memory reads); each stores the partial scores of its partner's
     16 keys in Xs, a named barrier of the pair (64 threads), and adds the partner's to its
     own 16: the scores in its registers (s[8]: rows gr, gr + 8 of m16 tile sm, keys 2 tq,
     2 tq + 1 of each n8 tile); mask and score mod applied there; the row maxima of its
     keys to Mx[kg];
  3. softmax: every lane reads the 4 key groups' maxima of its 2 MT rows, so each warp
     computes the same new running max m and rescale alpha; P = 2^(s - m) rounded to 16 bits
     into Ps (a lane's two keys are one word), the row sums of its keys to Sx[kg];
  4. O = alpha O + P V: warp w's OD dims of every row, 4 steps of 16 keys; A = P (ldmatrix
     from Ps, one a m16 tile), B = V (ldmatrix .trans from the tile); the running sum
     l = alpha l + (the 4 key groups' sums).
  The running max and sum of a lane's 2 MT rows live in its registers, the same in every warp.
- Accumulator element k of n8 tile j of m16 tile u (acc[32 u + 4j + k] with MT = 2, acc[4j +
  k] with MT = 1) is O[16 u + gr + 8 (k // 2), OD w + 8 j + 2 tq + k % 2]; score element k of
  n8 tile j (s[4j + k]) is S[16 sm + gr + 8 (k // 2), 16 kg + 8 j + 2 tq + k % 2].

Output: the partition's normalised ``part_out[t, h, p, :512]`` and natural-log LSE
``part_lse[t, h, p]`` (-inf when it kept no key), merged by the combine kernel; with one
partition, ``out`` and ``lse`` themselves.
"""
import math

from numba import cuda, float32, int32

from .. import ptx
from .._compat import INLINE, JIT_OPTIONS, SIMULATOR
from ..fp8 import ROW_BYTES as FP8_ROW_BYTES
from .common import (D_QK, D_V, LN2, LOG2E, NEG_INF, make_log2_score, make_partition_walk,
                     make_tile_walk, mark_empty)

BLOCK_M = 16  # query rows a block where 32 do not fit (docs/kernels/mma_sync.md)
BLOCK_MS = (16, 32)  # the block shapes: 16 rows (4 warps, one tile), 32 (8 warps, two tiles)
BLOCK_N = 64  # keys a tile: 16 a key group in S, four k16 steps of P V
WORDS = D_QK // 2  # a row as int32 words of two 16-bit values (288)
ROWW = WORDS + 4  # words a row of Qs / Ks (1168 bytes)
ROW_BYTES = 4 * ROWW
PROWW = BLOCK_N // 2 + 4  # words a row of Ps (144 bytes)
P_ROW_BYTES = 4 * PROWW
NACC = 64  # accumulators a lane (16 rows x 128 dims or 32 rows x 64 dims a warp)
STAGE = WORDS // 32  # words of a key row a lane loads before storing them (9; FP8 rows)
KEY_GROUPS = 4  # warps sharing a m16 tile's S, 16 keys each once their halves are summed
HALF_STEPS = D_QK // 32  # k16 steps of S a warp takes: half the dims (18)
HALF_SCORES = 8  # partial scores a lane hands its partner warp (two n8 tiles)
# the key stages' 16-bit rows 1,152 bytes apart with each 16-byte unit u of row r at
# u ^ (r & 7) (mma_sync_roles.K_SWIZZLE's layout, which took the split-role form to 0.89x
# its time), rather than 1,168 bytes apart: for a 16-byte aligned 16-bit cache. The 16-row
# block at H = 16 took 0.960x / 0.962x the padded rows' time at 64 x 16 x 4096 / 128 x 16 x
# 8192 (H100, two rounds: plots/ab_lockstep_swz_42a7ce7_h100.json)
K_SWIZZLE = True
K_ROW = 4 * WORDS  # bytes a swizzled stage row (1,152)
MIN_BLOCKS = 2  # blocks of 16 rows a multiprocessor the registers are budgeted for


def geometry(block_m=BLOCK_M):
    """(MT, NW, threads, stages) of a block of ``block_m`` rows."""
    assert block_m in BLOCK_MS, block_m
    mt = block_m // 16
    return mt, KEY_GROUPS * mt, 32 * KEY_GROUPS * mt, mt


def threads(block_m=BLOCK_M):
    return geometry(block_m)[2]


NTHREADS = threads()  # (the 16-row block's)


def fp8_row_words(fp8):
    """int32 words of an FP8 row: 576 codes ("e4m3"), or 512 codes, 4 scales, 64 bf16
    ("v32")."""
    return FP8_ROW_BYTES[fp8] // 4


def layout(block_m=BLOCK_M, fp8=None, staged=0):
    """Word offsets of Qs, Ks, Ps (and Xs), Mx, Sx and Fs in dynamic shared memory, and its
    size in words (every offset a multiple of 4 words: 16-byte aligned for ldmatrix and
    cp.async).
    ``staged`` (0, 1 or 2; True is 1): FP8 rows copied as they are into that many Fs stages,
    then converted into one Ks stage."""
    _, nw, _, stages = geometry(block_m)
    stages = 1 if staged else stages
    # Ps's words also pass S's partial scores between the warps of a pair (Xs): S is done
    # with them before the barrier after which P is written
    sizes = (block_m * ROWW, stages * BLOCK_N * ROWW,
             max(block_m * PROWW, nw * 32 * HALF_SCORES), KEY_GROUPS * block_m,
             KEY_GROUPS * block_m, int(staged) * BLOCK_N * fp8_row_words(fp8) if fp8 else 0)
    offs, at = [], 0
    for n in sizes:
        offs.append(at)
        at += -(-n // 4) * 4
    return tuple(offs), at


def smem_bytes(block_m=BLOCK_M, fp8=None, staged=0):
    return 4 * layout(block_m, fp8, staged)[1]


def pipeline_stages(block_m=BLOCK_M, fp8=None, staged=0):
    """Key tiles in flight (``MHAConfig.num_pipeline_stages``): 2 where the next tile's copy
    runs under this tile's products (32 rows of 16-bit rows, two Ks stages; FP8 rows staged
    through one Fs stage), 3 with two Fs stages (this tile's and the next two tiles' rows),
    else 1."""
    if staged:
        return 1 + int(staged)
    return 2 if block_m == 32 and not fp8 else 1


def min_blocks(block_m=BLOCK_M):
    """Blocks a multiprocessor the launch bound budgets registers for."""
    return MIN_BLOCKS if block_m == 16 else 1


def make_issue(locate, wide, nthreads, rows, region, row_bytes, src_bytes, swizzle=False):
    """``issue(words, base, ks, storage, block_table, b, k0, k1, tid)``: start the copy of keys
    [k0, k1) of sequence b (``src_bytes`` of each row, as they are) into ``rows`` rows of
    ``row_bytes`` from byte ``ks`` of the region at word ``region``, zeros past k1 (P is 0
    there, but 0 * NaN is NaN), by ``nthreads`` threads (``tid`` from 0): thread tid copies
    pieces tid % 8, + 8, ... of rows tid // 8 + (nthreads // 8) j; one page lookup a row (keys
    past k1 look up key k1 - 1, a real one, and copy nothing). ``wide``: 16-byte pieces (the
    cache starts 16-byte aligned), else 4-byte ones. Then the group is committed. ``swizzle``
    (16-byte pieces): piece p of row n lands at unit p ^ (n & 7) of its row (K_SWIZZLE)."""
    piece = 16 if wide else 4  # bytes a cp.async
    cp_async = ptx.cp_async16_at if wide else ptx.cp_async4_at
    rows_a_pass = nthreads // 8  # key rows a pass copies (8 lanes a row)
    assert rows % rows_a_pass == 0
    assert not swizzle or (wide and rows_a_pass % 8 == 0)  # (a thread's rows: one key)
    pieces = src_bytes // piece  # a row's
    assert pieces * piece == src_bytes
    passes = -(-pieces // 8)  # a thread's pieces of a row, the last maybe not all threads'

    @cuda.jit(device=True, **INLINE)
    def issue(words, base, ks, storage, block_table, b, k0, k1, tid):
        npages, page_size = storage.shape[0], storage.shape[1]
        for j in range(rows // rows_a_pass):
            n = tid // 8 + rows_a_pass * j
            page, slot = locate(block_table, page_size, npages, b, min(k0 + n, k1 - 1))
            src = ptx.global_addr(storage, page, slot, 0) + piece * (tid % 8)
            dst = base + 4 * region + ks + n * row_bytes + piece * (
                ((tid % 8) ^ (tid // 8 % 8)) if swizzle else tid % 8)
            for u in range(passes):
                if pieces % 8 == 0 or 8 * u + tid % 8 < pieces:
                    cp_async(words, dst + 8 * piece * u, src + 8 * piece * u, k0 + n < k1)
        ptx.cp_async_commit()

    return issue


# 16-byte cp.async by cache operator: "cg" (L2 only), "ca" (through L1)
CP_ASYNC16 = {"cg": ptx.cp_async16_at, "ca": ptx.cp_async16_ca_at}


def make_issue_rows(locate, nthreads, rows, row_bytes, src_bytes, lanes=8, cache="cg",
                    const_full=False):
    """``issue(words, dst, storage, block_table, b, k0, k1, src0, tid)``: ``make_issue``'s copy
    (16-byte pieces; with ``lanes`` 8 the same pieces of the same rows), with what a thread's
    copies share computed once by its caller: ``dst`` the shared address of this thread's
    first piece (its row tid // lanes of the stage, piece tid % lanes), ``src0`` the global
    address of the storage's first row plus piece tid % lanes; ``k0``, ``k1`` int32. Each
    row's index is 32-bit arithmetic (``ptx.row_addr``; rows ``src_bytes`` apart: a
    C-contiguous storage of rows as they are), where ``make_issue``'s 64-bit indices and
    addresses took about 70 instructions a row (the split-role form's sm_90 SASS). ``lanes``
    a row: 8 (a warp-instruction writes 128 bytes of each of 4 rows), 16 (256 bytes of each
    of 2) or 32 (512 bytes of one row); a thread then looks up 4 or 8 rows of a 32-row
    stage, not 2. ``cache``: "cg"
    (``cp.async.cg``, L2 only) or "ca" (through L1). ``const_full``: a copy of ``rows`` whole
    keys takes a constant predicate (no source size chosen at run time), a partial one keeps
    it."""
    copy = CP_ASYNC16[cache]
    rows_a_pass = nthreads // lanes  # key rows a pass copies
    assert lanes in (8, 16, 32) and rows % rows_a_pass == 0 and src_bytes % 16 == 0
    pieces = src_bytes // 16  # a row's
    passes = -(-pieces // lanes)  # a thread's pieces of a row, the last maybe not all lanes'

    @cuda.jit(device=True, **INLINE)
    def rows_of(words, dst, storage, block_table, b, k0, k1, src0, tid, whole):
        npages, page_size = storage.shape[0], storage.shape[1]
        for j in range(rows // rows_a_pass):
            key = k0 + (tid // lanes + rows_a_pass * j)
            page, slot = locate(block_table, page_size, npages, b, ptx.min_i32(key, k1 - 1))
            src = ptx.row_addr(src0, page, page_size, slot, src_bytes)
            ok = whole or ptx.lt_i32(key, k1)  # (``whole`` a constant: folded)
            for u in range(passes):
                if pieces % lanes == 0 or tid % lanes + lanes * u < pieces:
                    copy(words, dst + row_bytes * rows_a_pass * j + 16 * lanes * u,
                         src + 16 * lanes * u, ok)

    @cuda.jit(device=True, **INLINE)
    def issue(words, dst, storage, block_table, b, k0, k1, src0, tid):
        if const_full and k1 - k0 == rows:  # (uniform: every thread's keys are whole)
            rows_of(words, dst, storage, block_table, b, k0, k1, src0, tid, True)
        else:
            rows_of(words, dst, storage, block_table, b, k0, k1, src0, tid, False)
        ptx.cp_async_commit()

    return issue


def make_q_copy(block_m, nthreads, region):
    """``copy_q(words, base, q, row0, r0, nrows, H, tid)``: the block's ``block_m`` query rows
    (flattened rows r0 .. r0 + nrows of the sequence whose first token is ``row0``; zeros
    past nrows) into rows of ``ROWW`` words from word ``region``, by ``nthreads`` threads,
    each 4-byte piece a ``cp.async`` (the caller's q may start anywhere a word may), all of a
    thread's in flight at once, then waited for (this thread's pieces; a barrier makes them
    everyone's). A plain load and store a word put one round trip to memory after another:
    Nsight Compute found this copy 9% of the split-role form's time at 64 x 128 x 4096 on
    an H100."""
    @cuda.jit(device=True, **INLINE)
    def copy_q(words, base, q, row0, r0, nrows, H, tid):
        for c in range(tid, block_m * WORDS, nthreads):
            i, d = c // WORDS, c % WORDS
            r = r0 + min(i, nrows - 1)  # (rows past nrows read nothing: a real row's address)
            ptx.cp_async4_at(words, base + 4 * (region + i * ROWW + d),
                             ptx.global_addr(q, row0 + r // H, r % H, d), i < nrows)
        ptx.cp_async_commit()
        ptx.cp_async_wait_all()

    return copy_q


@cuda.jit(device=True, **INLINE)
def pass_partials(s, s2, floats, x_give, x_take, dh, barrier):
    """S's exchange between the two warps that scored the same 32 keys, each over its half
    ``dh`` of the dims (``s2``: n8 tiles 0-3): this warp's partial scores of its partner's 16
    keys (n8 tiles 2 (1 - dh), + 1) to Xs at byte ``x_give`` (16 bytes a lane, two halves 512
    bytes apart), the pair's named barrier ``barrier`` (64 threads), then into ``s[8]`` its
    own 16 keys' partials (n8 tiles 2 dh, + 1) plus the partner's from ``x_take``. Selects,
    not an index that depends on dh: the partials stay in registers."""
    for j in range(2):
        ptx.sts128(floats, x_give + 512 * j,
                   s2[4 * j] if dh else s2[8 + 4 * j],
                   s2[4 * j + 1] if dh else s2[9 + 4 * j],
                   s2[4 * j + 2] if dh else s2[10 + 4 * j],
                   s2[4 * j + 3] if dh else s2[11 + 4 * j])
    ptx.bar_sync(barrier, 64)  # the pair's partials are in
    for j in range(2):
        x0, x1, x2, x3 = ptx.lds128(floats, x_take + 512 * j)
        s[4 * j] = (s2[8 + 4 * j] if dh else s2[4 * j]) + x0
        s[4 * j + 1] = (s2[9 + 4 * j] if dh else s2[4 * j + 1]) + x1
        s[4 * j + 2] = (s2[10 + 4 * j] if dh else s2[4 * j + 2]) + x2
        s[4 * j + 3] = (s2[11 + 4 * j] if dh else s2[4 * j + 3]) + x3


def make_score_rows(log2_score, heads, lane_max=False):
    """``score_rows(s, floats, mx_at, folded, fold, sm_scale, cls, b, row, r0, nrows, length,
    nq, key0, k1, bias, tq, tid)``: a warp's 16 keys of S (``s``: rows ``row`` and ``row`` + 8
    of the block, keys key0 + 8 n8 + 2 tq (+ 1) at s[4 n8 + 2 half (+ 1)]) times ``folded``,
    masked and score-modded in log2 units (NEG_INF past ``nrows`` and ``k1``), in place; each
    row's max of them to ``floats[mx_at + row (+ 8)]`` (lanes tq == 0); with ``lane_max``,
    each lane's max of its own 4 to ``floats[mx_at + 4 (row (+ 8)) + tq]``, no shuffles."""
    H = heads

    @cuda.jit(device=True, **INLINE)
    def score_rows(s, floats, mx_at, folded, fold, sm_scale, cls, b, row, r0, nrows, length,
                   nq, key0, k1, bias, tq, tid):
        for half in range(2):
            i = row + 8 * half  # the block's row
            r = r0 + i
            qi, h = r // H, r % H
            q_pos = length - nq + qi
            row_max = float32(NEG_INF)
            for k in range(4):  # this row's 4 scores: n8 tile k // 2, key 2 tq + k % 2
                e = 4 * (k // 2) + 2 * half + k % 2
                key = key0 + 8 * (k // 2) + 2 * tq + k % 2
                x = float32(NEG_INF)
                if i < nrows and key < k1:
                    x = log2_score(s[e] * folded, fold, sm_scale, cls, b, h, qi, q_pos, key,
                                   bias)
                s[e] = x
                row_max = max(row_max, x)
            if lane_max:
                floats[mx_at + 4 * i + tq] = row_max
            else:
                row_max = max(row_max, ptx.shfl_xor(row_max, 1, tid))  # the quad's 4 lanes
                row_max = max(row_max, ptx.shfl_xor(row_max, 2, tid))
                if tq == 0:
                    floats[mx_at + i] = row_max

    return score_rows


def make_write_p(pack, unpack=None, exp2=math.exp2, quad=True):
    """``write_p(s, words, half, m_ref, p_at, tq, tid)``: P = 2^(s - m_ref) of a warp's 16
    keys in row ``half`` of its m16 tile's pair of rows (``s`` as in ``score_rows``), packed
    as 16-bit pairs (``pack``) into words ``p_at + 4 n8 + tq`` (n8 = 0, 1); returns the row's
    sum of them over the quad's 4 lanes (these 16 keys). With ``unpack`` (the inverse of
    ``pack``), returns that sum and the sum of P as rounded to 16 bits (what P V multiplies:
    the output's divisor where the reference max lags, so that even a dominant key's rounded
    P divides out). ``exp2``: 2^x (math.exp2, or ptx.exp2_ftz: one instruction, results below
    2^-126 flushed to zero). ``quad`` False (with ``unpack``): the two sums of this lane's 4
    keys only, the quad's sum left to the caller (a sum of them, rescaled alike in the 4
    lanes, adds up after the walk)."""
    assert quad or unpack is not None, "quad=False: the rounded form's only"
    if unpack is not None:
        @cuda.jit(device=True, **INLINE)
        def write_p_rounded(s, words, half, m_ref, p_at, tq, tid):
            row_sum = float32(0.0)
            row_rnd = float32(0.0)
            for n8 in range(2):
                x0 = exp2(s[4 * n8 + 2 * half] - m_ref)
                x1 = exp2(s[4 * n8 + 2 * half + 1] - m_ref)
                row_sum += x0 + x1
                w = pack(x0, x1)
                words[p_at + 4 * n8 + tq] = w
                r0, r1 = unpack(w)
                row_rnd += r0 + r1
            if not quad:
                return row_sum, row_rnd
            row_sum += ptx.shfl_xor(row_sum, 1, tid)
            row_rnd += ptx.shfl_xor(row_rnd, 1, tid)
            return (row_sum + ptx.shfl_xor(row_sum, 2, tid),
                    row_rnd + ptx.shfl_xor(row_rnd, 2, tid))

        return write_p_rounded

    @cuda.jit(device=True, **INLINE)
    def write_p(s, words, half, m_ref, p_at, tq, tid):
        row_sum = float32(0.0)
        for n8 in range(2):  # keys 8 n8 + 2 tq, + 1 -> one word
            x0 = exp2(s[4 * n8 + 2 * half] - m_ref)
            x1 = exp2(s[4 * n8 + 2 * half + 1] - m_ref)
            row_sum += x0 + x1
            words[p_at + 4 * n8 + tq] = pack(x0, x1)
        row_sum += ptx.shfl_xor(row_sum, 1, tid)
        return row_sum + ptx.shfl_xor(row_sum, 2, tid)

    return write_p


@cuda.jit(device=True, **INLINE)
def swizzled_units(row, unit, key):
    """The addresses of 16-byte units ``unit``, + 2, + 4 and + 6 of a swizzled key stage row
    at byte ``row`` (``K_SWIZZLE``: unit u stored at u ^ ``key``, the row's low three bits);
    unit u + 8 q is 128 q bytes past unit u's, so these four serve every k16 step of S, or
    every pair of n8 tiles of P V, with constant offsets."""
    return (row + 16 * (unit ^ key), row + 16 * ((unit + 2) ^ key),
            row + 16 * ((unit + 4) ^ key), row + 16 * ((unit + 6) ^ key))


def _make_pv(tag, mt, od, swizzle=False):
    """``pv(acc, sm, vaddr, a, tid)`` with ``a`` the 4 MT words of P's A fragments (m16 tile
    u's at 4u): acc += P . V over one 16-key step for the warp's od / 8 n8 tiles of each m16
    tile; ``vaddr`` is this lane's ldmatrix address for the first pair of tiles (each pair is
    16 dims = 32 bytes further). Written out: ``mma`` takes its accumulator offset as a
    compile-time constant, so that the accumulators stay in registers. With ``swizzle``
    (rows whose 16-byte units are XOR'd by the row's low three bits, mma_sync_roles.K_SWIZZLE)
    ``pv(acc, sm, va0, va1, va2, va3, a, tid)``: ``va{m}`` the address of pair m, pair 4 q + m
    128 q bytes further."""
    names = ", ".join(f"a{k}" for k in range(4 * mt))
    addrs = "va0, va1, va2, va3" if swizzle else "vaddr"
    lines = [f"def pv(acc, sm, {addrs}, {names}, tid):"]
    for pair in range(od // 16):
        at = f"va{pair % 4} + {128 * (pair // 4)}" if swizzle else f"vaddr + {32 * pair}"
        lines.append(f"    m0, m1, m2, m3 = ldsm_t(sm, {at}, tid)")
        for u in range(mt):
            a = ", ".join(f"a{4 * u + k}" for k in range(4))
            at = u * (od // 8 * 4) + 8 * pair
            lines += [f"    mma(acc, {at}, {a}, m0, m1, tid)",
                      f"    mma(acc, {at + 4}, {a}, m2, m3, tid)"]
    scope = {"ldsm_t": ptx.ldmatrix_x4_trans, "mma": ptx.mma_m16n8k16(tag)}
    exec("\n".join(lines), scope)  # (generated here, from the lines above: no outside input)
    return cuda.jit(device=True, **INLINE)(scope["pv"])


def make_partition_kernel(*, tag, store, locate, mask_apply, mask_classify, mask_key_range,
                          score_mod, fold_scale, block_m, heads, fp8=None, wide=True,
                          staged=0, key_count=None, k_swizzle=K_SWIZZLE):
    """The kernel for one configuration (factory.py): ``tag`` "bf16" or "f16" (q's type, and
    the tiles' in shared memory), ``store`` fp32 -> ``part_out``, ``block_m`` 16 or 32 query
    rows a block, ``fp8`` the cache's FP8 layout (docs/fp8.md) or None, ``wide`` whether the
    cache starts 16-byte aligned (16-byte copies; else 4-byte ones), ``staged`` (FP8 only)
    the Fs stages FP8 rows are copied into as they are by ``cp.async`` and converted from in
    shared memory (1 or 2; 0: loaded and converted by each warp); ``k_swizzle``: a 16-byte
    aligned 16-bit cache's key stages swizzled, ``K_SWIZZLE``."""
    assert not staged or fp8
    MT, NW, NT, STAGES = geometry(block_m)
    BM = block_m
    OD = D_V // NW  # output dims a warp owns
    LANE_ROWS = 2 * MT  # rows a lane holds: gr + 8 j
    assert MT * OD // 8 * 4 == NACC and STAGE * 32 == WORDS and OD % 16 == 0
    (Q_OFF, K_OFF, P_OFF, MX_OFF, SX_OFF, F_OFF), _ = layout(block_m, fp8, staged)
    X_OFF = P_OFF  # (Xs: S's partial scores, exchanged before any P is written)
    STAGED = bool(staged)
    RS = int(staged)  # Fs stages: the tiles whose raw rows are in flight or waiting
    TWO_K = STAGES == 2 and not STAGED  # two Ks stages, taken in turn
    EARLY = STAGES == 2 or STAGED  # the next tile found before this one's products
    KS_BYTES = 4 * BLOCK_N * ROWW  # a stage
    JIT = (JIT_OPTIONS if SIMULATOR else
           dict(JIT_OPTIONS, launch_bounds=(NT, min_blocks(block_m))))
    H = heads
    key_tiles, next_tile = make_tile_walk(mask_classify, mask_key_range, BLOCK_N, heads,
                                          key_count=key_count)
    first_tiles = make_partition_walk(key_tiles, next_tile)
    score_rows = make_score_rows(make_log2_score(mask_apply, score_mod, fold_scale), heads)
    mma = ptx.mma_m16n8k16(tag)
    SWZ = bool(k_swizzle and wide and not fp8)
    KR = K_ROW if SWZ else ROW_BYTES  # bytes from a key stage's row to the next
    pv = _make_pv(tag, MT, OD, SWZ)
    scale_acc = ptx.acc_scale(NACC) if MT == 1 else ptx.acc_scale_halves(NACC)

    V32 = fp8 == "v32"
    # "e4m3" (one scale for the cache): the codes go into the tiles exactly (e4m3 values are
    # bf16 and fp16 values) and the scale multiplies the scores and the output instead, once
    # each, not rounded into every element. "v32" scales each 128 dims of a row apart: there
    # the scaled values are rounded to the tiles' type.
    FOLD = fp8 == "e4m3"

    pack = ptx.pack_bf16x2 if tag == "bf16" else ptx.pack_f16x2  # two floats, one cvt
    write_p = make_write_p(pack)

    e4m3x4_to_16 = ptx.e4m3x4_to_bf16x4 if tag == "bf16" else ptx.e4m3x4_to_f16x4

    @cuda.jit(device=True, **INLINE)
    def code_pairs(w, sc):
        """The 4 codes of word w as two words of 16-bit pairs of the tiles' type (codes 0, 1
        first), times ``sc`` in "v32" (through float32 and rounded to the tiles' type); in
        "e4m3" exact, with no branch (a branch a word, with its reconvergence, cost more than
        the conversion)."""
        if FOLD:
            return e4m3x4_to_16(w)
        x0, x1, x2, x3 = ptx.e4m3x4_to_f32(w)
        return int32(pack(x0 * sc, x1 * sc)), int32(pack(x2 * sc, x3 * sc))

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
        lo, hi = code_pairs(storage[page, slot, c // 2], sc)
        return hi if c % 2 else lo

    # 16-bit rows into a Ks stage; FP8 rows as they are into Fs
    issue_tile = make_issue(locate, wide, NT, BLOCK_N, K_OFF, KR, 4 * WORDS, SWZ)
    copy_q = make_q_copy(BM, NT, Q_OFF)
    FW = fp8_row_words(fp8) if fp8 else 0  # words of an FP8 row
    issue_raw = make_issue(locate, wide, NT, BLOCK_N, F_OFF, 4 * FW, 4 * FW) if STAGED else None
    FS_BYTES = 4 * BLOCK_N * FW  # an Fs stage
    # a tile ahead: staged FP8 rows into Fs (its ks is 0), else 16-bit rows into a Ks stage
    issue_ahead = issue_raw if STAGED else issue_tile
    CODE_WORDS = D_V // 4 if V32 else WORDS // 2  # words of codes a row (128 or 144)

    NJ = -(-CODE_WORDS // 32)  # words of codes a lane converts in a row (4 or 5)

    @cuda.jit(device=True, **INLINE)
    def convert_tile(words, base, fs, warp, lane):
        """The FP8 rows in the Fs stage at byte ``fs`` into Ks's stage 0 as 16-bit words
        (row_word's values): warp w takes rows w, w + NW, ..., its lanes a word of 4 codes
        each along the row (-> 2 words of Ks, one 8-byte store), then in "v32" a rope word
        each (-> 1 word). A row's NJ words
        (and scales) are all loaded before the first is converted, and all converted before
        the first store: the shared-memory accesses keep their program order, so load,
        conversion and store one word at a time would make each word wait out the chain of
        the word before (NJ chains in flight, not one)."""
        codes = cuda.local.array(NJ, int32)  # a row's words of codes, then their low halves
        his = cuda.local.array(NJ, int32)  # ... and high halves, as 16-bit pairs
        scales = cuda.local.array(NJ, float32)
        for n in range(warp, BLOCK_N, NW):
            src = base + fs + 4 * (F_OFF + n * FW)
            dst = base + 4 * (K_OFF + n * ROWW)
            for j in range(NJ):
                r = min(lane + 32 * j, CODE_WORDS - 1)  # (the last word's lanes past the
                codes[j] = ptx.lds32(words, src + 4 * r)  # row load a real one, store none)
                scales[j] = float32(1.0)
                if V32:  # the scale of the row's group of 128 dims (32 words)
                    scales[j] = ptx.i32_as_f32(ptx.lds32(words, src + 4 * (D_V // 4 + j)))
            rope = ptx.lds32(words, src + 4 * (D_V // 4 + 4 + lane)) if V32 else int32(0)
            for j in range(NJ):
                codes[j], his[j] = code_pairs(codes[j], scales[j])
            for j in range(NJ):
                r = lane + 32 * j
                if CODE_WORDS % 32 == 0 or r < CODE_WORDS:
                    ptx.sts64(words, dst + 8 * r, codes[j], his[j])
            if V32:  # the 32 rope words (bf16 pairs) after the codes and 4 scales
                if tag != "bf16":
                    x0, x1 = ptx.bf16x2_to_f32(rope)
                    rope = pack(x0, x1)
                ptx.sts32(words, dst + 4 * (D_V // 2 + lane), rope)

    @cuda.jit(device=True, **INLINE)
    def copy_tile(words, ks, storage, block_table, b, k0, k1, warp, lane):
        """Keys [k0, k1) of sequence b into the stage at byte ``ks`` of Ks as words, zeros past
        k1 (P is 0 there, but 0 * NaN is NaN): warp w copies keys w, w + NW, ..., its lanes
        along the row (a load reads 128 contiguous bytes; FP8 rows, 64), STAGE loads before
        their stores."""
        for kk in range(BLOCK_N // NW):
            n = NW * kk + warp
            valid = k0 + n < k1
            page, slot = locate(block_table, storage.shape[1], storage.shape[0], b,
                                k0 + n if valid else k0)
            w = cuda.local.array(STAGE, int32)
            for j in range(STAGE):
                w[j] = row_word(storage, page, slot, lane + 32 * j) if valid else 0
            for j in range(STAGE):
                words[K_OFF + ks // 4 + n * ROWW + lane + 32 * j] = w[j]

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
        r0 = cuda.blockIdx.y * BM
        nrows = min(BM, nq * H - r0)
        if nrows <= 0:
            return  # the whole block leaves: no barrier is skipped

        q_lo, q_hi, kstart, kend, t, t_end = first_tiles(length, nq, r0, nrows, p, nparts,
                                                            chunk)
        if t >= t_end and nparts > 1:  # (one partition writes out itself: zeros, below)
            mark_empty(part_lse, row0, r0, nrows, p, H, tid, NT)
            return  # uniform in the block, before any barrier

        copy_q(words, base, q, row0, r0, nrows, H, tid)  # the block's queries into Qs
        acc = cuda.local.array(NACC, float32)  # O: BM rows x this warp's OD dims
        for k in range(NACC):
            acc[k] = float32(0.0)
        s = cuda.local.array(8, float32)  # S: this warp's 16 keys, rows gr and gr + 8 of sm
        s2 = cuda.local.array(16, float32)  # ... its 32 keys' partial scores, over half the dims
        m_run = cuda.local.array(LANE_ROWS, float32)  # running max, sum of rows gr + 8 j (j < 2 MT)
        l_run = cuda.local.array(LANE_ROWS, float32)
        for j in range(LANE_ROWS):
            m_run[j] = float32(NEG_INF)
            l_run[j] = float32(0.0)

        gr, tq = lane // 4, lane % 4
        sm, kg = warp // KEY_GROUPS, warp % KEY_GROUPS  # this warp's m16 tile and keys in S
        kh, dh = kg // 2, kg % 2  # ... its 32 keys and half of the dims before the exchange
        sm_scale, kv_scale = float32(scale.real), float32(scale.imag)
        folded = kv_scale if FOLD else float32(1.0)  # the scale the tiles leave out
        fold = float32(sm_scale * LOG2E)
        # This lane's ldmatrix addresses (bytes). A fragments (Q, P): row l % 8 + 8 (l // 8 % 2)
        # of the m16 tile, 16-bit column 8 (l // 16) of the step. B of S (K, not transposed):
        # key l % 8 + 8 (l // 16) of the warp's first 16 (the next 16 are 16 rows further),
        # column 8 (l // 8 % 2). Q and K from the first dim of the warp's half (HALF_STEPS
        # steps of 32 bytes). B of P V (V, .trans): key l % 8 + 8 (l // 8 % 2) of the step,
        # column 8 (l // 16) of the warp's OD dims. K and V in stage 0 (+ ks for the tile's
        # stage).
        a_row, a_col = lane % 8 + 8 * (lane // 8 % 2), 8 * (lane // 16)
        half_at = 32 * HALF_STEPS * dh
        q_addr = base + 4 * Q_OFF + (16 * sm + a_row) * ROW_BYTES + 2 * a_col + half_at
        p_addr = base + 4 * P_OFF + a_row * P_ROW_BYTES + 2 * a_col
        k_addr = (base + 4 * K_OFF + (32 * kh + lane % 8 + 8 * (lane // 16)) * ROW_BYTES
                  + 2 * 8 * (lane // 8 % 2) + half_at)
        v_addr = base + 4 * K_OFF + a_row * ROW_BYTES + 2 * (a_col + OD * warp)
        # swizzled (SWZ): a K step's unit u at u ^ the row's low bits (lane % 8), from the
        # warp's half's first (ku); V's pair m of n8 tiles at va{m}, pair 4 q + m 128 q further
        k_row = base + 4 * K_OFF + (32 * kh + lane % 8 + 8 * (lane // 16)) * KR
        ku = lane // 8 % 2 + 2 * HALF_STEPS * dh
        va0, va1, va2, va3 = swizzled_units(base + 4 * K_OFF + a_row * KR,
                                            OD // 8 * warp + lane // 16, lane % 8)
        # The partial scores a lane hands over (16 bytes a lane, a warp's 32 lanes side by
        # side: no bank conflict), and where it finds its partner warp's (warp ^ 1)
        x_give = base + 4 * (X_OFF + 32 * HALF_SCORES * warp) + 16 * lane
        x_take = base + 4 * (X_OFF + 32 * HALF_SCORES * (warp ^ 1)) + 16 * lane
        ks = 0  # this tile's stage (bytes from Ks)
        fs = 0  # this tile's Fs stage (bytes from Fs)
        t_next = t_end  # (two Fs stages: the next tile, whose copy is issued a tile ahead)
        if (TWO_K and not fp8 or STAGED) and t < t_end:  # the first tile's copy
            k0 = kstart + t * BLOCK_N
            issue_ahead(words, base, 0, storage, block_table, b, k0, min(k0 + BLOCK_N, kend),
                        tid)
            if RS == 2:  # and the second's, into the other stage (an empty group if none)
                t_next = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi)
                if t_next < t_end:
                    n0 = kstart + t_next * BLOCK_N
                    issue_raw(words, base, FS_BYTES, storage, block_table, b, n0,
                              min(n0 + BLOCK_N, kend), tid)
                else:
                    ptx.cp_async_commit()

        while t < t_end:
            k0 = kstart + t * BLOCK_N
            k1 = min(k0 + BLOCK_N, kend)
            cls = mask_classify(k0, k1, q_lo, q_hi)
            t_after = t_end  # (two Fs stages: the tile after the next, copied in this one)
            if RS == 2:
                if t_next < t_end:
                    t_after = next_tile(t_next + 1, t_end, kstart, kend, q_lo, q_hi)
            elif EARLY:
                t_next = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi)
            else:
                t_next = t + 1  # (one stage: the next tile is found at the end, fewer registers)

            # -- phase 1: the key tile in its stage --
            if STAGES == 1 and not STAGED:
                cuda.syncthreads()  # every warp is done with the previous tile (Ks, Ps, Mx, Sx)
            if STAGED:
                if RS == 2:  # this thread's pieces of the FP8 rows (the next tile's may fly)
                    ptx.cp_async_wait_one()
                else:
                    ptx.cp_async_wait_all()
                cuda.syncthreads()  # everyone's; every warp is done with the previous tile
                convert_tile(words, base, fs, warp, lane)
            elif fp8:
                copy_tile(words, ks, storage, block_table, b, k0, k1, warp, lane)
            else:
                if STAGES == 1:
                    issue_tile(words, base, ks, storage, block_table, b, k0, k1, tid)
                ptx.cp_async_wait_all()  # this thread's pieces; the barrier: everyone's
            # The whole tile (on the first, Qs too); with two stages, also: every warp is done
            # with the previous tile (the other stage, Ps, Mx, Sx); staged, Fs is free again
            cuda.syncthreads()
            if RS == 2:  # the copy of the tile after the next, into this tile's Fs stage
                if t_after < t_end:
                    n0 = kstart + t_after * BLOCK_N
                    issue_raw(words, base, fs, storage, block_table, b, n0,
                              min(n0 + BLOCK_N, kend), tid)
                else:
                    ptx.cp_async_commit()  # (an empty group: one wait_group 1 fits all tiles)
                fs = FS_BYTES - fs
            elif (TWO_K and not fp8 or STAGED) and t_next < t_end:  # the next tile's copy
                n0 = kstart + t_next * BLOCK_N
                issue_ahead(words, base, 0 if STAGED else KS_BYTES - ks, storage, block_table,
                            b, n0, min(n0 + BLOCK_N, kend), tid)

            # -- phase 2: this warp's 16 keys of S, in registers; mask, score mod, maxima --
            # The warps kg and kg ^ 1 score the same 32 keys, each over half the dims (an A
            # fragment of Q then serves four products, not two), and each hands the other its
            # partial scores of the other's 16 keys. Dims in order within a half, so the rope
            # dims (the second half's last steps) are added last, as in one pass.
            for k in range(16):
                s2[k] = float32(0.0)
            for step in range(HALF_STEPS):
                a0, a1, a2, a3 = ptx.ldmatrix_x4(words, q_addr + 32 * step, tid)
                if SWZ:
                    kb = k_row + ks + 16 * ((ku + 2 * step) ^ (lane % 8))
                    b0, b1, b2, b3 = ptx.ldmatrix_x4(words, kb, tid)
                    c0, c1, c2, c3 = ptx.ldmatrix_x4(words, kb + 16 * KR, tid)
                else:
                    b0, b1, b2, b3 = ptx.ldmatrix_x4(words, k_addr + ks + 32 * step, tid)
                    c0, c1, c2, c3 = ptx.ldmatrix_x4(words, k_addr + ks + 16 * ROW_BYTES
                                                     + 32 * step, tid)
                mma(s2, 0, a0, a1, a2, a3, b0, b1, tid)  # keys 32 kh + 0..7
                mma(s2, 4, a0, a1, a2, a3, b2, b3, tid)  # keys 32 kh + 8..15
                mma(s2, 8, a0, a1, a2, a3, c0, c1, tid)  # keys 32 kh + 16..23
                mma(s2, 12, a0, a1, a2, a3, c2, c3, tid)  # keys 32 kh + 24..31
            pass_partials(s, s2, floats, x_give, x_take, dh, 1 + warp // 2)
            score_rows(s, floats, MX_OFF + kg * BM, folded, fold, sm_scale, cls, b, 16 * sm + gr,
                       r0, nrows, length, nq, k0 + 16 * kg, k1, bias, tq, tid)
            cuda.syncthreads()  # every warp's maxima

            # -- phase 3: the new running max (the same in every warp), P, the row sums --
            alpha = cuda.local.array(LANE_ROWS, float32)
            for j in range(LANE_ROWS):  # row gr + 8 j of the block (m16 tile j // 2)
                m_new = m_run[j]
                for u in range(KEY_GROUPS):
                    m_new = max(m_new, floats[MX_OFF + u * BM + gr + 8 * j])
                alpha[j] = math.exp2(m_run[j] - (m_new if m_new != float32(NEG_INF) else
                                                 float32(0.0)))
                m_run[j] = m_new
            for half in range(2):  # this warp's rows of S: 16 sm + gr + 8 half
                i = 16 * sm + gr + 8 * half
                m_ref = m_run[half]
                if MT == 2 and sm == 1:  # (a select: no branch around the shuffles below)
                    m_ref = m_run[2 + half]
                m_ref = m_ref if m_ref != float32(NEG_INF) else float32(0.0)
                row_sum = write_p(s, words, half, m_ref, P_OFF + i * PROWW + 8 * kg, tq, tid)
                if tq == 0:
                    floats[SX_OFF + kg * BM + i] = row_sum
            cuda.syncthreads()  # P and every warp's sums

            # -- phase 4: O = alpha O + P V on this warp's OD dims, 4 steps of 16 keys --
            for j in range(LANE_ROWS):
                i = gr + 8 * j
                tile_sum = float32(0.0)
                for u in range(KEY_GROUPS):
                    tile_sum += floats[SX_OFF + u * BM + i]
                l_run[j] = l_run[j] * alpha[j] + tile_sum
            if MT == 1:
                scale_acc(acc, alpha[0], alpha[1])
                for step in range(BLOCK_N // 16):
                    a0, a1, a2, a3 = ptx.ldmatrix_x4(words, p_addr + 32 * step, tid)
                    if SWZ:
                        o = ks + 16 * KR * step
                        pv(acc, words, va0 + o, va1 + o, va2 + o, va3 + o, a0, a1, a2, a3, tid)
                    else:
                        pv(acc, words, v_addr + ks + 16 * ROW_BYTES * step, a0, a1, a2, a3,
                           tid)
            else:
                scale_acc(acc, alpha[0], alpha[1], alpha[2], alpha[3])
                for step in range(BLOCK_N // 16):
                    a0, a1, a2, a3 = ptx.ldmatrix_x4(words, p_addr + 32 * step, tid)
                    c0, c1, c2, c3 = ptx.ldmatrix_x4(words, p_addr + 16 * P_ROW_BYTES
                                                     + 32 * step, tid)
                    if SWZ:
                        o = ks + 16 * KR * step
                        pv(acc, words, va0 + o, va1 + o, va2 + o, va3 + o, a0, a1, a2, a3, c0,
                           c1, c2, c3, tid)
                    else:
                        pv(acc, words, v_addr + ks + 16 * ROW_BYTES * step, a0, a1, a2, a3,
                           c0, c1, c2, c3, tid)
            if TWO_K:
                ks = KS_BYTES - ks
            if not EARLY:
                t_next = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi)
            t = t_next
            if RS == 2:
                t_next = t_after

        # -- the partition's normalised output and LSE, from registers --
        for j in range(LANE_ROWS):
            i = gr + 8 * j
            if i < nrows:
                t_row, h = row0 + (r0 + i) // H, (r0 + i) % H
                l = l_run[j]
                inv = float32(0.0) if l == 0.0 else folded / l
                at = (j // 2) * (OD // 8 * 4) + 2 * (j % 2)  # n8 tile 0 of its m16 tile
                for n8 in range(OD // 8):
                    d = OD * warp + 8 * n8 + 2 * tq
                    part_out[t_row, h, p, d] = store(acc[at + 4 * n8] * inv)
                    part_out[t_row, h, p, d + 1] = store(acc[at + 4 * n8 + 1] * inv)
                if warp == 0 and tq == 0:
                    part_lse[t_row, h, p] = (float32(NEG_INF) if l == 0.0 else
                                             (m_run[j] + math.log2(l)) * float32(LN2))

    partition_kernel.form = dict(k_swizzle=SWZ)  # (the tests ask which layout ran)
    return partition_kernel
