"""Stage 1 of split-K decode for FP8 "e4m3" caches at 16, 32 or 64 query rows a block, on Hopper
tensor cores with the products turned around: S^T = K Q^T and O^T = V^T P^T.

The lockstep kernel (kernels/mma.py) multiplies 64 query rows a tile, of which 16 are real at
H = 16 (DeepSeek V3 at tensor-parallel 8): three quarters of its tensor work is padding, and
its FP8 rows go through a converted 16-bit tile in shared memory. Here the 64 keys of a tile
are wgmma's M and the 16 query rows its N (m64n16k16), so nothing is padded, and both
products take their A operand from registers (``ptx.wgmma_rs``), converted from the raw codes
where they are read: no 16-bit copy of K or V exists anywhere.

Grid ``(P, G, B)``, block (p, g, b) owns sequence b, query rows ``[Mg, Mg + M)`` (M = 16,
32 or 64 rows a block; row r = query token i * H + head h) and key partition p, as for the
other kernels; 128 threads (one warpgroup; the 64-row block two, 256); the partition's
normalised output and natural-log LSE go to the fp32 workspace, or with one partition to
``out`` and ``lse`` (``store``).

**The 32-row block** (past 16 query rows a sequence: H = 128, or several query tokens)
multiplies m64n32k16: each tile's codes are converted once for 32 rows instead of 16, and
O^T takes 128 accumulators a thread. At 255 registers that is the whole budget, so this block
(``LEAN``): finds each column's 2^-k in ``qexp`` a tile instead of holding it; rescales O^T as
soon as the factors are known; issues S^T's products in groups of two steps (fewer A
registers in flight); loads V's codes at the start of their step, one word a group; and
writes O^T's zeroing, rescale and stores out with constant indices (``ptx.acc_zero``,
``ptx.acc_scale_cols``, ``_make_write_o``: a loop over its eight columns is not unrolled,
and O^T would live in local memory). ``ptx.opaque_i32`` keeps the columns' rows, heads and
positions from being hoisted out of the tile loop into registers held through it. Its
shared memory is two blocks a multiprocessor exactly (``Layout``).

**The 64-row block** (past 32 query rows) is two warpgroups (``TWO``), one block a
multiprocessor: m64n64k16 products, S^T's 36 k-steps dealt two of every four to each
warpgroup (8 bytes of each thread's 16-byte piece of a key), the partial sums added through
``xch``; each warpgroup then owns 32 columns (the 32-row block's softmax and P^T code, its
columns offset by ``cw``) and O^T's 256 dims ``256 wg + 64 w + 8 g ..`` for all 64 columns,
rescaled from factors the owners leave in ``alpha``. Each thread's running max and sums stay
in shared memory between tiles (``state_get``/``state_put``): in registers they spilled.

Shared memory (bytes, 16 rows: 96,832, two blocks a multiprocessor; 32 and 64 rows:
``Layout``, which adds the 64-row block's ``xch``, ``alpha`` and per-thread state):
    Q    36 k-steps x [16 rows x 16 dims] fp16     wgmma's B image (core matrices), dims in the
                                                   order the K fragments take (below)
    raw  [2][64 keys x 576] e4m3 codes             two stages: the next tile is copied by
                                                   cp.async while this one is used
    P    [2][4 k-steps x [16 rows x 16 keys]] fp16 P^T as wgmma's B image, double buffered
    red  [2][4 warps x 16] f32                     per-warp column maxima (then sums)
    qexp [16] int32                                each query row's power-of-two scale

**q in fp16.** wgmma multiplies operands of one type, and an e4m3 code becomes an fp16 value
in one instruction (``cvt.rn.f16x2.e4m3x2``, two codes) where bf16 takes four. So q (bf16 or
fp16) is copied into the Q image as fp16, each row times a power of two 2^k that puts its
largest magnitude in [2^12, 2^15) (fp16 stops at 65504): every bf16 value of the row at least
2^-29 of the largest becomes fp16 exactly (fp16's 11 bits hold bf16's 8), and S's column is
multiplied by 2^-k afterwards, exactly. An fp16 q keeps k = 0. P is fp16 too (11 bits: finer
than bf16's 8).

**S^T = K Q^T** (keys on M): thread (warp w, lane 4g + t) holds A's rows 16w + g and
16w + g + 8, i.e. two keys, and columns 2t, 2t + 1, 2t + 8, 2t + 9 of each k-step. S sums over
the dims, so the dims may be dealt to the k-steps in any order that Q's image follows: k-steps
4J .. 4J + 3 give thread t the 16 dims 64J + 16t .. 64J + 16t + 15, one 16-byte shared load
of each of its two keys' rows (word ``sub`` of the load holds step 4J + sub's four codes).
A row is 576 bytes, 4 banks-groups of 16 bytes past a multiple of 128: the eight lanes of a
load's phase (g = 0, 1; t = 0..3) hit eight different groups, no bank conflict.

**O^T = V^T P^T** (512 dims on M, eight m64 blocks; rows on N; keys on K): thread (w, g, t)
holds A's rows g, g + 8 of each block and K positions 2t, 2t + 1, 2t + 8, 2t + 9 of each
16-key step. A step's keys may sit at its K positions in any order that P^T's rows follow:
``key_of`` swaps the keys of positions 2t and 2t + 1 for odd t, so that the eight lanes of a
V load's phase read rows of both parities (two to a bank group, not four).
O's dims may be dealt to the rows in any order that the output stores follow: block b's rows
16w + g and 16w + g + 8 are dims 128w + 16g + 2b and + 1, so the thread's 16 dims of every key
are one 16-byte load (bytes 128w + 16g of the row), and a word of four codes (dims 4c ..
4c + 3) feeds blocks 2c and 2c + 1. Its two keys of a pair are interleaved by a byte permute
(``prmt``), then converted: a0 = (dim 4c, K positions 2t, 2t + 1: keys key_of(2t),
key_of(2t + 1)), a1 = (dim 4c + 1, same keys), ...
The 16 dims of each of the thread's M / 4 query rows come out contiguous: the output is
written from the accumulators, 16 bytes a store, without a pass through shared memory.

**The softmax** runs down S^T's columns. The running maximum moves only when a row's
maximum over the tile passes it by more than RESCALE_SLACK (log2 units), as in the lockstep
kernel, so a thread first checks its own scores against it, and one ``syncthreads_or`` tells
the block whether any row may move. Only then is each row's maximum found:
the thread's two keys, three shuffles across the lanes g of a warp, the four warps through
``red`` (a barrier); and O^T's columns rescaled. Each thread keeps its share of the row sums
(its keys), added once at the end. The output divides by the sum of P as multiplied (fp16),
the LSE uses the fp32 sum.

Per tile: wait for this tile's codes; barrier (every thread is then done with the other
stage: the next tile's rows are copied into it, and fly during this tile); S^T's 36 steps in
nine groups of four, each group's codes loaded and converted, then its products issued and
committed, then all but that group waited for (``wgmma_wait_pending``: ptxas then reuses the
registers of the groups done, and serialises nothing); the scores (barrier with a vote; the
columns' maxima and a second barrier only when the vote asks); the online softmax and P^T
(barrier); O^T's 32 steps in eight groups of four
products, V's codes loaded a 16-key step ahead; all waited for at the end of the tile. The
32-row block (``LEAN``, above) issues S^T in eighteen groups of two, and O^T in sixteen
groups of two with V's codes a step ahead where that builds without local memory; the
64-row block issues each warpgroup's S^T in nine groups of two, then exchanges the partial
sums (a barrier), and its O^T in eight groups of two.
"""
import math

from numba import cuda, float32, int16, int32, uint64

from .. import ptx
from .._compat import INLINE, JIT_OPTIONS
from .common import (D_QK, D_V, LN2, LOG2E, NEG_INF, make_log2_score, make_partition_walk,
                     make_tile_run, make_tile_walk, mark_empty, prefetch_first_entry)

BLOCK_M = 16  # query rows a block: wgmma's N (16, or 32 or 64: ``BLOCKS``)
BLOCKS = (16, 32, 64)  # the row counts a block may take (``layout``)
BLOCK_N = 64  # keys a tile: wgmma's M
NTHREADS = 128  # one warpgroup (the 64-row block: two, ``Layout.threads``)
ROW_BYTES = D_QK  # a raw "e4m3" row: 576 codes
TILE_BYTES = BLOCK_N * ROW_BYTES  # 36864
ROW_PIECES = ROW_BYTES // 16  # 36
K_STEPS = D_QK // 16  # S^T's k16 steps (36)
LBO, SBO = 128, 256  # B^T [N rows, 16 k] K-major: core matrices of 8 rows x 16 bytes
NBLK = D_V // 64  # O^T's m64 blocks (8)
STAGES = 2
Q_PASS_WORDS = D_QK // 2 // 8  # words of q a thread copies a pass (8 threads a row: 36)
PENDING = 1  # groups of products left in flight behind the one just issued
V_AHEAD = 1  # 16-key steps of V's codes loaded ahead of the one converted
PV_GROUP = 2  # words of V's codes a key (2 m64 blocks each) in one group of products
RESCALE_SLACK = 8.0  # log2 units the running max may lag the true one
Q_SCALE_TOP = 13  # a row's largest |q| times 2^k lands in [2^12, 2^15) (log2 may be 1 off)
Q_EXP_LIMIT = 126  # |k| at most: 2^k and 2^-k are normal float32 values
LO_PAIRS = 0x5140  # prmt: bytes a0 b0 a1 b1 (two keys' codes of dims 0, 1, interleaved)
HI_PAIRS = 0x7362  # prmt: bytes a2 b2 a3 b3


class Layout:
    """Sizes and shared-memory offsets (bytes) of a block of ``block_m`` query rows.

    16 rows: 96,832 bytes, P^T and ``red`` double buffered. 32 rows: P^T and ``red`` once
    (the loop's barriers already keep a tile's writers behind the last tile's readers) and
    ``qexp`` in ``red``'s second half (read in each tile's scores, while the loop uses only
    the first half; the column sums at the end take both, after the last tile's barriers),
    115,712 bytes: two blocks a multiprocessor exactly (233,472 bytes, 1 KB of it reserved a
    block). 64 rows: as 32, plus ``xch`` (S^T's partial sums between the warpgroups, 16 KB),
    ``alpha`` (the columns' rescale factors) and each thread's running max and sums (24 KB):
    198,912 bytes, one block a multiprocessor."""

    def __init__(self, block_m):
        assert block_m in BLOCKS
        self.block_m = block_m
        # 64 rows: two warpgroups, each S^T over half the dims (summed through ``xch``) and
        # O^T over half the output dims; each owns half the columns in the softmax
        self.wgs = 2 if block_m == 64 else 1
        self.threads = NTHREADS * self.wgs
        self.pieces = TILE_BYTES // 16 // self.threads  # 16-byte copies a thread a tile
        self.nacc = block_m // 2  # accumulators of one m64 product a thread
        self.ncol = block_m // 4 // self.wgs  # a thread's own columns (query rows) of S^T
        self.nblk = NBLK // self.wgs  # O^T's m64 blocks a warpgroup
        self.no = self.nblk * self.nacc  # O^T's accumulators a thread
        self.step_bytes = block_m * 16 * 2  # one k-step of a [block_m x 16] fp16 B image
        self.q_passes = block_m * 8 // self.threads  # passes of threads / 8 rows that copy q
        self.q_words = self.q_passes * Q_PASS_WORDS
        self.bufs = 2 if block_m == 16 else 1  # of P^T and ``red`` in the loop
        # O^T's V codes: 16-key steps loaded ahead, words a key in one group of products.
        # The 32-row block groups one word, and loads a step ahead only where that does not
        # spill (``make_partition_kernel``'s ``v_ahead``; the selector builds it first and
        # falls back to 0): a step ahead ran 3.5% faster on the H200 at 64 x 128 x 4096, and
        # spilled 4 bytes with a causal mask and soft cap
        self.v_ahead, self.pv_group = (V_AHEAD, PV_GROUP) if block_m == 16 else (0, 1)
        self.q_off = 0
        self.raw_off = self.q_off + K_STEPS * self.step_bytes
        self.p_off = self.raw_off + STAGES * TILE_BYTES
        self.p_bytes = BLOCK_N // 16 * self.step_bytes
        self.red_off = self.p_off + self.bufs * self.p_bytes
        self.red_bytes = 4 * block_m * 4  # 4 warps x block_m f32
        self.qexp_off = (self.red_off + 2 * self.red_bytes if self.bufs == 2
                         else self.red_off + self.red_bytes)
        end = max(self.red_off + 2 * self.red_bytes, self.qexp_off + block_m * 4)
        # two warpgroups: S^T's partial sums exchanged (each thread's 16 of the other's
        # columns), and the columns' rescale factors for O^T
        self.xch_off = end
        self.xch_bytes = 16 * NTHREADS * 4 * self.wgs if self.wgs > 1 else 0
        self.alpha_off = self.xch_off + self.xch_bytes
        # ... and each thread's running max and sums (m_run, l_run, l_p: 8 floats each) kept
        # here between tiles, not in registers held through the products
        self.state_off = self.alpha_off + (block_m * 4 if self.wgs > 1 else 0)
        self.state_bytes = 3 * 8 * 4 * self.threads if self.wgs > 1 else 0
        self.smem_bytes = self.state_off + self.state_bytes


LAYOUTS = {m: Layout(m) for m in BLOCKS}
SMEM_BYTES = LAYOUTS[BLOCK_M].smem_bytes  # 96832
STEP_BYTES = LAYOUTS[BLOCK_M].step_bytes  # 512


def smem_bytes(block_m):
    """Shared memory of a block of ``block_m`` rows (bytes)."""
    return LAYOUTS[block_m].smem_bytes


def threads(block_m):
    """Threads a block of ``block_m`` rows."""
    return LAYOUTS[block_m].threads


@cuda.jit(device=True, **INLINE)
def q_power(mx):
    """(k, 2^k as float32) for a query row whose largest magnitude is ``mx``: 2^k puts it in
    [2^12, 2^15) (Q_SCALE_TOP), |k| at most Q_EXP_LIMIT; k = 0 for a row of zeros or one
    holding inf or NaN. Used where q's rows are copied into fp16 (the module docstring says
    why this is exact); the seesaw kernel's ``scale_q`` too."""
    k = 0
    if mx > 0.0 and mx < math.inf:
        k = min(max(Q_SCALE_TOP - int32(math.floor(math.log2(mx))), -Q_EXP_LIMIT), Q_EXP_LIMIT)
    return k, ptx.i32_as_f32((k + 127) << 23)


@cuda.jit(device=True, **INLINE)
def acc_column(j, t4):
    """The query row (S^T's and O^T's column) of accumulator column j of the thread whose lane
    % 4 is ``t4``: a m64nNk16 accumulator gives each thread columns 2 t4, 2 t4 + 1 of every 8
    (from a warpgroup's first column: ``cw`` added where there are two)."""
    return 8 * (j // 2) + 2 * t4 + j % 2


def _q_image_byte(c, d, step_bytes=STEP_BYTES):
    """Byte offset in the Q image of query row ``c``'s dims ``d``, ``d + 1`` (d even): k-step
    4J + sub, logical column 8 hi + 2t (+ 1) of the K fragments' order (module docstring);
    ``step_bytes``: a k-step's (the block's rows x 32)."""
    J, t, sub, hi = d >> 6, (d >> 4) & 3, (d >> 2) & 3, (d >> 1) & 1
    return ((4 * J + sub) * step_bytes + (c >> 3) * SBO + hi * LBO + (c & 7) * 16 + 4 * t)


def make_q_image_byte(step_bytes):
    """``_q_image_byte`` for one block size, as a device function (plain arithmetic: the
    simulator runs it too)."""
    image_byte = cuda.jit(device=True)(_q_image_byte)

    @cuda.jit(device=True)
    def q_image_byte(c, d):
        return image_byte(c, d, step_bytes)

    return q_image_byte


@cuda.jit(device=True)
def key_of(p):
    """The key (of a 16-key step) at K position ``p`` of O^T's products, and P^T's row of it:
    positions 2t and 2t + 1 swap their keys for odd t (an involution). Thread t's V loads of
    position 2t then read keys 0, 3, 4, 7 for t = 0..3: rows of both parities, whose 576-byte
    strides put them 64 bytes apart in the banks, so a load's eight lanes of a phase meet two
    to a bank group where in key order all four t met there (4-way conflicts)."""
    return p ^ ((p >> 1) & 1)


def _make_pv_tile(lay, v_ahead):
    """``pv_tile(o, s, sm, va, vb, dp, tid)`` for the block of ``lay`` (a Layout): O^T +=
    V^T P^T over the tile's four 16-key steps, V's codes read from the raw stage at ``va``
    and ``vb`` (this thread's keys of K positions 2t and 2t + 1, ``key_of``; bytes
    128w + 16g of the row), P^T's B image at descriptor ``dp``. Step k's codes are the
    thread's four keys' (K positions 2t, 2t + 1, 2t + 8, 2t + 9 of the step: a, b, c, d) dims
    128w + 16g .. + 15, four words each (the 64-row block: dims 256wg + 64w + 8g .. + 7, two
    words, its warpgroup's four m64 blocks), loaded ``v_ahead`` steps ahead of their
    conversion (0: at its start); ``lay.pv_group`` words of each key (2 m64 blocks each) make
    one group of products, issued once converted, and at most PENDING groups stay in flight
    behind it. Written out: each block's product names its accumulators by a constant
    offset, so that all of O^T stays in registers."""
    steps = BLOCK_N // 16
    wpk = lay.nblk // 2  # words of V's codes a key: 4 (16 bytes), the 64-row block's 2
    load = [", ".join(x + "{0}" + str(c) for c in range(wpk)) + f" = lds(sm, {v} + {{{o}}})"
            for x, v, o in (("a", "va", 1), ("b", "vb", 1), ("c", "va", 2), ("d", "vb", 2))]
    lines = ["def pv_tile(o, s, sm, va, vb, dp, tid):"]

    def loads(k):
        base = 16 * k * ROW_BYTES
        return ["    " + x.format(k, base, base + 8 * ROW_BYTES) for x in load]

    pv_group = lay.pv_group
    for k in range(v_ahead):
        lines += loads(k)
    for k in range(steps):
        if k + v_ahead < steps:
            lines += loads(k + v_ahead)
        d = f"desc_advance(dp, {lay.step_bytes * k})"
        for c0 in range(0, wpk, pv_group):
            group = range(c0, c0 + pv_group)
            for c in group:
                w = f"{k}{c}"
                lines += [f"    l01 = lo(a{w}, b{w})", f"    l89 = lo(c{w}, d{w})",
                          f"    h01 = hi(a{w}, b{w})", f"    h89 = hi(c{w}, d{w})",
                          f"    f{c}0, f{c}1 = cvt(l01)", f"    f{c}2, f{c}3 = cvt(l89)",
                          f"    g{c}0, g{c}1 = cvt(h01)", f"    g{c}2, g{c}3 = cvt(h89)"]
            lines.append("    fence()")
            for c in group:
                lines += [f"    m{2 * c}(o, f{c}0, f{c}1, f{c}2, f{c}3, sm, {d}, 1, tid)",
                          f"    m{2 * c + 1}(o, g{c}0, g{c}1, g{c}2, g{c}3, sm, {d}, 1, tid)"]
            lines += ["    commit()", "    wait_pending(o, s)"]
    scope = {f"m{b}": ptx.wgmma_rs(lay.block_m, "f16", False, lay.nacc * b)
             for b in range(lay.nblk)}
    scope.update(lo=ptx.byte_perm(LO_PAIRS), hi=ptx.byte_perm(HI_PAIRS),
                 lds=ptx.lds128 if wpk == 4 else ptx.lds64,
                 cvt=ptx.e4m3x4_to_f16x4, fence=ptx.wgmma_fence, commit=ptx.wgmma_commit,
                 desc_advance=ptx.desc_advance,
                 wait_pending=ptx.wgmma_wait_pending(lay.no, lay.nacc, PENDING))
    exec("\n".join(lines), scope)  # (generated here, from the lines above: no outside input)
    return cuda.jit(device=True, **INLINE)(scope["pv_tile"])


def _make_write_o(lay, store):
    """``write_o(o, part_out, rows, heads, oks, p, d0, x4)``: the thread's O^T columns (already
    divided by their sums) to ``part_out[rows[j], heads[j], p, d0 ..]`` (16 dims; the 64-row
    block's 8) for each
    column j with ``oks[j]`` (16 bytes a store where ``x4``), written out so that every index
    into ``o`` is a constant (a loop over the 32-row block's eight columns is not unrolled,
    and ``o`` would then live in local memory). Column j's dims d0 + 4qd .. + 3 are elements
    NACC (2qd) + i0, + 2, NACC (2qd + 1) + i0, + 2 (i0 = 4 (j // 2) + j % 2)."""
    lines = ["def write_o(o, part_out, rows, heads, oks, p, d0, x4):"]
    for j in range(lay.block_m // 4):  # (the columns of a product a thread)
        i0 = 4 * (j // 2) + j % 2
        lines += [f"    if oks[{j}]:", f"        t_row = rows[{j}]", f"        h = heads[{j}]"]
        for qd in range(lay.nblk // 2):
            e = [lay.nacc * 2 * qd + i0, lay.nacc * 2 * qd + i0 + 2,
                 lay.nacc * (2 * qd + 1) + i0, lay.nacc * (2 * qd + 1) + i0 + 2]
            lines += [f"        d = d0 + uint64({4 * qd})", "        if x4:",
                      "            st_global_x4(part_out, t_row, h, p, d, "
                      + ", ".join(f"store(o[{x}])" for x in e) + ")", "        else:"]
            lines += [f"            part_out[t_row, h, p, d + uint64({k})] = store(o[{x}])"
                      for k, x in enumerate(e)]
    scope = dict(st_global_x4=ptx.st_global_x4, store=store, uint64=uint64)
    exec("\n".join(lines), scope)  # (generated here, from the lines above: no outside input)
    return cuda.jit(device=True, **INLINE)(scope["write_o"])


def make_partition_kernel(*, tag, locate, mask_apply, mask_classify, mask_key_range, score_mod,
                          fold_scale, heads, store, key_count=None, block_m=BLOCK_M,
                          v_ahead=None):
    """The kernel for one configuration (factory.py): ``tag`` "bf16" or "f16" (q's type),
    ``store`` fp32 -> ``part_out``; the cache holds "e4m3" rows, 16-byte aligned;
    ``block_m`` query rows a block (``BLOCKS``); ``v_ahead``: O^T's V codes loaded this many
    16-key steps ahead (None: the block's ``Layout``)."""
    H = heads
    lay = LAYOUTS[block_m]
    BLOCK_M, NCOL, NACC, NO, STEP_BYTES = block_m, lay.ncol, lay.nacc, lay.no, lay.step_bytes
    THREADS, PIECES, OCOL = lay.threads, lay.pieces, block_m // 4
    ROWS_PASS = THREADS // 8  # q rows a pass of load_q
    # The 64-row block: two warpgroups (``Layout``); S^T's partial sums meet in ``xch``
    TWO = lay.wgs == 2
    XCH_OFF, ALPHA_OFF, STATE_OFF = lay.xch_off, lay.alpha_off, lay.state_off
    Q4 = 16 * THREADS  # bytes between a state array's two quads (``state_get``)
    Q_OFF, RAW_OFF, P_OFF, P_BYTES = lay.q_off, lay.raw_off, lay.p_off, lay.p_bytes
    RED_OFF, RED_BYTES, QEXP_OFF, BUFS = lay.red_off, lay.red_bytes, lay.qexp_off, lay.bufs
    Q_PASSES, Q_WORDS = lay.q_passes, lay.q_words
    # The 32-row block holds 128 of O^T's accumulators a thread: it reads each column's 2^-k
    # from ``qexp`` a tile, and rescales O^T as soon as the factors are known, so that
    # neither stays live through the scores or P^T (at 255 registers, ptxas spilled the
    # causal and chunked masks' scores without this).
    LEAN = block_m > 16
    q_image_byte = make_q_image_byte(STEP_BYTES)
    zero_o = ptx.acc_zero(NO)
    write_o = _make_write_o(lay, store)

    @cuda.jit(device=True, **INLINE)
    def state_get(smf, at, arr):
        """The thread's 8 floats of one state array at ``at`` (two 16-byte quads, Q4 apart:
        a warp's loads conflict-free) into ``arr``."""
        for q in range(2):
            v = ptx.lds128(smf, at + Q4 * q)
            for k in range(4):
                arr[4 * q + k] = v[k]

    @cuda.jit(device=True, **INLINE)
    def state_put(smf, at, arr):
        for q in range(2):
            ptx.sts128(smf, at + Q4 * q, arr[4 * q], arr[4 * q + 1], arr[4 * q + 2],
                       arr[4 * q + 3])
    scale_cols = ptx.acc_scale_cols(NO, NACC)
    mma_s = ptx.wgmma_rs(BLOCK_M, "f16", False)
    wait_all = ptx.wgmma_wait2(NACC, NO)
    wait_pending = ptx.wgmma_wait_pending(NACC, NO, PENDING)
    desc = ptx.wgmma_desc(LBO, SBO)
    unpack = ptx.bf16x2_to_f32 if tag == "bf16" else ptx.f16x2_to_f32
    pv_tile = _make_pv_tile(lay, lay.v_ahead if v_ahead is None else v_ahead)
    log2_score = make_log2_score(mask_apply, score_mod, fold_scale)
    key_tiles, next_tile = make_tile_walk(mask_classify, mask_key_range, BLOCK_N, heads,
                                          key_count=key_count)
    first_tiles = make_partition_walk(key_tiles, next_tile)
    tile_run = make_tile_run(locate)
    SCALE_Q = tag == "bf16"

    @cuda.jit(device=True)
    def issue_tile(smk, dst, storage, block_table, page_size, npages, b, k0, k1, tid):
        """Start copying the rows of keys [k0, k1) as they are into the raw stage at ``dst``
        (zeros past k1), and commit them as one group. Piece j (16 bytes) of the tile is
        thread j % THREADS's: one page's run of slots is one contiguous block of bytes in the
        cache and in the stage, so a warp's copy reads and writes 512 contiguous bytes;
        elsewhere each piece's row is looked up."""
        page, slot, run = tile_run(block_table, page_size, npages, b, k0, k1)
        nbytes = (k1 - k0) * ROW_BYTES
        if run and nbytes == TILE_BYTES:  # a whole tile in one page: no test a piece
            src = ptx.global_addr(storage, page, slot, 0) + 16 * tid
            for m in range(PIECES):
                ptx.cp_async16_at(smk, dst + 16 * tid + 16 * THREADS * m,
                                  src + 16 * THREADS * m, True)
        elif run:
            src = ptx.global_addr(storage, page, slot, 0)
            for m in range(PIECES):
                j = tid + THREADS * m
                ok = 16 * j < nbytes
                ptx.cp_async16_at(smk, dst + 16 * j, src + 16 * j if ok else src, ok)
        else:
            for m in range(PIECES):
                j = tid + THREADS * m
                n, piece = ptx.divmod_u32(j, ROW_PIECES)
                ok = n < k1 - k0
                pg, sl = locate(block_table, page_size, npages, b, k0 + min(n, k1 - k0 - 1))
                ptx.cp_async16_at(smk, dst + 16 * j,
                                  ptx.global_addr(storage, pg, sl, 0) + 16 * piece, ok)
        ptx.cp_async_commit()

    @cuda.jit(device=True)
    def fetch_q(q, words, row0, r0, nrows, tid):
        """This thread's words of the block's query rows into ``words`` (all the loads out
        before any is used; ``load_q`` uses them): in pass z (THREADS / 8 rows each), row
        ROWS_PASS z + t // 8 (rows past ``nrows`` repeat the last), words t % 8 + 8m
        (m = 0..35)."""
        u = tid % 8
        for z in range(Q_PASSES):
            r = r0 + min(tid // 8 + ROWS_PASS * z, nrows - 1)
            rq = uint64(row0 + r // H)  # (unsigned indices: no test for negative ones)
            hq = uint64(r % H)
            for m in range(Q_PASS_WORDS):
                words[Q_PASS_WORDS * z + m] = q[rq, hq, uint64(u + 8 * m)]

    @cuda.jit(device=True)
    def load_q(words, smk, sb, nrows, tid):
        """The block's query rows (``fetch_q``'s words) into the Q image, each times its power
        of two (rows past ``nrows`` zero), the exponents to ``qexp``. In pass z thread t holds
        row c = ROWS_PASS z + t // 8's words t % 8 + 8m (m = 0..35): dims 2 (t % 8) + 16m,
        whose place in the image is the thread's first plus (m // 4) * 4 k-steps + (m % 4) * 4
        (q_image_byte), and the row's eight threads find its largest magnitude by three
        shuffles."""
        u = tid % 8
        for z in range(Q_PASSES):
            c = tid // 8 + ROWS_PASS * z
            k = 0
            f = float32(1.0)
            if SCALE_Q:
                mx = float32(0.0)
                for m in range(Q_PASS_WORDS):
                    x0, x1 = unpack(words[Q_PASS_WORDS * z + m])
                    mx = max(mx, max(abs(x0), abs(x1)))
                for o in (1, 2, 4):
                    mx = max(mx, ptx.shfl_xor(mx, o, tid))
                k, f = q_power(mx)
            if u == 0:
                smk[uint64(QEXP_OFF // 4 + c)] = k
            at = sb + Q_OFF + q_image_byte(c, 2 * u)
            for m in range(Q_PASS_WORDS):
                w = words[Q_PASS_WORDS * z + m]
                if SCALE_Q:
                    x0, x1 = unpack(w)
                    w = ptx.pack_f16x2(x0 * f, x1 * f)
                ptx.sts32(smk, at + (m // 4) * 4 * STEP_BYTES + (m % 4) * 4,
                          w if c < nrows else 0)
        ptx.fence_proxy_async()  # (a barrier follows: the image is then visible to wgmma)

    @cuda.jit(**JIT_OPTIONS)
    def partition_kernel(q, q_offsets, storage, block_table, lengths, bias, scale, chunk,
                         part_out, part_lse, tmap_q, tmap_kv):
        # q [T, H, 288] int32 words of 16-bit pairs; storage [pages, page_size, 144] int32
        # words of four codes; scale: softmax scale + 1j * kv_scale. (tmap_*: unused.)
        p = cuda.blockIdx.x
        nparts = cuda.gridDim.x
        b = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        # (two warpgroups: wg, and the warp within it; one: wg 0)
        # (warp_uniform: the descriptors that depend on it are then uniform, not spilled)
        wg = ptx.warp_uniform(tid // NTHREADS, tid) if TWO else 0
        warp, lane = ((tid // 32) % 4 if TWO else tid // 32), tid % 32
        cw = 32 * wg  # the first of the thread's own columns (two warpgroups: its half)
        g, t4 = lane // 4, lane % 4
        smk = cuda.shared.array(0, int32)
        smf = cuda.shared.array(0, float32)
        sm16 = cuda.shared.array(0, int16)
        sb = ptx.smem_addr(smk)

        page_size = storage.shape[1]
        if tid == 0:  # (the first tile's page-table entry into L2, under the loads below)
            prefetch_first_entry(block_table, b, p, chunk, BLOCK_N, page_size)

        row0 = q_offsets[b]
        nq = q_offsets[b + 1] - row0
        length = lengths[b]
        npages = storage.shape[0]
        r0 = cuda.blockIdx.y * BLOCK_M
        nrows = min(BLOCK_M, nq * H - r0)
        if nrows <= 0:
            return
        q_lo, q_hi, kstart, kend, t, t_end = first_tiles(length, nq, r0, nrows, p, nparts,
                                                         chunk)
        if t >= t_end and nparts > 1:  # (one partition writes out itself: zeros, below)
            mark_empty(part_lse, row0, r0, nrows, p, H, tid, THREADS)
            return
        # q's loads go out first, then the first tile's copies (its page-table entry is in L2
        # by now), whose rows fly while Q is converted
        words = cuda.local.array(Q_WORDS, int32)
        fetch_q(q, words, row0, r0, nrows, tid)
        if t < t_end:
            k0 = kstart + t * BLOCK_N
            issue_tile(smk, sb + RAW_OFF, storage, block_table, page_size, npages, b, k0,
                       min(k0 + BLOCK_N, kend), tid)
        load_q(words, smk, sb, nrows, tid)
        # The image and the exponents are in place.
        cuda.syncthreads()

        sm_scale, kv_scale = float32(scale.real), float32(scale.imag)
        qscale = float32(sm_scale * LOG2E)
        # This thread's NCOL query rows (S^T's and O^T's columns): c = cw + acc_column(j, t4)
        colf = cuda.local.array(NCOL, float32)  # 2^-k of each
        m_run = cuda.local.array(NCOL, float32)  # running max, log2 units
        l_run = cuda.local.array(NCOL, float32)  # this thread's share of the sum (fp32)
        l_p = cuda.local.array(NCOL, float32)  # ... of P as multiplied (fp16)
        alpha = cuda.local.array(NCOL, float32)
        mx = cuda.local.array(NCOL, float32)
        for j in range(NCOL):
            c = cw + acc_column(j, t4)
            if not LEAN:
                colf[j] = ptx.i32_as_f32((127 - smk[uint64(QEXP_OFF // 4 + c)]) << 23)
            m_run[j] = float32(NEG_INF)
            l_run[j] = float32(0.0)
            l_p[j] = float32(0.0)
        st_m = sb + STATE_OFF + 16 * tid  # (two warpgroups: the state between tiles)
        st_l, st_p = st_m + 2 * Q4, st_m + 4 * Q4
        if TWO:
            state_put(smf, st_m, m_run)
            state_put(smf, st_l, l_run)
            state_put(smf, st_p, l_p)
        s_acc = cuda.local.array(NACC, float32)
        o_acc = cuda.local.array(NO, float32)
        if LEAN:
            zero_o(o_acc)
        else:
            for i in range(NO):
                o_acc[i] = float32(0.0)
        dq = desc(sb + Q_OFF)
        # the thread's K loads: rows 16w + g, + 8 of the tile, 16 bytes at 16t (+ 64J); two
        # warpgroups: 8 bytes at 16t + 8wg (k-steps 4J + 2wg, + 1)
        k_lo = (16 * warp + g) * ROW_BYTES + 16 * t4 + 8 * wg
        # its V loads: the keys of K positions 2t, 2t + 1 (+ 8) of each 16-key step (key_of),
        # 16 bytes at 128w + 16g; two warpgroups: 8 bytes at 256wg + 64w + 8g
        v_dims = 256 * wg + 64 * warp + 8 * g if TWO else 128 * warp + 16 * g
        v_a = key_of(2 * t4) * ROW_BYTES + v_dims
        v_b = key_of(2 * t4 + 1) * ROW_BYTES + v_dims
        # its P^T stores: k-step w, keys g (+ 8) at K positions key_of(g) (+ 8), rows
        # cw + 2t (+ 1, + 8, + 9)
        p_at = P_OFF + STEP_BYTES * warp + 32 * t4 + 2 * key_of(g) + (cw >> 3) * SBO

        stage = 0
        it = 0
        while t < t_end:
            k0 = kstart + t * BLOCK_N
            k1 = min(k0 + BLOCK_N, kend)
            if not LEAN:
                cls = mask_classify(k0, k1, q_lo, q_hi)
            raw = sb + RAW_OFF + stage * TILE_BYTES
            ptx.cp_async_wait_all()  # this tile's rows
            # Every thread's pieces of them (the first time, Q too) are in place; every thread
            # is done with the other stage (the last tile's) and the last tile's P^T.
            cuda.syncthreads()
            t_next = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi)
            if t_next < t_end:  # the next tile's rows fly during this one
                k0n = kstart + t_next * BLOCK_N
                issue_tile(smk, sb + RAW_OFF + (1 - stage) * TILE_BYTES, storage, block_table,
                           page_size, npages, b, k0n, min(k0n + BLOCK_N, kend), tid)

            # -- S^T = K Q^T: 36 steps, four a 16-byte load of each of the thread's two keys --
            for J in range(K_STEPS // 4):
                # (The next group's codes loaded here, under this group's products, gave wrong
                # scores on the H200 in 9 of 11 mask x score-mod cases, never in the
                # simulator: they are loaded at the top of each group.)
                if TWO:  # (8 bytes: this warpgroup's two k-steps of the four)
                    lo2 = ptx.lds64(smk, raw + k_lo + 64 * J)
                    hi2 = ptx.lds64(smk, raw + k_lo + 8 * ROW_BYTES + 64 * J)
                    wa, wb, xa, xb = lo2[0], hi2[0], lo2[1], hi2[1]
                else:
                    lo = ptx.lds128(smk, raw + k_lo + 64 * J)
                    hi = ptx.lds128(smk, raw + k_lo + 8 * ROW_BYTES + 64 * J)
                    wa, wb, xa, xb = lo[0], hi[0], lo[1], hi[1]
                a0, a2 = ptx.e4m3x4_to_f16x4(wa)
                a1, a3 = ptx.e4m3x4_to_f16x4(wb)
                b0, b2 = ptx.e4m3x4_to_f16x4(xa)
                b1, b3 = ptx.e4m3x4_to_f16x4(xb)
                # (a product's A registers are defined before its group opens: a conversion
                # inside an open group makes ptxas serialise every wgmma; and a wait for the
                # groups before frees their registers for the next one's)
                step = ptx.desc_advance(dq, 4 * STEP_BYTES * J)
                if TWO:  # this warpgroup's k-steps 4J + 2wg, + 1 (from its address, as
                    # mma.py's descriptors: a uniform value, not one held per step)
                    step = desc(sb + Q_OFF + STEP_BYTES * (4 * J + 2 * wg))
                if LEAN:  # two groups of two steps: fewer registers in flight
                    ptx.wgmma_fence()
                    mma_s(s_acc, a0, a1, a2, a3, smk, step, J, tid)
                    mma_s(s_acc, b0, b1, b2, b3, smk, ptx.desc_advance(step, STEP_BYTES), 1,
                          tid)
                    ptx.wgmma_commit()
                    wait_pending(s_acc, o_acc)
                if TWO:
                    continue
                c0, c2 = ptx.e4m3x4_to_f16x4(lo[2])
                c1, c3 = ptx.e4m3x4_to_f16x4(hi[2])
                d0, d2 = ptx.e4m3x4_to_f16x4(lo[3])
                d1, d3 = ptx.e4m3x4_to_f16x4(hi[3])
                ptx.wgmma_fence()
                if not LEAN:  # one group of four
                    mma_s(s_acc, a0, a1, a2, a3, smk, step, J, tid)
                    mma_s(s_acc, b0, b1, b2, b3, smk, ptx.desc_advance(step, STEP_BYTES), 1,
                          tid)
                mma_s(s_acc, c0, c1, c2, c3, smk, ptx.desc_advance(step, 2 * STEP_BYTES), 1,
                      tid)
                mma_s(s_acc, d0, d1, d2, d3, smk, ptx.desc_advance(step, 3 * STEP_BYTES), 1,
                      tid)
                ptx.wgmma_commit()
                wait_pending(s_acc, o_acc)
            wait_all(s_acc, o_acc)  # (this tile's S^T)
            if TWO:
                # Each warpgroup summed half the dims: a thread hands its partial sums of the
                # other half's columns (accumulators 16 (1 - wg) ..) to the other warpgroup's
                # thread of its place, and adds that thread's of its own columns, which it
                # then holds in s_acc[0 .. 15] (the loop below reads no more).
                xo = uint64(XCH_OFF // 4 + (1 - wg) * 16 * NTHREADS + tid % NTHREADS)
                for i in range(16):
                    smf[xo + uint64(NTHREADS * i)] = s_acc[i] if wg == 1 else s_acc[16 + i]
                # Every thread's partial sums are in place.
                cuda.syncthreads()
                xi = uint64(XCH_OFF // 4 + wg * 16 * NTHREADS + tid % NTHREADS)
                for i in range(16):
                    mine = s_acc[16 + i] if wg == 1 else s_acc[i]
                    s_acc[i] = mine + smf[xi + uint64(NTHREADS * i)]

            # -- scores (mask, score mod: log2 units); does any pass its row's running max
            # by more than RESCALE_SLACK? (A NaN score drops out of ``max`` here, as it did
            # from the maxima before: its P is NaN and makes the row NaN all the same.) --
            need = False
            # (LEAN: the columns' rows, heads and positions found here each tile, not hoisted
            # out of the loop into eight columns' registers held through it)
            rt = ptx.opaque_i32(r0) if LEAN else r0
            if LEAN:
                cls = mask_classify(k0, k1, q_lo, q_hi)
            if TWO:
                state_get(smf, st_m, m_run)
            for j in range(NCOL):
                c = cw + acc_column(j, t4)
                r = rt + c
                iq = r // H
                h = r - iq * H
                q_pos = length - nq + iq
                m = float32(NEG_INF)
                for e in range(2):
                    i = 4 * (j // 2) + j % 2 + 2 * e
                    k = k0 + 16 * warp + g + 8 * e
                    s = float32(NEG_INF)
                    if c < nrows and k < k1:
                        f = (ptx.i32_as_f32((127 - smk[uint64(QEXP_OFF // 4 + c)]) << 23)
                             if LEAN else colf[j])
                        s = log2_score(s_acc[i] * f * kv_scale, qscale, sm_scale, cls, b, h,
                                       iq, q_pos, k, bias)
                    s_acc[i] = s
                    m = max(m, s)
                if not LEAN:  # (LEAN: found again from S^T where the exchange needs it)
                    mx[j] = m
                need = need or not (m <= m_run[j] + float32(RESCALE_SLACK))
            # Only then are the columns' maxima over the tile needed (the first tile, a jump):
            # every thread holding a column holds the same m_run of it, so where no score
            # passes it the maxima could not move it, and the block skips their exchange
            # (shuffles, ``red``, a barrier, the rescale), with the same result bit for bit.
            moved = False
            exch = False
            for j in range(NCOL):
                alpha[j] = float32(1.0)
            if cuda.syncthreads_or(int32(need)):
                exch = True
                if TWO:
                    state_get(smf, st_l, l_run)
                    state_get(smf, st_p, l_p)
                for j in range(NCOL):
                    i = 4 * (j // 2) + j % 2
                    m = max(s_acc[i], s_acc[i + 2]) if LEAN else mx[j]
                    for o in (4, 8, 16):  # the lanes g of the warp: its 16 keys
                        m = max(m, ptx.shfl_xor(m, o, tid))
                    mx[j] = m
                red = RED_OFF + (it % BUFS) * RED_BYTES
                if g == 0:
                    for j in range(NCOL):
                        smf[uint64(red // 4 + BLOCK_M * warp + cw + acc_column(j, t4))] = mx[j]
                # The four warps' maxima are in place.
                cuda.syncthreads()
                for j in range(NCOL):
                    c = cw + acc_column(j, t4)
                    m_old = m_run[j]
                    m_new = m_old
                    for w in range(4):
                        m_new = max(m_new, smf[uint64(red // 4 + BLOCK_M * w + c)])
                    if not (m_new <= m_old + float32(RESCALE_SLACK)):
                        m_run[j] = m_new
                    m_ref = m_run[j] if m_run[j] != float32(NEG_INF) else float32(0.0)
                    alpha[j] = ptx.exp2_ftz(m_old - m_ref)
                    moved = moved or alpha[j] != float32(1.0)
                    l_run[j] *= alpha[j]
                    l_p[j] *= alpha[j]
                if TWO:  # (O^T holds every column: both warpgroups rescale, below)
                    state_put(smf, st_m, m_run)
                    state_put(smf, st_l, l_run)
                    state_put(smf, st_p, l_p)
                    if warp == 0 and g == 0:
                        for j in range(NCOL):
                            smf[uint64(ALPHA_OFF // 4 + cw + acc_column(j, t4))] = alpha[j]
                elif LEAN and moved:
                    scale_cols(o_acc, alpha)
            # -- online softmax down the columns; P^T (fp16) as wgmma's B image --
            p16 = uint64(p_at // 2) + uint64((it % BUFS) * (P_BYTES // 2))  # (16-bit elements)
            if TWO:
                state_get(smf, st_l, l_run)
                state_get(smf, st_p, l_p)
            for j in range(NCOL):
                m_ref = m_run[j] if m_run[j] != float32(NEG_INF) else float32(0.0)
                for e in range(2):
                    i = 4 * (j // 2) + j % 2 + 2 * e
                    pr = ptx.exp2_ftz(s_acc[i] - m_ref)
                    h16 = ptx.f32_to_f16(pr)
                    l_run[j] += pr
                    l_p[j] += ptx.f16_to_f32(h16)
                    # key 16w + g + 8e: k-step w, position key_of(g) + 8e; row c = 8 (j // 2)
                    # + 2t + j % 2 (a constant past the tile's base: one store, no arithmetic)
                    sm16[p16 + uint64(((j // 2) * SBO + e * LBO + (j % 2) * 16) // 2)] = h16
            if TWO:
                state_put(smf, st_l, l_run)
                state_put(smf, st_p, l_p)
            if not LEAN and moved:
                for blk in range(NBLK):
                    for i in range(NACC):
                        o_acc[NACC * blk + i] *= alpha[(i // 4) * 2 + i % 2]
            ptx.fence_proxy_async()
            # P^T is complete (two warpgroups: and the columns' rescale factors).
            cuda.syncthreads()
            if TWO and exch:
                alpha_o = cuda.local.array(OCOL, float32)
                for n in range(OCOL):
                    alpha_o[n] = smf[uint64(ALPHA_OFF // 4 + acc_column(n, t4))]
                scale_cols(o_acc, alpha_o)

            # -- O^T += V^T P^T: four 16-key steps of eight m64 blocks, not waited for --
            pv_tile(o_acc, s_acc, smk, raw + v_a, raw + v_b,
                    desc(sb + P_OFF + (it % BUFS) * P_BYTES), tid)
            wait_all(s_acc, o_acc)
            stage = 1 - stage
            it += 1
            t = t_next

        # -- the column sums: lanes g, then the four warps (``red``: free since the last
        # tile's second barrier; with one buffer, the 32-row block, its second half holds
        # ``qexp``, read in each tile's scores, before that tile's barriers. Where no tile
        # ran nothing read it, and the barrier below is not needed: written for a one-buffer
        # block that reads ``qexp`` before the loop, harmless here (block-uniform)) --
        if BUFS == 1 and it == 0:
            cuda.syncthreads()
        if TWO:
            state_get(smf, st_m, m_run)
            state_get(smf, st_l, l_run)
            state_get(smf, st_p, l_p)
        for j in range(NCOL):
            a = l_run[j]
            bsum = l_p[j]
            for o in (4, 8, 16):
                a += ptx.shfl_xor(a, o, tid)
                bsum += ptx.shfl_xor(bsum, o, tid)
            l_run[j] = a
            l_p[j] = bsum
        if g == 0:
            for j in range(NCOL):
                c = cw + acc_column(j, t4)
                smf[uint64(RED_OFF // 4 + BLOCK_M * warp + c)] = l_run[j]
                smf[uint64((RED_OFF + RED_BYTES) // 4 + BLOCK_M * warp + c)] = l_p[j]
        cuda.syncthreads()
        if LEAN:  # (read again past the barrier: not a register held through the loop)
            row0 = q_offsets[b]
        x4 = ptx.aligned_x4(part_out)
        if TWO:  # the LSE of the warpgroup's own columns (O^T holds all 64, below)
            for j in range(NCOL):
                c = cw + acc_column(j, t4)
                if c < nrows and warp == 0 and g == 0:
                    lsum = float32(0.0)
                    for w in range(4):
                        lsum += smf[uint64(RED_OFF // 4 + BLOCK_M * w + c)]
                    r = uint64(r0 + c)
                    part_lse[uint64(row0) + r // uint64(H), r % uint64(H), p] = (
                        float32(NEG_INF) if lsum == 0.0
                        else (m_run[j] + math.log2(lsum)) * float32(LN2))
        if LEAN:  # (every index into o_acc a constant: ``write_o``)
            inv_c = cuda.local.array(OCOL, float32)
            rows = cuda.local.array(OCOL, uint64)
            heads_c = cuda.local.array(OCOL, uint64)
            oks = cuda.local.array(OCOL, int32)
        for j in range(OCOL):  # (the thread's columns of O^T: two warpgroups, all 16)
            c = acc_column(j, t4)
            if LEAN:
                inv_c[j] = float32(0.0)
                oks[j] = int32(c < nrows)
            if c < nrows:
                lsum = float32(0.0)
                psum = float32(0.0)
                for w in range(4):
                    lsum += smf[uint64(RED_OFF // 4 + BLOCK_M * w + c)]
                    psum += smf[uint64((RED_OFF + RED_BYTES) // 4 + BLOCK_M * w + c)]
                empty = lsum == 0.0
                inv = float32(0.0) if empty else kv_scale * ptx.rcp(psum)
                r = uint64(r0 + c)
                t_row = uint64(row0) + r // uint64(H)
                h = r % uint64(H)
                if warp == 0 and g == 0 and not TWO:
                    part_lse[t_row, h, p] = (float32(NEG_INF) if empty
                                             else (m_run[j] + math.log2(lsum)) * float32(LN2))
                if LEAN:
                    inv_c[j] = inv
                    rows[j] = t_row
                    heads_c[j] = h
                    continue
                # dims 128w + 16g + 2 blk + half: element NACC blk + 4 (j // 2) + 2 half + j % 2
                i0 = 4 * (j // 2) + j % 2
                d0 = 128 * warp + 16 * g
                for qd in range(4):
                    y0 = o_acc[NACC * (2 * qd) + i0] * inv
                    y1 = o_acc[NACC * (2 * qd) + i0 + 2] * inv
                    y2 = o_acc[NACC * (2 * qd + 1) + i0] * inv
                    y3 = o_acc[NACC * (2 * qd + 1) + i0 + 2] * inv
                    d = uint64(d0 + 4 * qd)
                    if x4:
                        ptx.st_global_x4(part_out, t_row, h, uint64(p), d, store(y0),
                                         store(y1), store(y2), store(y3))
                    else:
                        part_out[t_row, h, p, d] = store(y0)
                        part_out[t_row, h, p, d + 1] = store(y1)
                        part_out[t_row, h, p, d + 2] = store(y2)
                        part_out[t_row, h, p, d + 3] = store(y3)
        if LEAN:
            scale_cols(o_acc, inv_c)
            write_o(o_acc, part_out, rows, heads_c, oks, uint64(p),
                    uint64(256 * wg + 64 * warp + 8 * g if TWO else 128 * warp + 16 * g), x4)

    return partition_kernel
