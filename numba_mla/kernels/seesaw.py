"""Stage 1 of split-K MLA decode on Hopper tensor cores, for tiles the copy engine brings (TMA):
the two warpgroups take key tiles in turn ("seesaw"), so one's softmax runs while the other's
products keep the tensor cores busy.

Same contract as kernels/mma.py (grid ``(P, G, B)``, 64 query rows a block, 64-key tiles,
normalised partition output and natural-log LSE, or out and lse themselves with one
partition); used where a 64-key tile aligned to 64 keys lies in one page.

The block's tiles are taken in pairs (t0, t1): warpgroup 0 computes S0 = Q K0^T, warpgroup 1
S1 = Q K1^T, each over all 64 keys (36 wgmma m64n64k16). Warpgroup w owns output dims
[256w, 256w + 256) of O. Per pair:

  WG0: softmax of S0 against the running max m (shared memory) -> m0, P0, scale0;
       O0 *= scale0; P0 -> shared memory; publish m0, scale0, P0          (barrier SCALE0)
       O0 += P0 V0[:, :256]   (A from registers: P0's fragment is wgmma's A layout)
       refill K0's boxes 0-3 with the next pair's t0
       wait for m1, scale1, P1 (SCALE1); O0 *= scale1; O0 += P1 V1[:, :256]
       refill K1's boxes 0-3 and 8; S0 of the next pair
  WG1: mask and score mod on S1; wait for m0, scale0, P0 (SCALE0)
       O1 *= scale0; O1 += P0 V0[:, 256:]   (in flight during the softmax below)
       softmax of S1 against m0 -> m1, P1, scale1; P1 -> shared memory;
       publish m1, scale1, P1                                            (barrier SCALE1)
       refill K0's boxes 4-8; O1 *= scale1; O1 += P1 V1[:, 256:]
       refill K1's boxes 4-7; S1 of the next pair
so both warpgroups end a pair with O against m1 (from LAG_HEADS heads the reference max m
lags, so scale0 and scale1 are mostly 1 and the rescales of O are skipped). P of a tile is
kept in the tile's own rope box (box 8, dims 512-575): S is its only reader, and it is done
by then.

Shared memory (bytes):
    Q    [64 rows x 576]     9 boxes of 64 rows x 64 values, 128-byte swizzled (as TMA writes)
    K0   [64 keys x 576]     tiles t0 (buffer 0) and t1 (buffer 1), same layout; V = boxes 0-7
    K1   [64 keys x 576]
    stat [7][64] f32         m, scale0, scale1, then the two warpgroups' row sums of P and of
                             P as rounded to 16 bits, at the end
    bars                     one mbarrier for Q, one per box of each buffer (18)
Each box has its own mbarrier, so a product starts on the boxes that have landed while the
others are on their way; the warpgroup computing S on a buffer announces each box's bytes
just before waiting for it (the copy may have landed already: the phase completes on both).

"e4m3" rows (``fp8="e4m3"``): no room is left for a raw stage, so a tile's codes (9 boxes of
64 keys x 64 codes) land by TMA inside its own buffer, where the tile before is freed first
(``raw_at``: buffer 0's codes of boxes 0-3 in the top half of boxes 0-3, copied by WG0 where
it refilled boxes 0-3, those of boxes 4-8 at the buffer's end, copied by WG1 where it
refilled boxes 4-8, or with ``STAGE8`` those of boxes 4-5 in a staging area past the
block's other data, copied by WG0 at the top of the pair; buffer 1's in boxes 0-3 and half
the rope box, copied by WG0 where it refilled boxes 0-3 and 8), and the thread that copies
announces the bytes. The warpgroup
that computes S on the tile converts it in place to fp16 a box at a time (``qk8``, in
``convert_order``), issuing each box's products under the next box's conversion; products
are fp16, q is copied into fp16 under a power of two a row (``scale_q``), the scores are
multiplied by kv_scale 2^-k and the output by kv_scale (docs/kernels/mma.md).
"""
import math

from numba import cuda, float32, int32, uint64

from .. import ptx
from .._compat import INLINE, JIT_OPTIONS, SIMULATOR
from ..mods import FULL, PARTIAL
from .combine import WRITTEN
from .common import (D_V, LN2, LOG2E, NEG_INF, make_log2_score, make_tile_walk, mark_empty,
                     partition_tiles, prefetch_first_entry)
from .transposed import q_power
from .mma import (BLOCK_M, BLOCK_N, BOX, BOX_BYTES, NBOX, NTHREADS, O_BYTES, O_PITCH,
                  RESCALE_SLACK, ROWS_BYTES, make_write_rows)

NS = BLOCK_N // 2  # score accumulators per thread: m64n64 (32)
DIMS_PER_WG = D_V // 2  # output dims of one warpgroup: wgmma N (256)
NO = DIMS_PER_WG // 2  # output accumulators per thread (128)
V_BOXES = DIMS_PER_WG // BOX  # boxes of V a warpgroup reads (4)
ROPE = NBOX - 1  # the rope box (dims 512-575): K only; holds P once S is done
Q_OFF = 0
KV_OFF = ROWS_BYTES
STAT_OFF = KV_OFF + 2 * ROWS_BYTES
assert O_BYTES <= STAT_OFF - KV_OFF  # the output is staged over the two buffers
# rows of ``stat`` (64 floats each); STAT_L and STAT_LP are two rows each (a warpgroup's)
STAT_M, STAT_SCALE0, STAT_SCALE1, STAT_L, STAT_LP = 0, 1, 2, 3, 5
BAR_OFF = STAT_OFF + 7 * BLOCK_M * 4
SMEM_BYTES = BAR_OFF + 8 * (1 + 2 * NBOX)  # 223128
# The runs form (``runs``): the row of the block's next item with work (int32), which thread 0
# finds at the start of each item's walk and the block reads after it, then that item's
# ``load_first`` arguments (its queries' row, sequence and first pair's keys), which thread 0
# reads back to start its copies
NEXT_OFF = SMEM_BYTES
SMEM_BYTES_RUNS = NEXT_OFF + 24
# From this many heads a block's 64 rows are one query token's heads (compute-bound decode):
# there the reference max lags (RESCALE_SLACK) and the tiles are copied with L2's evict-first
# policy. Measured on the H200 (docs/kernels/mma.md): 2-5% less time at H = 128; at H = 16,
# where the block reads bytes more than it multiplies, 2% more for the lag, 1.5-5% for the
# policy.
LAG_HEADS = 64
# The runs form (``runs``): True, each item's output from the registers to the workspace, and
# the next item's copies started under it (``walk``); False, staged through shared memory as
# the grid kernel's, the next item's copies after it. On an H100 the staged output took
# 0.98-0.99x the time at 16 x 128 x 32768 (188293c, one round), 0.99-1.01x for whole
# sequences at 64 x 128 x 4096 and 0.97-0.98x at 128 x 128 x 1024 (36851e5, two rounds; the
# registers' 8-byte stores wait on the memory pipe: docs/performance.md)
RUNS_AHEAD = False
# The runs form, output staged (not ``RUNS_AHEAD``): True, thread 0 starts the next item's
# queries into Q as soon as both warpgroups are past their last product (Q is no longer read:
# the staged output lies over the two buffers), so they land under this item's output and only
# the first pair's tiles are copied at the next item's start. On an H100 (9518058, two
# rounds): 0.97-0.98x the time where a block walks two whole sequences (128 x 128 x 1024),
# within 1% where it walks pieces of cut ones (docs/performance.md)
RUNS_Q_EARLY = True
# At a block's entry thread 0 starts bringing in what its first copies wait for: the two tensor
# maps (``prefetch.tensormap``) and, in the grid kernel, the page-table entry of its first
# tile (guessed as partition p's first tile at p * chunk tiles from key 0, as the transposed
# kernel does: right for masks that keep the first keys, a line lost otherwise) into L2. On
# an H100 at 286ac9d: 0-1.2% less time on the default sweep (docs/kernels/mma.md).
ENTRY_PREFETCH = True
# From LAG_HEADS heads (where a block's time is its pair loop's), two shorter paths from S to
# P, measured on an H100 (docs/kernels/mma.md, "A pair's time, phase by phase"). ROWS_AHEAD:
# the page-table rows of a pair's refills looked up at the top of the pair before, so that
# their loads have long landed where ptxas moves the rows into uniform registers for the copies
# (with the lookups in their own pair, in the middle of warpgroup 0's softmax). EXP2_FTZ: the
# softmax's 2^x as ``ex2.approx.ftz``, one MUFU instruction where ``math.exp2`` scales its
# argument and result around it for results below 2^-126; such a P becomes 0, and against the
# row's largest P over its tiles (at least 1) it is below fp32's resolution of their sum.
# Below LAG_HEADS both cost registers (causal builds at 2, 16 and 33 heads spilled).
ROWS_AHEAD = True
EXP2_FTZ = True
# Both on "e4m3" rows too: 240 registers at 128 heads, no spill; on an H100 at 720a06d, 0.980
# and 0.982 of the time at 64x128x4096 and 128x128x1024 "e4m3" (H = 16 unchanged). Not with
# the converter warpgroup, whose math warpgroups' 168 registers spilled 32 bytes with them.
E4M3_TOO = True
# The partition kernel as the programmatic dependent of the kernel before it in the stream
# (launch.py launches it with programmatic stream serialization; FlashMLA launches its decode
# kernel so): the driver may launch it before that kernel has completed, and its first
# instruction (``griddepcontrol.wait``) waits for that grid to complete and its writes to be
# visible, so nothing is read early; what it saves is the launch's latency behind the kernel
# before (2.6-7.3 us of FlashMLA's time on an H100 at 2a38f6e, scripts/probe_timing_fence.py).
# Not with the converter warpgroup (launched by Numba's path; factory.py decides). On an H100
# at 3d94055 it saved 0.8-1.8 us a call behind another kernel (plain launches unchanged); the
# selector takes the plain build where this one spills (selector._seesaw_fit). The GPU test
# that failed with it on (64 heads, a window and ALiBi) fails with it off too: that build
# spills with the rows carried (ROWS_AHEAD) either way, and the selector now takes the form
# without them, with which it passes (the GPU suite on an H100 at d3d9a19, FOLLOWS on: that
# test alone failed; at 5876af3 the form without carried rows, 242 registers, ran it).
FOLLOWS = True
# Named barriers (0 is the block barrier): handoffs between the warpgroups (256 threads: one
# arrives, the other waits), and one within each warpgroup (128: BAR_WG + wg).
BAR_SCALE0, BAR_SCALE1, BAR_WG = 1, 2, 3
# Warpgroup 1 stores its tile's row maxima (into its row-sum row of ``stat``, free until the
# walk's end) before it waits at SCALE0. ptxas otherwise moves the scores' bounds and the
# maxima's reduction (about 130 instructions and two shuffles a row) behind that barrier, onto
# the path from SCALE0 to SCALE1; a shared-memory store must stay in front of it, and with it
# everything it stores. An experiment (off): to be timed.
MAX_EARLY1 = False
# S over a 16-bit tile's nine boxes written out box by box (the box a constant in each), not as
# a loop: in the loop's SASS each box took 54 instructions for its four wgmma (64-bit counters,
# each descriptor and each step's accumulate flag recomputed from the box index), some 490 a
# warp a tile, a third of all the kernel executes; written out, 266. On an H100 (two rounds,
# plots/ab_s_unroll_a72016d_h100.json): 0.959-0.966x the time at 64 x 128 x 4096, 128 x 128 x
# 1024 and 16 x 128 x 32768, 0.995x at 1 x 128 x 65536. On since fbcf440; False is the loop.
S_UNROLL = True
# The same for "e4m3" rows (``qk8``, not the converter's ``qk_conv``): each box's read of its
# codes, S over the box before, and its conversion written out (each box a constant), each
# descriptor a 32-bit add. In the loop's SASS a box took about 105 instructions, some 30 of
# them the conversion's own. On an H100 (two rounds, plots/ab_s8_flags_59c4400_h100.json):
# 0.991x / 0.989x the time of "e4m3" rows at 64 x 128 x 4096 / 128 x 128 x 1024. On since
# it was timed; False is the loop.
S8_UNROLL = True
# With S8_UNROLL: a tile's boxes converted two at a time (0-1, 2-3, 4-5, 6-7, then 8 alone;
# qk8_pair): both boxes' codes read once landed, one barrier of the warpgroup, S over the
# two boxes before, both written, one proxy fence. Five fences a tile where there were nine
# (six barriers for ten); no pair waits for both of buffer 0's refills (boxes 0-3 are
# refilled early, 4-8 late). Each fence is a MEMBAR.ALL.CTA in the SASS, which waits for the
# thread's stores, and the fences cost about 8 us of the 40 that the conversion adds at
# 64 x 128 x 4096 (docs/fp8.md). The price: a pair's S waits for the later box's codes, and
# a thread holds two boxes' codes. Built and tested; not yet timed, so off.
S8_PAIRS = False
# qk8 reads each box's codes 16 bytes a thread a load (two loads a box where there were four
# of 8 bytes), four threads a key, and writes each key's two 16-byte chunks of values from
# them. Two fewer shared loads a box a thread, 18 a tile, on rows bound by their conversion's
# issue. Built and tested; not yet timed, so off.
CODES_WIDE = False
# "e4m3" rows: the codes of buffer 0's boxes 4 and 5 (the first of its late refill, issued by
# warpgroup 1 once it is past the tile before's P0 V0, at about SCALE1) copied instead into
# 8 KB of shared memory that 16-bit rows leave unused, by warpgroup 0 as soon as it has read
# the tile before's (at the top of the pair whose end converts that tile, well before the
# late refill); warpgroup 1 arrives on an mbarrier where it issued that
# refill, and warpgroup 0 waits on it before writing box 4's values. So the conversion of
# boxes 4 and 5 starts when their place is free rather than a copy's latency later (the
# wait for boxes to land is the largest stall in qk8's loops: docs/fp8.md). Built and
# tested; not yet timed, so off.
STAGE8 = False
# The next three take True (every row type), False, or "e4m3" ("e4m3" rows only): timed in
# the same runs, each of them lost or tied on 16-bit rows and the three together gained on
# "e4m3" rows, which are bound by their conversion's issue (docs/kernels/mma.md, "Four more
# cuts"). A tile whose 64 keys are all in range (every tile but a partial one at the end of
# the keys) and a row that is in the block take the scores without a bound per element: in
# the SASS each element's bound was a compare and a select (64 instructions a thread a tile
# of the scores' ~140). A partial tile keeps them, and so does a tile the mask keeps only in
# part. Only with a boolean mask and no score mod (the factory's ``fold_scale``): with a soft
# cap the second copy of the scores spilled 160 bytes. 16-bit rows: 0.999-1.005x.
WHOLE_TILES = "e4m3"
# With a boolean mask and no score mod (the factory's ``fold_scale``) and a scale > 0 (a
# uniform branch: the kernel keeps the other form for scale <= 0), the scores stay raw
# products: their row maxima are taken raw and scaled once a row (with a positive factor the
# maximum of the scaled scores is the scaled maximum, bit for bit), and the factor goes into
# the exponent's subtraction as a fused multiply-add, P = exp2(s * f - m). That saves the
# multiply an element (two for "e4m3" rows, whose factor has each row's power of two too).
# 16-bit rows: 1.012-1.022x the time at 64 x 128 x 4096 and 16 x 128 x 32768, a loss; on
# "e4m3" rows too (turned off alone: 0.970-0.997x on an H100, docs/kernels/mma.md). Off.
EXP_FOLD = False
# The softmax packs P into 16-bit pairs once and keeps each word in the register of the pair's
# first float (``ptx.i32_as_f32``; P is finite and >= 0, never a NaN's pattern), where
# ``store_p`` and ``pv_local`` packed it again (16 conversions a thread a tile; with ``lag``
# the softmax had packed it already, to sum P as P V multiplies it). 16-bit rows from
# LAG_HEADS heads only (with "e4m3" rows, and at 16 heads causal, ptxas serialised the
# wgmma). On an H100: 0.994-0.996x at 64 x 128 x 4096, 128 x 128 x 1024 and 16 x 128 x 32768
# (0.970x at 1 x 128 x 65536); a small gain, kept.
PACK_P = True
# The refills' page-table rows (``pair_after``: a division by the page size, the table's and
# the clamps' loads and compares, some 85 instructions a pair, on the uniform datapath, but
# each an issue slot of every warp) looked up only by each warpgroup's first warp, whose
# thread 0 issues the copies; the other three warps take the tiles' indices alone. 16-bit
# rows: 1.001-1.007x (0.964x at 1 x 128 x 65536); "e4m3" rows took 1.006-1.025x the time
# without it (an H100, docs/kernels/mma.md).
ROWS_LEAD = "e4m3"


def wgmma_count(s_unroll, s8_unroll=False, fp8=None, converter=False):
    """The wgmma a seesaw build's code holds (its PTX and its SASS alike; the build checks
    count them): four S sites, two a warpgroup, and four P V sites of 4. An S site over
    16-bit rows takes 36 written out (``s_unroll``), else 4 in a loop over the boxes; over
    "e4m3" rows 36 written out (``s8_unroll``), else 8 (the loop and the last box after it);
    with the converter warpgroup 4."""
    if converter:
        site = 4
    elif fp8:
        site = 36 if s8_unroll else 8
    else:
        site = 36 if s_unroll else 4
    return 4 * site + 16


def for_rows(flag, fp8):
    """Whether a flag of the three above that takes True, False or "e4m3" acts on rows of
    ``fp8`` (None: 16-bit)."""
    return flag is True or (flag == "e4m3" and fp8 == "e4m3")


# -- "e4m3" rows (``fp8="e4m3"``): a tile's codes land inside its own 16-bit buffer --
RAW_BOX = BLOCK_N * BOX  # a box of codes: 64 keys x 64 codes, rows of 64 bytes (4096 bytes)
RAW_EARLY = V_BOXES * BOX_BYTES - V_BOXES * RAW_BOX  # buffer 0's codes of boxes 0-3 (16384)
RAW_LATE = ROWS_BYTES - (NBOX - V_BOXES) * RAW_BOX  # ... and of boxes 4-8 (53248)
CONVERT_UNITS = RAW_BOX // 8 // 128  # 8-code pieces of a box a thread converts (4)
CODE_WORDS = 2 * CONVERT_UNITS  # ... as int32 words of four codes
QEXP_OFF = SMEM_BYTES  # each query row's power of two (int32), "e4m3" rows only
SMEM_BYTES_E4M3 = QEXP_OFF + 4 * BLOCK_M  # 223384
# With STAGE8: buffer 0's late boxes 4 and 5 land in a staging area of their own, and an
# mbarrier tells warpgroup 0 that their values' place is free (warpgroup 1 is past P0 V0)
FREE0_OFF = SMEM_BYTES_E4M3
STAGE_OFF = (FREE0_OFF + 8 + 127) // 128 * 128  # 223488
STAGE_BOXES = 2
SMEM_BYTES_STAGE = STAGE_OFF + STAGE_BOXES * RAW_BOX  # 231680 (of the 232448 a block may take)

# -- "e4m3" rows with a converter warpgroup (``converter=True``): warpgroup 2 converts every
# tile in place, as its codes land, and announces each box; the two others only multiply --
CONV_THREADS = NTHREADS + 128  # 384
# Registers a thread after ``setmaxnreg`` (launched at 168: 65,536 over 384 threads, in steps
# of 8): the math warpgroups' code needs 232 to build without a spill (whole-program ptxas,
# null mask, 128 heads), the converter's few.
MATH_REGS, CONVERTER_REGS = 232, 40
# setmaxnreg moves registers within the block's own pool, what it was launched with (3 x 168
# a thread of a warpgroup): asking for more leaves .inc waiting for ever (232 / 48 hung on
# the H200). launch.py refuses a build launched with fewer (``launch_registers``).
LAUNCH_REGS = 65536 // CONV_THREADS // 8 * 8  # 168
assert 2 * MATH_REGS + CONVERTER_REGS <= 3 * LAUNCH_REGS
# Boxes the converter takes at a time: one barrier and one proxy fence a group. 1: builds
# without a spill (measured on the H200: docs/kernels/mma.md); 3 (a third of the
# barriers and fences) spills 4 bytes at 40 registers and is not yet measured
CONV_GROUP = 1
assert NBOX % CONV_GROUP == 0
CONV_CODE_WORDS = CONV_GROUP * CODE_WORDS  # a converter thread's codes of a group
CONV_BAR_OFF = SMEM_BYTES_E4M3  # one mbarrier a box of each buffer: "converted"
SMEM_BYTES_CONV = CONV_BAR_OFF + 8 * 2 * NBOX  # 223528
BAR_CONV = BAR_WG + 2  # the converter warpgroup's own (128)
BAR_MATH = BAR_WG + 3  # the math warpgroups' block barrier once the converter has left (256)
BAR_FREE1 = BAR_WG + 4  # warpgroup 1 arrives when done with buffer 1, the converter waits (256)


def threads(converter=False):
    """Threads a block: two warpgroups, or three with the converter."""
    return CONV_THREADS if converter else NTHREADS


def smem_bytes_e4m3(converter, stage8):
    """A block's shared memory on "e4m3" rows: with the converter warpgroup, with the
    staging area (a build's ``stage8``: ``STAGE8``), or neither."""
    if converter:
        return SMEM_BYTES_CONV
    return SMEM_BYTES_STAGE if stage8 else SMEM_BYTES_E4M3


def raw_at(buf, box):
    """Byte offset in buffer ``buf`` of box ``box``'s codes ("e4m3" rows). Each lands in a
    part of the buffer that the tile before has freed when it is copied: buffer 0's codes of
    boxes 0-3 in the top half of boxes 0-3 (copied by warpgroup 0 once its P0 V0 is done,
    while warpgroup 1 still multiplies by boxes 4-7), those of boxes 4-8 at the buffer's end
    (copied by warpgroup 1 once it is done with the tile, while warpgroup 0 may already
    convert boxes 0-3); buffer 1's in boxes 0-3 and the first half of the rope box (copied by
    warpgroup 0 once it is done, while warpgroup 1 still multiplies by boxes 4-7)."""
    if buf == 0:
        return (RAW_EARLY + RAW_BOX * box if box < V_BOXES
                else RAW_LATE + RAW_BOX * (box - V_BOXES))
    return RAW_BOX * box if box < ROPE else BOX_BYTES * ROPE


def convert_order(buf, n):
    """The box converted n-th in buffer ``buf`` ("e4m3" rows): an order in which a box's
    16-bit values overwrite only codes already converted, or (boxes 8 of buffer 0, 0 and 8
    of buffer 1) its own, read before anything is written (``qk8``): buffer 0 in order;
    buffer 1 boxes 4-7, then 3, 2, 1, 0 down over their codes, then the rope box, last as in
    every order (``qk``)."""
    if buf == 0 or n == ROPE:
        return n
    return V_BOXES + n if n < V_BOXES else 2 * V_BOXES - 1 - n


def takes_short_path(heads, fp8=None, converter=False):
    """Whether a build for ``heads`` (and "e4m3" rows, the converter warpgroup) takes the
    short path from S to P (``EXP2_FTZ``, ``ROWS_AHEAD``): from LAG_HEADS heads, on 16-bit
    rows and, where ``E4M3_TOO``, on "e4m3" rows without the converter."""
    return heads >= LAG_HEADS and (fp8 is None or (E4M3_TOO and not converter))


def carries_rows(heads, fp8=None, converter=False):
    """Whether such a build looks up the rows of a pair's refills a pair early and carries
    them (``ROWS_AHEAD``), unless it is built with ``rows_ahead=False``."""
    return ROWS_AHEAD and takes_short_path(heads, fp8, converter)


def make_partition_kernel(*, tag, locate, mask_apply, mask_classify, mask_key_range, score_mod,
                          fold_scale, heads, store, key_count=None, listed=False, fp8=None,
                          converter=False, runs=False, ahead=False, direct=False,
                          q_early=False, mixed=False, out_store=None, follows=False,
                          rows_ahead=True, max_early1=False, s_unroll=True,
                          s8_unroll=False, whole_tiles=False, exp_fold=False, pack_p=False,
                          rows_lead=False, s8_pairs=False, codes_wide=False, stage8=False):
    """The stage-1 tensor-core kernel for TMA tiles; arguments as for kernels/mma.py.
    ``listed``: the grid is ``(N, 1, 1)`` and ``chunk`` is the listed schedule's int32 [N, 4]
    table (heuristics.list_blocks): block w runs sequence ``chunk[w, 0]``, row group
    ``chunk[w, 1]``, piece ``chunk[w, 2]`` of ``chunk[w, 3]`` (an even cut of its tiles), and
    writes the workspace. ``fp8="e4m3"``: the cache holds "e4m3" rows (``tag`` is q's type,
    ``scale`` the softmax scale + 1j * kv_scale), multiplied in fp16; ``converter``: with
    them, a third warpgroup converts each tile (384 threads; the kernel must then be built
    as a whole program, for ``setmaxnreg``: the dispatcher's ``whole_program``). ``runs``:
    the grid is the runs schedule's blocks and ``chunk`` its table (heuristics.run_schedule:
    each block walks a run of items, which may cross sequences), writing the workspace
    (16-bit rows only); ``ahead``: with it, each item's output goes from the registers to the
    workspace and the next item's copies start under it (``walk``); ``direct``: with
    ``runs``, a table whose every item is a whole sequence (one partition:
    heuristics.runs_partitions), the items write out and lse themselves (``store`` then
    converts to the output's type), and an item of a sequence without a tile is walked (its
    zeros and -inf written) rather than passed over; ``q_early``: with ``runs`` and not
    ``ahead``, the next item's queries are copied under this one's staged output; ``mixed``:
    with ``runs`` and neither ``direct`` nor ``ahead``, an item that is a whole sequence (slot
    0, to its last tile) writes ``out`` and ``lse`` itself (``out_store`` converts to the
    output's type; the kernel takes them after the workspace, as ``[T, H, 1, 512]`` and ``[T,
    H, 1]``) and puts combine.WRITTEN in its partition 0's LSE, which the combine's ``skips``
    variant reads as "written out"; the other items write the workspace. ``follows``: the
    kernel waits first for the grid before it in the stream (``FOLLOWS``; launch.py launches
    it as that grid's programmatic dependent). ``rows_ahead=False``: the rows of each pair's
    refills looked up in their own pair even where ``carries_rows`` (the selector's form
    where the other spills). ``max_early1``: warpgroup 1 stores its tile maxima before its
    wait at SCALE0 (``MAX_EARLY1``). ``s_unroll``: S over a 16-bit tile's boxes written out,
    not looped (``S_UNROLL``); ``s8_unroll``: the same for "e4m3" rows, conversions included
    (``S8_UNROLL``); ``whole_tiles``: a tile with all its keys takes its scores without their
    bounds (``WHOLE_TILES``); ``exp_fold``: with ``fold_scale``, the scale goes into the
    exponent where it is positive (``EXP_FOLD``); ``pack_p``: the softmax leaves P packed
    (``PACK_P``); ``rows_lead``: only each warpgroup's first warp looks up the refills' rows
    (``ROWS_LEAD``); ``s8_pairs``: with ``s8_unroll``, a tile's boxes converted two at a time
    (``S8_PAIRS``); ``codes_wide``: ``qk8`` reads the codes 16 bytes a load (``CODES_WIDE``);
    ``stage8``: buffer 0's boxes 4 and 5 staged ahead of the late refill (``STAGE8``)."""
    assert fp8 in (None, "e4m3"), fp8
    assert not s8_unroll or (fp8 and not converter), "s8_unroll: e4m3 rows' qk8 only"
    assert not s8_pairs or s8_unroll, "s8_pairs: with s8_unroll only"
    assert not (runs and (fp8 or listed)), "the runs schedule takes 16-bit rows, no list"
    PAIRS8 = s8_pairs and s8_unroll
    WIDE8 = bool(codes_wide and fp8 and not converter)
    STAGED = bool(stage8 and fp8 and not converter)
    assert not PAIRS8 or NBOX == 9, "qk8's pairs: boxes 0-1, 2-3, 4-5, 6-7, then 8 alone"
    QK8_WORDS = CODE_WORDS * (2 if PAIRS8 else 1)  # (a thread's codes: one box, or two)
    AHEAD = runs and ahead
    DIRECT = runs and direct
    QEARLY = runs and q_early and not ahead
    MIXED = runs and mixed and not direct
    assert not (MIXED and ahead), "the mixed runs stage their output"
    assert not (fp8 and listed), "the listed schedule takes 16-bit rows"
    assert fp8 or not converter, "the converter warpgroup converts 'e4m3' rows"
    assert not runs or NTHREADS & (NTHREADS - 1) == 0, "the runs form masks the thread index"
    FP8 = fp8 is not None
    CONV = converter
    SCALE_Q = FP8 and tag == "bf16"  # q's rows into fp16, each times its power of two
    H = heads
    lag = heads >= LAG_HEADS
    # (with "e4m3" rows, and below LAG_HEADS heads, ptxas serialised the wgmma for want of
    # registers: causal fp16 at 16 heads)
    PACKED = pack_p and not FP8 and lag
    EXP_RAW = exp_fold and fold_scale  # (the scores raw where the scale is > 0)
    # (with a score mod, the scores' second copy spilled: 160 bytes causal with a soft cap)
    WHOLE = whole_tiles and fold_scale
    short_path = takes_short_path(heads, fp8, converter)  # EXP2_FTZ, ROWS_AHEAD
    exp2 = ptx.exp2_ftz if EXP2_FTZ and short_path else math.exp2
    rows_ahead = rows_ahead and carries_rows(heads, fp8, converter)
    if FP8:
        tag = "f16"  # the products' type: codes become fp16 in one instruction
    mma_s = ptx.wgmma(BLOCK_N, tag, False)
    mma_pv = ptx.wgmma(DIMS_PER_WG, tag, True)
    mma_pv_rs = ptx.wgmma_rs(DIMS_PER_WG, tag, True)
    wait_s = ptx.wgmma_wait(NS)
    wait_o = ptx.wgmma_wait(NO)
    desc_rows = ptx.wgmma_desc(16, 1024, True)  # Q, K, P: K-major; 8-row atoms 1 KB apart
    desc_v = ptx.wgmma_desc(BOX_BYTES, 1024, True)  # V: MN-major; 64 dims a box, 8 keys 1 KB
    pack = ptx.pack_bf16x2 if tag == "bf16" else ptx.pack_f16x2
    unpack = ptx.bf16x2_to_f32 if tag == "bf16" else ptx.f16x2_to_f32
    zero_o = ptx.acc_zero(NO)
    scale_o = ptx.acc_scale(NO)
    store_o = ptx.acc_store(NO)
    write_rows = make_write_rows(store, heads)
    write_out = make_write_rows(out_store, heads) if MIXED else write_rows
    log2_score = make_log2_score(mask_apply, score_mod, fold_scale)
    key_tiles, next_tile = make_tile_walk(mask_classify, mask_key_range, BLOCK_N, heads,
                                          align=BLOCK_N, key_count=key_count)
    tma_box = ptx.tma_load(BLOCK_M, BOX, True, lag)
    tma_raw = ptx.tma_load(BLOCK_N, BOX // 2, False, lag)  # (64 codes: 32 16-bit values)
    set_converter_regs = ptx.set_max_registers(CONVERTER_REGS, False)
    set_math_regs = ptx.set_max_registers(MATH_REGS, True)
    raw_at_plain = cuda.jit(device=True)(raw_at)

    @cuda.jit(device=True)
    def raw_at_staged(buf, box):
        """``raw_at``, with buffer 0's boxes 4 and 5 in the staging area (``STAGE8``: an
        offset from buffer 0's start)."""
        if buf == 0 and box >= V_BOXES and box < V_BOXES + STAGE_BOXES:
            return STAGE_OFF - KV_OFF + RAW_BOX * (box - V_BOXES)
        return raw_at_plain(buf, box)

    raw_at_ = raw_at_staged if STAGED else raw_at_plain
    convert_order_ = cuda.jit(device=True)(convert_order)

    if FP8:
        @cuda.jit(device=True)
        def scales(scale):
            """(softmax scale, kv_scale)."""
            return float32(scale.real), float32(scale.imag)
    else:
        @cuda.jit(device=True)
        def scales(scale):
            return scale, float32(1.0)

    @cuda.jit(device=True)
    def box_bar(sb, buf, box):
        return sb + BAR_OFF + 8 * (1 + NBOX * buf + box)

    @cuda.jit(device=True)
    def tile_row(block_table, page_size, npages, b, k0):
        """The row of ``storage`` (seen as [pages * page_size, 576]) holding key k0: a 64-key
        tile aligned to 64 keys lies in one page, so its rows follow."""
        pg, sl = locate(block_table, page_size, npages, b, k0)
        return pg * page_size + sl

    @cuda.jit(device=True)
    def pair_after(t, t_end, kstart, kend, q_lo, q_hi, block_table, page_size, npages, b,
                   lead):
        """The pair of tiles after tile ``t`` (t_end where none) and their rows of
        ``storage`` (a walk's last tile's where none; with ``rows_lead``, 0 where ``lead``,
        a warp-uniform flag, is False: those warps issue no copy)."""
        ta = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi) if t < t_end else t_end
        tb = next_tile(ta + 1, t_end, kstart, kend, q_lo, q_hi) if ta < t_end else t_end
        ra = 0
        rb = 0
        if not rows_lead or lead:
            ra = tile_row(block_table, page_size, npages, b,
                          kstart + min(ta, t_end - 1) * BLOCK_N)
            rb = tile_row(block_table, page_size, npages, b,
                          kstart + min(tb, t_end - 1) * BLOCK_N)
        return ta, tb, ra, rb

    @cuda.jit(device=True)
    def load_boxes(smk, sb, buf, tmap, storage, row, lo, hi):
        """Start copying boxes [lo, hi) of the tile at ``row`` into buffer ``buf`` (one
        thread)."""
        for box in range(lo, hi):
            tma_box(smk, sb + KV_OFF + buf * ROWS_BYTES + BOX_BYTES * box, tmap, storage,
                    BOX * box, row, box_bar(sb, buf, box))

    @cuda.jit(device=True)
    def wait_box(smk, sb, buf, box, parity, wtid):
        if wtid == 0:
            ptx.mbar_expect_tx(smk, box_bar(sb, buf, box), BOX_BYTES)
        while not ptx.mbar_try_wait(smk, box_bar(sb, buf, box), parity):
            pass

    advance = ptx.desc_advance_lo if s_unroll else ptx.desc_advance

    @cuda.jit(device=True, **INLINE)
    def qk_box(s_acc, smk, sb, buf, dq, dk, box, parity, wtid):
        """S += Q K^T over box ``box`` of the tile in buffer ``buf`` once it has landed (the
        first box's first step overwrites S)."""
        wait_box(smk, sb, buf, box, parity, wtid)
        for j in range(BOX // 16):
            step = BOX_BYTES * box + 32 * j
            mma_s(s_acc, smk, advance(dq, step), advance(dk, step), box + j, wtid)

    assert NBOX == 9, "qk's written-out form has nine boxes"

    @cuda.jit(device=True)
    def qk(s_acc, smk, sb, buf, parity, wtid, fpar):
        """S = Q K^T over the tile in buffer ``buf`` (this warpgroup's 128 threads), box by box
        as each lands; waited. The rope box goes last, as in the reference's sum: where the
        rope dims carry a large common part (q and k near 100 there), adding the latent dims
        to it first would round them away (an LSE error of 0.16 at 86539, measured)."""
        # (written out, the base goes through an opaque move here, so that the 72 descriptors
        # are formed where each wgmma takes them, not all hoisted out of the walk)
        base = ptx.opaque_i32(sb) if s_unroll else sb
        dq = desc_rows(base + Q_OFF)
        dk = desc_rows(base + KV_OFF + buf * ROWS_BYTES)
        ptx.wgmma_fence()
        if s_unroll:  # (the box a constant in each: S_UNROLL)
            qk_box(s_acc, smk, sb, buf, dq, dk, 0, parity, wtid)
            qk_box(s_acc, smk, sb, buf, dq, dk, 1, parity, wtid)
            qk_box(s_acc, smk, sb, buf, dq, dk, 2, parity, wtid)
            qk_box(s_acc, smk, sb, buf, dq, dk, 3, parity, wtid)
            qk_box(s_acc, smk, sb, buf, dq, dk, 4, parity, wtid)
            qk_box(s_acc, smk, sb, buf, dq, dk, 5, parity, wtid)
            qk_box(s_acc, smk, sb, buf, dq, dk, 6, parity, wtid)
            qk_box(s_acc, smk, sb, buf, dq, dk, 7, parity, wtid)
            qk_box(s_acc, smk, sb, buf, dq, dk, 8, parity, wtid)
        else:
            for box in range(NBOX):
                qk_box(s_acc, smk, sb, buf, dq, dk, box, parity, wtid)
        ptx.wgmma_commit()
        wait_s(s_acc)

    @cuda.jit(device=True)
    def load_raw(smk, sb, buf, tmap, storage, row, lo, hi):
        """Start copying the codes of boxes [lo, hi) of the tile at ``row`` into buffer
        ``buf`` ("e4m3" rows; one thread), each box to ``raw_at``, and announce their bytes
        (after the copies: the thread that copies is the one that arrives)."""
        for box in range(lo, hi):
            tma_raw(smk, sb + KV_OFF + buf * ROWS_BYTES + raw_at_(buf, box), tmap, storage,
                    BOX // 2 * box, row, box_bar(sb, buf, box))
        for box in range(lo, hi):
            ptx.mbar_expect_tx(smk, box_bar(sb, buf, box), RAW_BOX)

    advance8 = ptx.desc_advance_lo if s8_unroll and not CONV else ptx.desc_advance

    @cuda.jit(device=True)
    def s_box(s_acc, smk, dq, dk, box, n, wtid):
        """Issue S += Q K^T over box ``box``'s 64 dims, the n-th box issued (the first
        overwrites S)."""
        for j in range(BOX // 16):
            step = BOX_BYTES * box + 32 * j
            mma_s(s_acc, smk, advance8(dq, step), advance8(dk, step), BOX // 16 * n + j, wtid)

    @cuda.jit(device=True)
    def read_codes(codes, at0, smk, sb, buf, box, parity, src):
        """This thread's codes of box ``box`` (once landed) into ``codes`` from word ``at0``:
        at ``src`` + the box's place, keys wtid // 8 + 16 i, codes 8 (wtid % 8) .. + 7 of
        each (8 bytes); with ``CODES_WIDE`` (``qk8``'s only) in 16-byte loads, keys
        wtid // 4 + 32 i, codes 16 (wtid % 4) .. + 15 of each, from ``src`` = the buffer + 16
        wtid."""
        while not ptx.mbar_try_wait(smk, box_bar(sb, buf, box), parity):
            pass
        at = src + raw_at_(buf, box)
        if WIDE8:
            for i in range(CONVERT_UNITS // 2):
                (codes[at0 + 4 * i], codes[at0 + 4 * i + 1], codes[at0 + 4 * i + 2],
                 codes[at0 + 4 * i + 3]) = ptx.lds128(smk, at + 2048 * i)
        else:
            for i in range(CONVERT_UNITS):
                codes[at0 + 2 * i], codes[at0 + 2 * i + 1] = ptx.lds64(smk, at + 1024 * i)

    @cuda.jit(device=True)
    def write_box(codes, at0, smk, box, dst):
        """``read_codes``' codes (from word ``at0``) as fp16 values in box ``box``: key m's
        16-byte chunk c at c ^ m % 8 of its 128-byte row (the swizzled layout TMA writes),
        from ``dst``; with ``CODES_WIDE`` key m's chunks c = 2 (wtid % 4) and c + 1, at
        c ^ m % 8 and (c + 1) ^ m % 8 = (c ^ m % 8) ^ 1, so the second 16 bytes from the
        first (``dst``, the buffer's row start being 128-byte aligned: ``dst ^ 16``). Not
        fenced: the caller fences for wgmma (``fence_proxy_async``)."""
        if WIDE8:
            for i in range(CONVERT_UNITS // 2):
                for h in range(2):
                    a0, a1 = ptx.e4m3x4_to_f16x4(codes[at0 + 4 * i + 2 * h])
                    a2, a3 = ptx.e4m3x4_to_f16x4(codes[at0 + 4 * i + 2 * h + 1])
                    ptx.sts128(smk, (dst ^ (16 * h)) + BOX_BYTES * box + 4096 * i, a0, a1, a2,
                               a3)
        else:
            for i in range(CONVERT_UNITS):
                a0, a1 = ptx.e4m3x4_to_f16x4(codes[at0 + 2 * i])
                a2, a3 = ptx.e4m3x4_to_f16x4(codes[at0 + 2 * i + 1])
                ptx.sts128(smk, dst + BOX_BYTES * box + 2048 * i, a0, a1, a2, a3)

    @cuda.jit(device=True, **INLINE)
    def free_wait(smk, sb, buf, box, fpar):
        """(``STAGE8``) Before box ``box``'s values are written: for buffer 0's box 4, the
        first staged, wait until warpgroup 1 has said (the mbarrier at FREE0_OFF) that the
        tile before's values there are read, unless ``fpar`` < 0 (the item's first tile,
        copied into a free buffer); ``fpar``: the phase's parity."""
        if STAGED and buf == 0 and box == V_BOXES and fpar >= 0:
            while not ptx.mbar_try_wait(smk, sb + FREE0_OFF, fpar):
                pass

    @cuda.jit(device=True, **INLINE)
    def qk8_step(s_acc, smk, sb, buf, dq, dk, codes, src, dst, prev, n, parity, wtid, fpar):
        """``qk8``'s n-th step (n >= 1): read the codes of the n-th box to convert once they
        land, wait for the warpgroup (every thread has read them, and written the box before),
        issue S over the box before (``prev``), then write this one's values; returns this
        box."""
        box = convert_order_(buf, n)
        read_codes(codes, 0, smk, sb, buf, box, parity, src)
        ptx.bar_sync(BAR_WG + buf, 128)
        s_box(s_acc, smk, dq, dk, prev, n - 1, wtid)
        free_wait(smk, sb, buf, box, fpar)
        write_box(codes, 0, smk, box, dst)
        ptx.fence_proxy_async()
        return box

    @cuda.jit(device=True, **INLINE)
    def qk8_pair(s_acc, smk, sb, buf, dq, dk, codes, src, dst, n, two, parity, wtid, fpar):
        """``qk8``'s step over the n-th box to convert and, with ``two``, the (n+1)-th (n
        even, both constants; ``S8_PAIRS``): the boxes' codes read once landed, one wait for
        the warpgroup (every thread has read them, and written the two boxes before), S over
        the boxes n - 2 and n - 1, then the boxes' values written and one fence; returns the
        last box written. Reading the later box's codes before the earlier box is written
        only moves a read earlier: no box's values overwrite codes of a box converted after
        it."""
        box = convert_order_(buf, n)
        read_codes(codes, 0, smk, sb, buf, box, parity, src)
        if two:
            read_codes(codes, CODE_WORDS, smk, sb, buf, convert_order_(buf, n + 1), parity, src)
        ptx.bar_sync(BAR_WG + buf, 128)
        s_box(s_acc, smk, dq, dk, convert_order_(buf, n - 2), n - 2, wtid)
        s_box(s_acc, smk, dq, dk, convert_order_(buf, n - 1), n - 1, wtid)
        free_wait(smk, sb, buf, box, fpar)
        if two:
            free_wait(smk, sb, buf, convert_order_(buf, n + 1), fpar)
        write_box(codes, 0, smk, box, dst)
        if two:
            box = convert_order_(buf, n + 1)
            write_box(codes, CODE_WORDS, smk, box, dst)
        ptx.fence_proxy_async()
        return box

    @cuda.jit(device=True)
    def qk8(s_acc, smk, sb, buf, parity, wtid, fpar):
        """S = Q K^T over the tile in buffer ``buf`` ("e4m3" rows; this warpgroup's 128
        threads), its codes converted in place to fp16 a box at a time as each lands, in
        ``convert_order``; waited. A box's products are issued once all its values are
        written (a barrier), while the next box is converted; that barrier also comes after
        every thread has read the next box's codes, since three boxes overwrite their own.
        With ``S8_PAIRS`` the boxes go two at a time, (0, 1), (2, 3), (4, 5), (6, 7), then 8
        alone: no pair of buffer 0 waits for both of its two refills (boxes 0-3 and 4-8)."""
        kv = sb + KV_OFF + buf * ROWS_BYTES
        base = ptx.opaque_i32(sb) if s8_unroll else sb  # (as in qk)
        dq = desc_rows(base + Q_OFF)
        dk = desc_rows(base + KV_OFF + buf * ROWS_BYTES)
        if WIDE8:  # (16 codes a load: four threads a key)
            src = kv + 16 * wtid
            dst = kv + 128 * (wtid // 4) + 16 * ((2 * (wtid % 4)) ^ (wtid // 4 % 8))
        else:
            src = kv + 8 * wtid
            dst = kv + 128 * (wtid // 8) + 16 * ((wtid % 8) ^ (wtid // 8 % 8))
        codes = cuda.local.array(QK8_WORDS, int32)
        prev = convert_order_(buf, 0)
        read_codes(codes, 0, smk, sb, buf, prev, parity, src)
        if PAIRS8:
            read_codes(codes, CODE_WORDS, smk, sb, buf, convert_order_(buf, 1), parity, src)
        # Every warp of this warpgroup is past its last product on this buffer (a warp's wait
        # covers its own part of a product only): the first box (or two) overwrite values of
        # the tile before, but no codes.
        ptx.bar_sync(BAR_WG + buf, 128)
        write_box(codes, 0, smk, prev, dst)
        if PAIRS8:
            write_box(codes, CODE_WORDS, smk, convert_order_(buf, 1), dst)
        ptx.fence_proxy_async()
        ptx.wgmma_fence()
        if PAIRS8:  # (then S over boxes 0-1, 2-3, 4-5 and 6-7 in the steps, 8 after them)
            qk8_pair(s_acc, smk, sb, buf, dq, dk, codes, src, dst, 2, True, parity, wtid, fpar)
            qk8_pair(s_acc, smk, sb, buf, dq, dk, codes, src, dst, 4, True, parity, wtid, fpar)
            qk8_pair(s_acc, smk, sb, buf, dq, dk, codes, src, dst, 6, True, parity, wtid, fpar)
            prev = qk8_pair(s_acc, smk, sb, buf, dq, dk, codes, src, dst, 8, False, parity,
                            wtid, fpar)
        elif s8_unroll:  # (n a constant in each: S8_UNROLL)
            prev = qk8_step(s_acc, smk, sb, buf, dq, dk, codes, src, dst, prev, 1, parity, wtid, fpar)
            prev = qk8_step(s_acc, smk, sb, buf, dq, dk, codes, src, dst, prev, 2, parity, wtid, fpar)
            prev = qk8_step(s_acc, smk, sb, buf, dq, dk, codes, src, dst, prev, 3, parity, wtid, fpar)
            prev = qk8_step(s_acc, smk, sb, buf, dq, dk, codes, src, dst, prev, 4, parity, wtid, fpar)
            prev = qk8_step(s_acc, smk, sb, buf, dq, dk, codes, src, dst, prev, 5, parity, wtid, fpar)
            prev = qk8_step(s_acc, smk, sb, buf, dq, dk, codes, src, dst, prev, 6, parity, wtid, fpar)
            prev = qk8_step(s_acc, smk, sb, buf, dq, dk, codes, src, dst, prev, 7, parity, wtid, fpar)
            prev = qk8_step(s_acc, smk, sb, buf, dq, dk, codes, src, dst, prev, 8, parity, wtid, fpar)
        else:
            for n in range(1, NBOX):
                prev = qk8_step(s_acc, smk, sb, buf, dq, dk, codes, src, dst, prev, n, parity,
                                wtid, fpar)
        ptx.bar_sync(BAR_WG + buf, 128)
        s_box(s_acc, smk, dq, dk, prev, NBOX - 1, wtid)
        ptx.wgmma_commit()
        wait_s(s_acc)

    @cuda.jit(device=True)
    def conv_bar(sb, buf, box):
        return sb + CONV_BAR_OFF + 8 * (NBOX * buf + box)

    @cuda.jit(device=True)
    def qk_conv(s_acc, smk, sb, buf, parity, wtid, fpar):
        """S = Q K^T over the tile in buffer ``buf`` ("e4m3" rows, ``converter``), box by box
        in ``convert_order`` as the converter warpgroup announces each converted; waited. The
        box loop's count is hidden from NVVM (``opaque_i32``): with it known, NVVM reshaped
        the loop around its waits and the math warpgroups spilled about 800 bytes at 232
        registers (docs/kernels/mma.md)."""
        dq = desc_rows(sb + Q_OFF)
        dk = desc_rows(sb + KV_OFF + buf * ROWS_BYTES)
        ptx.wgmma_fence()
        for n in range(ptx.opaque_i32(NBOX)):
            box = convert_order_(buf, n)
            while not ptx.mbar_try_wait(smk, conv_bar(sb, buf, box), parity):
                pass
            s_box(s_acc, smk, dq, dk, box, n, wtid)
        ptx.wgmma_commit()
        wait_s(s_acc)

    @cuda.jit(device=True)
    def read_group(codes, smk, sb, buf, g, parity, src):
        """This thread's codes of the g-th group of CONV_GROUP boxes (in ``convert_order``)
        into ``codes``, each box's once it has landed."""
        for i in range(CONV_GROUP):
            read_codes(codes, CODE_WORDS * i, smk, sb, buf, convert_order_(buf, CONV_GROUP * g + i),
                       parity, src)

    @cuda.jit(device=True)
    def write_group(codes, smk, buf, g, dst):
        """``read_group``'s codes as fp16 values in their boxes (``write_box``), then one
        proxy fence for all of them."""
        for i in range(CONV_GROUP):
            write_box(codes, CODE_WORDS * i, smk, convert_order_(buf, CONV_GROUP * g + i), dst)
        ptx.fence_proxy_async()

    @cuda.jit(device=True)
    def announce_group(smk, sb, buf, g):
        for i in range(CONV_GROUP):
            ptx.mbar_expect_tx(smk, conv_bar(sb, buf, convert_order_(buf, CONV_GROUP * g + i)),
                               0)  # (an arrival)

    @cuda.jit(device=True)
    def convert_tile(smk, sb, buf, parity, after_wg1, ctid):
        """The converter warpgroup (``ctid``: 0..127): the tile in buffer ``buf`` from codes
        to fp16 in place, CONV_GROUP boxes at a time in ``convert_order`` as their codes land
        (``parity`` of the buffer's box barriers), each group announced on its boxes'
        "converted" mbarriers once all 128 threads have written and fenced it. A box's values
        are written only after every thread has read its codes (three boxes overwrite their
        own), and the next group's codes are read before that barrier, so one barrier a
        group does both. ``after_wg1``: first wait for warpgroup 1 to be done with the
        buffer's tile before (buffer 1's boxes 4-7, converted first, are its V while its
        codes land)."""
        kv = sb + KV_OFF + buf * ROWS_BYTES
        src = kv + 8 * ctid
        dst = kv + 128 * (ctid // 8) + 16 * ((ctid % 8) ^ (ctid // 8 % 8))
        codes = cuda.local.array(CONV_CODE_WORDS, int32)
        read_group(codes, smk, sb, buf, 0, parity, src)
        if after_wg1:
            ptx.bar_sync(BAR_FREE1, NTHREADS)
        ptx.bar_sync(BAR_CONV, 128)
        for g in range(1, NBOX // CONV_GROUP):
            write_group(codes, smk, buf, g - 1, dst)
            read_group(codes, smk, sb, buf, g, parity, src)
            ptx.bar_sync(BAR_CONV, 128)
            if ctid == 0:
                announce_group(smk, sb, buf, g - 1)
        write_group(codes, smk, buf, NBOX // CONV_GROUP - 1, dst)
        ptx.bar_sync(BAR_CONV, 128)
        if ctid == 0:
            announce_group(smk, sb, buf, NBOX // CONV_GROUP - 1)

    if CONV:
        @cuda.jit(device=True)
        def sync_math():
            """The block barrier of the math warpgroups (the converter has left)."""
            ptx.bar_sync(BAR_MATH, NTHREADS)
    else:
        @cuda.jit(device=True)
        def sync_math():
            cuda.syncthreads()

    qk_tile = qk_conv if CONV else qk8 if FP8 else qk

    @cuda.jit(device=True)
    def scale_q(smk, sb, tid):
        """q's rows (bf16, in place in Q) into fp16, row r times the power of two 2^k that
        puts its largest magnitude in [2^12, 2^15) (``qexp``: k; kernels/transposed.py says
        why this is exact); four threads a row, 16-byte chunks u, u + 4, .. of its 72."""
        r = tid // 4
        u = tid % 4
        mx = float32(0.0)
        for i in range(NBOX * 2):
            j = u + 4 * i
            w = ptx.lds128(smk, sb + Q_OFF + BOX_BYTES * (j // 8) + 128 * r + 16 * (j % 8))
            for e in range(4):
                x0, x1 = ptx.bf16x2_to_f32(w[e])
                mx = max(mx, max(abs(x0), abs(x1)))
        for o in (1, 2):
            mx = max(mx, ptx.shfl_xor(mx, o, tid))
        k, f = q_power(mx)
        if u == 0:
            smk[QEXP_OFF // 4 + r] = k
        for i in range(NBOX * 2):
            j = u + 4 * i
            at = sb + Q_OFF + BOX_BYTES * (j // 8) + 128 * r + 16 * (j % 8)
            w = ptx.lds128(smk, at)
            x0, x1 = ptx.bf16x2_to_f32(w[0])
            x2, x3 = ptx.bf16x2_to_f32(w[1])
            x4, x5 = ptx.bf16x2_to_f32(w[2])
            x6, x7 = ptx.bf16x2_to_f32(w[3])
            ptx.sts128(smk, at, ptx.pack_f16x2(x0 * f, x1 * f), ptx.pack_f16x2(x2 * f, x3 * f),
                       ptx.pack_f16x2(x4 * f, x5 * f), ptx.pack_f16x2(x6 * f, x7 * f))
        ptx.fence_proxy_async()  # (a barrier follows: Q is then visible to wgmma)

    @cuda.jit(device=True)
    def row_scores(s_acc, half, lim, row_in, check, x_mul, fold, cls, b, h, iq, q_pos, k0, scale,
                   bias, wtid):
        """One of a thread's two rows of ``scores`` (``half``); ``check``: each element's key
        against the bound ``lim`` and the row against the block's (``row_in``; False for a
        whole tile of a row in the block); ``x_mul``: each product's factor before the score
        step (1 for none); ``fold``: the score step's. Returns the row's maximum over the
        thread's elements."""
        row_max = float32(NEG_INF)
        for j in range(NS // 4):
            for e in range(2):
                i = 4 * j + 2 * half + e
                s = float32(NEG_INF)
                if not check or (row_in and int32(8 * j + e) < lim):
                    s = log2_score(s_acc[i] * x_mul, fold, scale, cls, b, h, iq, q_pos,
                                   k0 + ptx.acc_col(i, wtid), bias)
                s_acc[i] = s
                row_max = max(row_max, s)
        return row_max

    @cuda.jit(device=True)
    def scores(s_acc, mx, pf, k0, k1, q_lo, q_hi, nrows, b, r0, length, nq, qscale, scale,
               bias, wtid, tid, fh):
        """Mask and score mod on a score fragment (keys [k0, k1) kept, the rest -inf), in log2
        units, or with ``EXP_FOLD`` and a scale > 0 the raw products (masked to -inf);
        ``mx``: the fragment's two row maxima in log2 units (its quad's, which share the
        rows); ``pf``: the factor from each row's scores to log2 units for the softmax (1
        where they are in log2 units already); ``fh``: "e4m3" rows, the thread's two rows'
        factors (kv_scale 2^-k)."""
        cls = mask_classify(k0, k1, q_lo, q_hi)
        # Element i's key is k0 + acc_col(i) = k0 + 2*(wtid%4) + (a constant): it is kept when
        # the constant is below ``lim`` (one compare with an immediate; the key itself is formed
        # only where the score step needs it: 64-bit keys for all 32 elements at once were the
        # kernel's peak register use).
        # (32-bit: one ISETP an element where Numba's 64-bit integers took two)
        lim = int32(k1 - k0 - 2 * (wtid % 4))
        # (uniform; a tile the mask keeps in part takes the bounds' form too, so that the
        # mask's per-element code is in one copy of the scores less: with both this and
        # EXP_FOLD, causal at 128 heads spilled otherwise)
        whole = WHOLE and int32(k1 - k0) >= int32(BLOCK_N) and cls != PARTIAL
        raw = EXP_RAW and qscale > float32(0.0)  # (uniform)
        for half in range(2):
            m = ptx.acc_row(2 * half, wtid)
            row_in = int32(m) < int32(nrows)
            r = r0 + m
            iq = r // H
            h = r - iq * H
            q_pos = length - nq + iq
            f = fh[half] * qscale if FP8 else qscale  # (> 0 where ``raw``: kv_scale is)
            # (each form written out: ``raw`` and ``whole`` are the same across the block)
            if raw:
                pf[half] = f
                one = float32(1.0)
                if whole and row_in:
                    row_max = row_scores(s_acc, half, lim, row_in, False, one, one, FULL, b, h,
                                         iq, q_pos, k0, scale, bias, wtid)
                else:
                    row_max = row_scores(s_acc, half, lim, row_in, True, one, one, cls, b, h,
                                         iq, q_pos, k0, scale, bias, wtid)
            else:
                pf[half] = float32(1.0)
                x_mul = fh[half] if FP8 else float32(1.0)
                # (where the scores may be raw, a scale <= 0 takes the bounds on every tile:
                # a fourth copy of the scores spilled 160 bytes causal)
                if whole and row_in and not EXP_RAW:
                    row_max = row_scores(s_acc, half, lim, row_in, False, x_mul, qscale, FULL,
                                         b, h, iq, q_pos, k0, scale, bias, wtid)
                else:
                    row_max = row_scores(s_acc, half, lim, row_in, True, x_mul, qscale, cls, b,
                                         h, iq, q_pos, k0, scale, bias, wtid)
            for o in (1, 2):
                row_max = max(row_max, ptx.shfl_xor(row_max, o, tid))
            mx[half] = row_max * f if raw else row_max  # (-inf stays -inf: f > 0)

    @cuda.jit(device=True)
    def softmax(s_acc, mx, pf, smf, stat_scale, wtid, tid, scl, sums, sums_p):
        """The running max against this tile's maxima ``mx``: the new reference max replaces
        m in ``stat`` (with ``lag``, it moves only where a row's max passes it by more than
        RESCALE_SLACK, as in kernels/mma.py), exp2(old - new) goes to ``scl`` and ``stat``
        row ``stat_scale`` (1 where it stayed); P = exp2(S pf - ref) in place of S (``pf``:
        scores' factors, as ``scores`` leaves them; one fused multiply-add); ``sums``:
        P's row sums (for the LSE). With ``lag``, P is rounded to 16 bits in place, as P V
        multiplies it, and ``sums_p`` sums it so (for the output: with the reference lagging,
        even a dominant key's P is rounded, and dividing by the unrounded sum would leave
        that rounding in the output)."""
        for half in range(2):
            m = ptx.acc_row(2 * half, wtid)
            m_old = smf[STAT_OFF // 4 + STAT_M * BLOCK_M + m]
            m_new = max(m_old, mx[half])
            if lag and m_new <= m_old + float32(RESCALE_SLACK):  # (False for NaN)
                m_new = m_old
            m_ref = m_new if m_new != float32(NEG_INF) else float32(0.0)  # (no key yet: P = 0)
            scl[half] = exp2(m_old - m_ref)
            total = float32(0.0)
            total_p = float32(0.0)
            for j in range(NS // 4):
                i = 4 * j + 2 * half
                p0 = exp2(s_acc[i] * pf[half] - m_ref)
                p1 = exp2(s_acc[i + 1] * pf[half] - m_ref)
                total += p0 + p1
                if PACKED:
                    w = pack(p0, p1)
                    if lag:
                        p0, p1 = unpack(w)
                        total_p += p0 + p1
                    s_acc[i] = ptx.i32_as_f32(w)
                    # (not read again, but written: left as the score, the register kept it
                    # alive into the next S, and ptxas serialised the wgmma for want of
                    # registers)
                    s_acc[i + 1] = p1
                else:
                    if lag:
                        p0, p1 = unpack(pack(p0, p1))
                        total_p += p0 + p1
                    s_acc[i] = p0
                    s_acc[i + 1] = p1
            sums[half] = total
            sums_p[half] = total_p
            mx[half] = m_new
        ptx.syncwarp(tid)  # the quad's lanes have read m before one of them replaces it
        if wtid % 4 == 0:
            for half in range(2):
                m = ptx.acc_row(2 * half, wtid)
                smf[STAT_OFF // 4 + STAT_M * BLOCK_M + m] = mx[half]
                smf[STAT_OFF // 4 + stat_scale * BLOCK_M + m] = scl[half]

    @cuda.jit(device=True)
    def p_word(s_acc, i):
        """P's elements i and i + 1 (i even) as one word of 16-bit values, as the softmax
        left them (``PACK_P``: as words)."""
        if PACKED:
            return ptx.f32_as_i32(s_acc[i])
        return pack(s_acc[i], s_acc[i + 1])

    @cuda.jit(device=True)
    def store_p(s_acc, smk, sb, buf, wtid):
        """P into buffer ``buf``'s rope box as a K-major 16-bit operand in the 128-byte
        swizzled layout (row m's 16-byte chunk c at c ^ m%8)."""
        base = sb + KV_OFF + buf * ROWS_BYTES + BOX_BYTES * ROPE
        for half in range(2):
            m = ptx.acc_row(2 * half, wtid)
            for j in range(NS // 4):
                i = 4 * j + 2 * half
                ptx.sts32(smk, base + m * 128 + ((j ^ (m % 8)) << 4) + 4 * (wtid % 4),
                          p_word(s_acc, i))

    @cuda.jit(device=True)
    def rescale(o_acc, l_run, l_p, scl):
        """O and the running sums times ``scl`` (a thread's two rows); with ``lag``, O (128
        multiplies) only where a row's reference max moved (a lane skips it where neither of
        its rows did)."""
        for half in range(2):
            l_run[half] *= scl[half]
            if lag:
                l_p[half] *= scl[half]
        if not lag or scl[0] != float32(1.0) or scl[1] != float32(1.0):
            scale_o(o_acc, scl[0], scl[1])

    @cuda.jit(device=True)
    def pv_local(o_acc, s_acc, smk, sb, buf, wg, tid):
        """Issue O += P V over this warpgroup's dims, P from the score fragment (registers)."""
        dv = desc_v(sb + KV_OFF + buf * ROWS_BYTES + wg * V_BOXES * BOX_BYTES)
        for kk in range(BLOCK_N // 16):
            i = 8 * kk
            mma_pv_rs(o_acc, p_word(s_acc, i), p_word(s_acc, i + 2), p_word(s_acc, i + 4),
                      p_word(s_acc, i + 6), smk,
                      ptx.desc_advance(dv, 2048 * kk), 1, tid)

    @cuda.jit(device=True)
    def pv_shared(o_acc, smk, sb, buf, wg, wtid):
        """Issue O += P V over this warpgroup's dims, P from buffer ``buf``'s rope box."""
        kv = sb + KV_OFF + buf * ROWS_BYTES
        dp = desc_rows(kv + BOX_BYTES * ROPE)
        dv = desc_v(kv + wg * V_BOXES * BOX_BYTES)
        for kk in range(BLOCK_N // 16):
            mma_pv(o_acc, smk, ptx.desc_advance(dp, 32 * kk), ptx.desc_advance(dv, 2048 * kk), 1,
                   wtid)

    @cuda.jit(device=True)
    def roles(tid):
        """(warpgroup, thread in it, lane) of thread ``tid``."""
        return ptx.warp_uniform(tid // 128, tid), tid % 128, tid % 32

    @cuda.jit(device=True)
    def set_up_barriers(smk, sb):
        """(Thread 0) The queries' mbarrier and one a box of each buffer (and, with the
        converter, its "converted" ones), one arrival each."""
        ptx.mbar_init(smk, sb + BAR_OFF, 1)
        for i in range(2 * NBOX):
            ptx.mbar_init(smk, sb + BAR_OFF + 8 * (1 + i), 1)
            if CONV:
                ptx.mbar_init(smk, sb + CONV_BAR_OFF + 8 * i, 1)
        if STAGED:
            ptx.mbar_init(smk, sb + FREE0_OFF, 1)
        ptx.mbar_fence_init()

    @cuda.jit(device=True)
    def store_sums(smf, l_run, l_p, wg, wtid):
        """This warpgroup's row sums (``l_run``, and with ``lag`` ``l_p``; whole after the
        quad's shuffles) into its rows of ``stat``, by one lane of each quad."""
        if wtid % 4 == 0:
            for half in range(2):
                m = ptx.acc_row(2 * half, wtid)
                smf[STAT_OFF // 4 + (STAT_L + wg) * BLOCK_M + m] = l_run[half]
                if lag:
                    smf[STAT_OFF // 4 + (STAT_LP + wg) * BLOCK_M + m] = l_p[half]

    @cuda.jit(device=True)
    def store_lse(part_lse, smf, row0, r0, p, tid):
        """Row ``tid``'s LSE (natural log) into ``part_lse`` from both warpgroups' row sums and
        the running max in ``stat`` (-inf where the row kept no key); returns the sum."""
        r = r0 + tid
        lsum = (smf[STAT_OFF // 4 + STAT_L * BLOCK_M + tid]
                + smf[STAT_OFF // 4 + (STAT_L + 1) * BLOCK_M + tid])
        part_lse[row0 + r // H, r % H, p] = (
            float32(NEG_INF) if lsum == 0.0
            else (smf[STAT_OFF // 4 + STAT_M * BLOCK_M + tid] + math.log2(lsum)) * float32(LN2))
        return lsum

    @cuda.jit(device=True)
    def write_regs(o_acc, part_out, smf, row0, r0, nrows, p, wg, wtid):
        """(``ahead``) This thread's part of O (two rows, warpgroup ``wg``'s dims) times each
        row's 1/sum (both warpgroups' sums in ``stat``; 0 for a row without a key), ``store``d
        into ``part_out[t, h, p]`` (the workspace, fp32) straight from the registers, a pair
        of adjacent dims a store (8 bytes: a quad of threads writes a row's 32 bytes)."""
        for half in range(2):
            m = ptx.acc_row(2 * half, wtid)
            if m < nrows:
                lsum = (smf[STAT_OFF // 4 + STAT_L * BLOCK_M + m]
                        + smf[STAT_OFF // 4 + (STAT_L + 1) * BLOCK_M + m])
                lp = lsum
                if lag:  # (the sum of P as P V multiplied it: ``softmax``)
                    lp = (smf[STAT_OFF // 4 + STAT_LP * BLOCK_M + m]
                          + smf[STAT_OFF // 4 + (STAT_LP + 1) * BLOCK_M + m])
                inv = float32(0.0) if lsum == 0.0 else ptx.rcp(lp)
                r = uint64(r0 + m)
                t_row = uint64(row0) + r // uint64(H)
                h = r % uint64(H)
                for j in range(NO // 4):
                    i = 4 * j + 2 * half
                    d = uint64(DIMS_PER_WG * wg + ptx.acc_col(i, wtid))
                    ptx.st_global_x2(part_out, t_row, h, uint64(p), d, store(o_acc[i] * inv),
                                     store(o_acc[i + 1] * inv))

    @cuda.jit(device=True)
    def zero_rows(smk, sb, buf, n0, wtid):
        """Zero keys [n0, 64) of V in buffer ``buf`` (boxes 0-7, whole 128-byte rows: the
        swizzle stays within a row), by one warpgroup: cache slots past the partition's end
        may hold anything, NaN included, and P = 0 does not cancel NaN."""
        for i in range(wtid, (BLOCK_N - n0) * ROPE * 32, 128):
            box = (i // 32) % ROPE
            n = n0 + i // (32 * ROPE)
            ptx.sts32(smk, sb + KV_OFF + buf * ROWS_BYTES + BOX_BYTES * box + 128 * n
                      + 4 * (i % 32), 0)

    if listed:
        @cuda.jit(device=True)
        def block_work(chunk):
            """(sequence, first row, piece, pieces, chunk) of this block: its row of the list."""
            w = cuda.blockIdx.x
            return chunk[w, 0], chunk[w, 1] * BLOCK_M, chunk[w, 2], chunk[w, 3], 0
    else:
        @cuda.jit(device=True)
        def block_work(chunk):
            """(sequence, first row, piece, pieces, chunk) of this block: the grid's (P, G, B)."""
            return (cuda.blockIdx.z, cuda.blockIdx.y * BLOCK_M, cuda.blockIdx.x,
                    cuda.gridDim.x, chunk)

    @cuda.jit(device=True)
    def item_at(chunk, i, q_offsets, lengths, part_lse, nparts, tid, nthreads, mark):
        """Item row ``i`` of the runs table: ``(work, b, row0, r0, nrows, nq, length, p, q_lo,
        q_hi, kstart, kend, t0, t1, t_end)``, ``work`` False where it has no row or no tile;
        with ``mark``, the partitions it leaves without work (past a sequence's last piece,
        and its own where it finds no tile) are marked empty (of ``nparts``; by the threads
        ``tid`` of ``nthreads``)."""
        b = chunk[i, 0]
        r0 = chunk[i, 1] * BLOCK_M
        p = chunk[i, 2]
        t_last = chunk[i, 4]
        row0 = q_offsets[b]
        nq = q_offsets[b + 1] - row0
        length = lengths[b]
        nrows = min(BLOCK_M, nq * H - r0)
        q_lo, q_hi, kstart, kend, ntiles = key_tiles(length, nq, r0, max(nrows, 1))
        t_end = ntiles if t_last < 0 else min(t_last, ntiles)
        t0 = next_tile(min(chunk[i, 3], t_end), t_end, kstart, kend, q_lo, q_hi)
        # (nrows <= 0: ragged rows, no such row group; DIRECT: a sequence without a tile is
        # walked too, for its zeros)
        work = nrows > 0 and (DIRECT or t0 < t_end)
        if mark and nrows > 0:
            if t_last < 0:  # the sequence's last piece: no partition past it has work
                for s in range(p + 1, nparts):
                    mark_empty(part_lse, row0, r0, nrows, s, H, tid, nthreads)
            if not work:
                mark_empty(part_lse, row0, r0, nrows, p, H, tid, nthreads)
        t1 = next_tile(t0 + 1, t_end, kstart, kend, q_lo, q_hi) if work else t_end
        return (work, b, row0, r0, nrows, nq, length, p, q_lo, q_hi, kstart, kend, t0, t1,
                t_end)

    @cuda.jit(device=True)
    def prefetch_entry(tmap_q, tmap_kv, block_table, b, p, run, page_size):
        """(Thread 0 at a block's entry: ``ENTRY_PREFETCH``) Both tensor maps into the copy
        engine's cache and, with a ``run`` (the grid kernel's chunk), partition ``p``'s first
        page-table entry into L2 (``prefetch_first_entry``)."""
        ptx.prefetch_tensormap(tmap_q)
        ptx.prefetch_tensormap(tmap_kv)
        prefetch_first_entry(block_table, b, p, run, BLOCK_N, page_size)

    @cuda.jit(device=True)
    def load_q(smk, sb, q, tmap_q, qrow):
        """(One thread) Start copying an item's queries (rows from ``qrow``) into Q."""
        qbar = sb + BAR_OFF
        if not FP8:
            ptx.mbar_expect_tx(smk, qbar, ROWS_BYTES)
        for box in range(NBOX):
            tma_box(smk, sb + Q_OFF + BOX_BYTES * box, tmap_q, q, BOX * box, qrow, qbar)
        if FP8:  # (announced by the thread that copies, after its copies: load_raw)
            ptx.mbar_expect_tx(smk, qbar, ROWS_BYTES)

    @cuda.jit(device=True)
    def load_first(smk, sb, q, tmap_q, qrow, tmap_kv, storage, block_table, b, ka, kb, with_q):
        """(One thread) Start copying an item's queries (rows from ``qrow``; unless not
        ``with_q``: copied already) and its first pair's tiles, keys from ``ka`` into buffer 0
        and from ``kb`` into buffer 1 (none where ``kb`` < 0)."""
        page_size = storage.shape[1]
        npages = storage.shape[0]
        if with_q:
            load_q(smk, sb, q, tmap_q, qrow)
        row = tile_row(block_table, page_size, npages, b, ka)
        if FP8:
            load_raw(smk, sb, 0, tmap_kv, storage, row, 0, NBOX)
        else:
            load_boxes(smk, sb, 0, tmap_kv, storage, row, 0, NBOX)
        if kb >= 0:
            row = tile_row(block_table, page_size, npages, b, kb)
            if FP8:
                load_raw(smk, sb, 1, tmap_kv, storage, row, 0, NBOX)
            else:
                load_boxes(smk, sb, 1, tmap_kv, storage, row, 0, NBOX)

    @cuda.jit(device=True)
    def walk(q, storage, block_table, bias, scale, part_out, part_lse, tmap_q, tmap_kv, smk, smf,
             sb, tid, wg, wtid, lane, b, row0, r0, nrows, nq, length, p, q_lo, q_hi, kstart,
             kend, t0, t1, t_end, qphase, parity, loaded, scan_from, scan_end, chunk,
             q_offsets, lengths, out, lse, whole):
        """One item: the tiles [t0, t_end) of sequence ``b``'s rows [r0, r0 + nrows) (the first
        two ``t0`` and ``t1``), its barriers set up and the running max at -inf in ``stat``:
        the queries' and the first pair's copies (unless ``loaded``: started already), the
        seesaw loop over the pairs, then the output into partition ``p`` of the workspace, or
        out itself. ``qphase``: the phase of the queries' mbarrier; ``parity``: that of this
        warpgroup's buffer's box barriers, returned as the walk leaves it (a block of the runs
        schedule walks several items). The runs form (``runs``): thread 0 first finds the
        next item with work among rows [scan_from, scan_end) of the runs table ``chunk``
        (marking the partitions of those it passes empty) and puts its row in shared memory
        (NEXT_OFF; -1: none), which the block reads after the walk, with its copies'
        arguments; with ``ahead``, the output goes from the registers to the workspace, and
        once both warpgroups are past their last product thread 0 starts that item's copies
        under it (``q_early``: its queries only, under the staged output). ``loaded``: 0,
        nothing of this item copied yet; 1, its queries; 2, its queries and first pair.
        ``whole`` (``mixed``): the item is a whole sequence, written into ``out`` and ``lse``."""
        # (``rows_lead``: the warp of the copies' thread; a shuffle, which is not dropped
        # where unused: hence the constant otherwise)
        lead = ptx.warp_uniform(wtid // 32, tid) == 0 if rows_lead else True
        if tid == 0 and t0 < t_end and loaded < 2:  # the queries, then the first pair's tiles
            kb = kstart + t1 * BLOCK_N if t1 < t_end else -1
            load_first(smk, sb, q, tmap_q, row0 * H + r0, tmap_kv, storage, block_table, b,
                       kstart + t0 * BLOCK_N, kb, loaded == 0)
        if runs and tid == 0:  # (its loads' latency hides under this item's first tiles)
            nxt = -1
            smk[NEXT_OFF // 4 + 3] = -1  # (its first tile's key: none where no item has tiles)
            for i in range(scan_from, scan_end):
                item = item_at(chunk, i, q_offsets, lengths, part_lse, part_lse.shape[2], 0, 1,
                               True)
                if item[0]:  # (work, b, row0, r0, .., kstart [10], .., t0, t1, t_end [12:15])
                    nxt = i
                    # (ka < 0: DIRECT's item without a tile, which has no copies)
                    ka = item[10] + item[12] * BLOCK_N if item[12] < item[14] else -1
                    kb = item[10] + item[13] * BLOCK_N if item[13] < item[14] else -1
                    smk[NEXT_OFF // 4 + 1] = item[2] * H + item[3]
                    smk[NEXT_OFF // 4 + 2] = item[1]
                    smk[NEXT_OFF // 4 + 3] = ka
                    smk[NEXT_OFF // 4 + 4] = kb
                    break
            smk[NEXT_OFF // 4] = nxt
        page_size = storage.shape[1]
        npages = storage.shape[0]
        qbar = sb + BAR_OFF

        if CONV:
            if wg == 2:  # the converter: every tile of the partition, in the pairs' order
                set_converter_regs()
                n = 0
                t = t0
                while t < t_end:
                    convert_tile(smk, sb, n % 2, n // 2 % 2, n % 2 == 1 and n > 1, wtid)
                    t = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi)
                    n += 1
                return parity
            set_math_regs()

        # This thread's two rows of every fragment: m = 16*warp + lane//4 (+ 8).
        mx = cuda.local.array(2, float32)  # a tile's row maxima, then the new running max
        scl = cuda.local.array(2, float32)  # exp2(old max - new max)
        sums = cuda.local.array(2, float32)
        sums_p = cuda.local.array(2, float32)
        l_run = cuda.local.array(2, float32)  # running sum over this warpgroup's tiles
        l_p = cuda.local.array(2, float32)  # ... of P as rounded to 16 bits
        for half in range(2):
            l_run[half] = float32(0.0)
            l_p[half] = float32(0.0)
        s_acc = cuda.local.array(NS, float32)
        o_acc = cuda.local.array(NO, float32)
        zero_o(o_acc)
        sm_scale, kv_scale = scales(scale)
        qscale = float32(sm_scale * LOG2E)
        fh = cuda.local.array(2, float32)  # "e4m3" rows: the scores' factors (scores)
        pf = cuda.local.array(2, float32)  # the scores' factors to log2 units (softmax)

        if t0 < t_end:
            while not ptx.mbar_try_wait(smk, qbar, qphase):
                pass
            if FP8:
                if SCALE_Q:
                    scale_q(smk, sb, tid)
                    sync_math()  # Q in fp16 and the exponents in place
                for half in range(2):
                    fh[half] = kv_scale
                    if SCALE_Q:
                        fh[half] *= ptx.i32_as_f32(
                            (127 - smk[QEXP_OFF // 4 + ptx.acc_row(2 * half, wtid)]) << 23)
            # No wgmma is in flight where the branches below rejoin: ptxas would wait there
            # for every product (see kernels/mma.py).
            if rows_ahead:  # (the first pair's refills': the pair after it)
                t2, t3, row2, row3 = pair_after(t1, t_end, kstart, kend, q_lo, q_hi,
                                                block_table, page_size, npages, b, lead)
            if wg == 0:
                qk_tile(s_acc, smk, sb, 0, parity, wtid, -1)
                parity ^= 1
                fpar = 0  # (STAGE8: the parity of FREE0's next phase)
                while True:
                    # The next pair's rows (with ``rows_ahead``, the pair after it's), looked up
                    # now: the page-table loads' latency hides under this pair's work, not in
                    # front of the refills.
                    if rows_ahead:
                        t4, t5, row4, row5 = pair_after(t3, t_end, kstart, kend, q_lo, q_hi,
                                                        block_table, page_size, npages, b, lead)
                    else:
                        t2, t3, row2, row3 = pair_after(t1, t_end, kstart, kend, q_lo, q_hi,
                                                        block_table, page_size, npages, b, lead)
                    if STAGED and wtid == 0 and t2 < t_end:
                        # (every thread of this warpgroup is past qk8's last barrier: it has
                        # read the staged codes of the tile before) the next tile's codes of
                        # boxes 4 and 5, into the staging area (raw_at), ahead of the late refill
                        load_raw(smk, sb, 0, tmap_kv, storage, row2, V_BOXES, V_BOXES + STAGE_BOXES)
                    k0 = kstart + t0 * BLOCK_N
                    k1 = min(k0 + BLOCK_N, kend)
                    scores(s_acc, mx, pf, k0, k1, q_lo, q_hi, nrows, b, r0, length, nq,
                           qscale, sm_scale, bias, wtid, tid, fh)
                    softmax(s_acc, mx, pf, smf, STAT_SCALE0, wtid, tid, scl, sums, sums_p)
                    rescale(o_acc, l_run, l_p, scl)
                    for half in range(2):
                        l_run[half] += sums[half]
                        if lag:
                            l_p[half] += sums_p[half]
                    if k1 - k0 < BLOCK_N:
                        zero_rows(smk, sb, 0, k1 - k0, wtid)
                    ptx.fence_proxy_async()
                    # All four warps are done with S0 (P0 goes into the rope box it read), and
                    # zeroed rows are in place for this warpgroup's P V.
                    ptx.bar_sync(BAR_WG + wg, 128)
                    store_p(s_acc, smk, sb, 0, wtid)
                    ptx.fence_proxy_async()
                    ptx.bar_arrive(BAR_SCALE0, NTHREADS)  # m0, scale0, P0 for WG1
                    ptx.wgmma_fence()
                    pv_local(o_acc, s_acc, smk, sb, 0, 0, tid)
                    ptx.wgmma_commit()
                    wait_o(o_acc)
                    if t2 < t_end:  # K0's boxes 0-3 are free: the next pair's first tile
                        ptx.bar_sync(BAR_WG + wg, 128)
                        if wtid == 0:
                            if FP8:  # (its codes of boxes 0-3: raw_at)
                                load_raw(smk, sb, 0, tmap_kv, storage, row2, 0, V_BOXES)
                            else:
                                load_boxes(smk, sb, 0, tmap_kv, storage, row2, 0, V_BOXES)
                    ptx.bar_sync(BAR_SCALE1, NTHREADS)  # m1, scale1, P1 from WG1
                    for half in range(2):
                        scl[half] = smf[STAT_OFF // 4 + STAT_SCALE1 * BLOCK_M
                                        + ptx.acc_row(2 * half, wtid)]
                    rescale(o_acc, l_run, l_p, scl)
                    if t1 < t_end:
                        ptx.wgmma_fence()
                        pv_shared(o_acc, smk, sb, 1, 0, wtid)
                        ptx.wgmma_commit()
                        wait_o(o_acc)
                        if t3 < t_end:  # K1's boxes 0-3 and the rope box (P1) are free
                            ptx.bar_sync(BAR_WG + wg, 128)
                            if wtid == 0:
                                if FP8:  # (the codes' place: raw_at)
                                    load_raw(smk, sb, 1, tmap_kv, storage, row3, 0, NBOX)
                                else:
                                    load_boxes(smk, sb, 1, tmap_kv, storage, row3, ROPE, NBOX)
                                    load_boxes(smk, sb, 1, tmap_kv, storage, row3, 0, V_BOXES)
                    if t2 >= t_end:
                        break
                    qk_tile(s_acc, smk, sb, 0, parity, wtid, fpar)
                    parity ^= 1
                    fpar ^= 1
                    t0 = t2
                    t1 = t3
                    if rows_ahead:
                        t2, t3, row2, row3 = t4, t5, row4, row5
            else:
                if t1 < t_end:
                    qk_tile(s_acc, smk, sb, 1, parity, wtid, -1)
                    parity ^= 1
                while True:
                    if rows_ahead:  # (the rows looked up as warpgroup 0 does)
                        t4, t5, row4, row5 = pair_after(t3, t_end, kstart, kend, q_lo, q_hi,
                                                        block_table, page_size, npages, b, lead)
                    else:
                        t2, t3, row2, row3 = pair_after(t1, t_end, kstart, kend, q_lo, q_hi,
                                                        block_table, page_size, npages, b, lead)
                    k0 = kstart + t1 * BLOCK_N
                    k1 = min(k0 + BLOCK_N, kend) if t1 < t_end else k0  # no tile: all -inf
                    scores(s_acc, mx, pf, k0, k1, q_lo, q_hi, nrows, b, r0, length, nq,
                           qscale, sm_scale, bias, wtid, tid, fh)
                    if max_early1 and wtid % 4 == 0:  # (a store ptxas keeps before the barrier)
                        for half in range(2):
                            smf[STAT_OFF // 4 + (STAT_L + 1) * BLOCK_M
                                + ptx.acc_row(2 * half, wtid)] = mx[half]
                    ptx.bar_sync(BAR_SCALE0, NTHREADS)  # m0, scale0, P0 from WG0
                    for half in range(2):
                        scl[half] = smf[STAT_OFF // 4 + STAT_SCALE0 * BLOCK_M
                                        + ptx.acc_row(2 * half, wtid)]
                    rescale(o_acc, l_run, l_p, scl)
                    # O1 against m0 takes P0 V0 (under this warpgroup's softmax), so K0 is free
                    # early for the next pair.
                    ptx.wgmma_fence()
                    pv_shared(o_acc, smk, sb, 0, 1, wtid)
                    ptx.wgmma_commit()
                    softmax(s_acc, mx, pf, smf, STAT_SCALE1, wtid, tid, scl, sums, sums_p)
                    if t1 < t_end:
                        if k1 - k0 < BLOCK_N:
                            zero_rows(smk, sb, 1, k1 - k0, wtid)
                        # (every warp is past S1: waited before the barrier SCALE0)
                        store_p(s_acc, smk, sb, 1, wtid)
                        ptx.fence_proxy_async()
                    # m1, scale1, P1 for WG0, while P0 V0 is still in flight: WG0 waits for this
                    # warpgroup's softmax, not for its product.
                    ptx.bar_arrive(BAR_SCALE1, NTHREADS)
                    wait_o(o_acc)
                    # All four warps are past the wait (K0's boxes 4-7 and its rope box, P0, are
                    # free), and K1's zeroed rows are in place for the P V below.
                    ptx.bar_sync(BAR_WG + wg, 128)
                    if wtid == 0 and t2 < t_end:
                        if STAGED:  # (boxes 4 and 5 are staged: their values' place is free)
                            ptx.mbar_expect_tx(smk, sb + FREE0_OFF, 0)
                            load_raw(smk, sb, 0, tmap_kv, storage, row2, V_BOXES + STAGE_BOXES,
                                     NBOX)
                        elif FP8:  # (the codes' place: raw_at)
                            load_raw(smk, sb, 0, tmap_kv, storage, row2, V_BOXES, NBOX)
                        else:
                            load_boxes(smk, sb, 0, tmap_kv, storage, row2, V_BOXES, NBOX)
                    rescale(o_acc, l_run, l_p, scl)
                    for half in range(2):
                        l_run[half] += sums[half]
                        if lag:
                            l_p[half] += sums_p[half]
                    # Without a tile t1, P1 = 0 and any finite V does: K0's boxes 4-7 (not
                    # refilled: there is no next pair). No wgmma sits in a branch.
                    ptx.wgmma_fence()
                    pv_local(o_acc, s_acc, smk, sb, 1 if t1 < t_end else 0, 1, tid)
                    ptx.wgmma_commit()
                    wait_o(o_acc)
                    if t2 >= t_end:
                        break
                    if CONV and t3 < t_end:  # K1's boxes 4-7 are free: the converter may write
                        ptx.bar_arrive(BAR_FREE1, NTHREADS)
                    if not FP8 and t3 < t_end:  # K1's boxes 4-7 are free
                        ptx.bar_sync(BAR_WG + wg, 128)
                        if wtid == 0:
                            load_boxes(smk, sb, 1, tmap_kv, storage, row3, V_BOXES, ROPE)
                    t0 = t2
                    t1 = t3
                    if rows_ahead:
                        t2, t3, row2, row3 = t4, t5, row4, row5
                    if t1 < t_end:
                        qk_tile(s_acc, smk, sb, 1, parity, wtid, -1)
                        parity ^= 1
        # -- the row sums of both warpgroups, then the partition's output and LSE --
        for half in range(2):
            for o in (1, 2):
                l_run[half] += ptx.shfl_xor(l_run[half], o, tid)
                if lag:
                    l_p[half] += ptx.shfl_xor(l_p[half], o, tid)
        if AHEAD:  # the output from the registers; the next item's copies under it
            store_sums(smf, l_run, l_p, wg, wtid)
            # Both warpgroups are past their last product (Q and the buffers are free) and
            # their row sums in place.
            sync_math()
            # (thread 0's own writes; none where the next item has no tile: DIRECT)
            if tid == 0 and smk[NEXT_OFF // 4 + 3] >= 0:
                load_first(smk, sb, q, tmap_q, smk[NEXT_OFF // 4 + 1], tmap_kv, storage,
                           block_table, smk[NEXT_OFF // 4 + 2], smk[NEXT_OFF // 4 + 3],
                           smk[NEXT_OFF // 4 + 4], True)
            write_regs(o_acc, part_out, smf, row0, r0, nrows, p, wg, wtid)
            if tid < nrows:
                store_lse(part_lse, smf, row0, r0, p, tid)
            return parity
        # Both warpgroups are done with the tiles: their buffers take the staged output (rows
        # O_PITCH floats apart).
        sync_math()
        # (QEARLY: Q is free too, and the output lies over the buffers: the next item's
        # queries, where it has a tile)
        if QEARLY and tid == 0 and smk[NEXT_OFF // 4 + 3] >= 0:
            load_q(smk, sb, q, tmap_q, smk[NEXT_OFF // 4 + 1])
        store_o(o_acc, smf, sb + KV_OFF + 4 * (ptx.acc_row(0, wtid) * O_PITCH + DIMS_PER_WG * wg
                                               + ptx.acc_col(0, wtid)), 4 * O_PITCH)
        store_sums(smf, l_run, l_p, wg, wtid)
        sync_math()
        if tid < nrows:
            if MIXED and whole:  # out's lse, and "written out" for the combine
                lsum = store_lse(lse, smf, row0, r0, 0, tid)
                r = r0 + tid
                part_lse[row0 + r // H, r % H, 0] = float32(WRITTEN)
            else:
                lsum = store_lse(part_lse, smf, row0, r0, p, tid)
            empty = lsum == 0.0
            if lag:  # the output divides by the sum of P as P V multiplied it (``softmax``)
                lsum = (smf[STAT_OFF // 4 + STAT_LP * BLOCK_M + tid]
                        + smf[STAT_OFF // 4 + (STAT_LP + 1) * BLOCK_M + tid])
            smf[STAT_OFF // 4 + STAT_L * BLOCK_M + tid] = (
                float32(0.0) if empty else kv_scale * ptx.rcp(lsum) if FP8 else ptx.rcp(lsum))
        sync_math()
        if MIXED and whole:
            write_out(out, smf, sb, KV_OFF, STAT_OFF // 4 + STAT_L * BLOCK_M, row0, r0, nrows, 0,
                      tid)
        else:
            write_rows(part_out, smf, sb, KV_OFF, STAT_OFF // 4 + STAT_L * BLOCK_M, row0, r0,
                       nrows, p, tid)
        return parity

    @cuda.jit(**(dict(JIT_OPTIONS, launch_bounds=(CONV_THREADS, 1)) if CONV and not SIMULATOR
                 else JIT_OPTIONS))
    def partition_kernel(q, q_offsets, storage, block_table, lengths, bias, scale, chunk,
                         part_out, part_lse, tmap_q, tmap_kv):
        if follows:  # (before any read: q_offsets may be the kernel before's output)
            ptx.grid_dependency_wait()
        b, r0, p, nparts, run = block_work(chunk)
        tid = cuda.threadIdx.x
        if ENTRY_PREFETCH and tid == 0:
            prefetch_entry(tmap_q, tmap_kv, block_table, b, p, run, storage.shape[1])
        wg, wtid, lane = roles(tid)
        smk = cuda.shared.array(0, int32)
        smf = cuda.shared.array(0, float32)
        sb = ptx.smem_addr(smk)

        row0 = q_offsets[b]
        nq = q_offsets[b + 1] - row0
        length = lengths[b]
        nrows = min(BLOCK_M, nq * H - r0)
        if nrows <= 0:
            return

        q_lo, q_hi, kstart, kend, ntiles = key_tiles(length, nq, r0, nrows)
        t0, t_end = partition_tiles(ntiles, p, nparts, run)
        t0 = next_tile(t0, t_end, kstart, kend, q_lo, q_hi)
        if t0 >= t_end and nparts > 1:  # (one partition writes out itself: zeros, below)
            if tid < NTHREADS:
                mark_empty(part_lse, row0, r0, nrows, p, H, tid, NTHREADS)
            return  # uniform in the block, before any barrier
        t1 = next_tile(t0 + 1, t_end, kstart, kend, q_lo, q_hi) if t0 < t_end else t_end
        if tid < BLOCK_M:
            smf[STAT_OFF // 4 + STAT_M * BLOCK_M + tid] = float32(NEG_INF)
        if tid == 0:
            set_up_barriers(smk, sb)
        cuda.syncthreads()
        walk(q, storage, block_table, bias, scale, part_out, part_lse, tmap_q, tmap_kv, smk, smf,
             sb, tid, wg, wtid, lane, b, row0, r0, nrows, nq, length, p, q_lo, q_hi, kstart,
             kend, t0, t1, t_end, 0, 0, 0, 0, 0, chunk, q_offsets, lengths, part_out, part_lse,
             False)

    @cuda.jit(device=True)
    def run_items(q, q_offsets, storage, block_table, lengths, bias, scale, chunk, part_out,
                  part_lse, out, lse, tmap_q, tmap_kv):
        """The runs schedule's kernel (``runs``): block w walks items ``chunk[chunk[w, 0] :
        chunk[w, 0] + chunk[w, 1]]`` (heuristics.run_schedule), each ``(b, g, slot, t0,
        t1)`` the tiles [t0, t1) of sequence b's row group g (``t1 = -1``: to its last tile,
        and its partitions past ``slot`` marked empty), into partition ``slot`` of the
        workspace; the barriers are set up once and their phases carried from item to item.
        Thread 0 finds the next item with work while this one runs (``walk``; ``ahead``: its
        copies start under this one's output). ``mixed``: a whole sequence's item writes ``out``
        and ``lse``."""
        if follows:
            ptx.grid_dependency_wait()
        tid = cuda.threadIdx.x
        smk = cuda.shared.array(0, int32)
        smf = cuda.shared.array(0, float32)
        sb = ptx.smem_addr(smk)
        nparts = part_lse.shape[2]
        if tid == 0:
            if ENTRY_PREFETCH:  # (the maps only: the items' tiles are the table's)
                prefetch_entry(tmap_q, tmap_kv, block_table, 0, 0, 0, storage.shape[1])
            set_up_barriers(smk, sb)
        # (the first item's block barrier below makes them visible before any use)
        w = cuda.blockIdx.x
        first = chunk[w, 0]
        end = first + chunk[w, 1]
        cur = -1  # the item row with work now
        for i in range(first, end):
            if item_at(chunk, i, q_offsets, lengths, part_lse, nparts, tid, NTHREADS, True)[0]:
                cur = i
                break
        qphase = 0
        parity = 0
        loaded = 0
        while cur >= 0:
            (work, b, row0, r0, nrows, nq, length, p, q_lo, q_hi, kstart, kend, t0, t1,
             t_end) = item_at(chunk, cur, q_offsets, lengths, part_lse, nparts, tid, NTHREADS,
                              False)
            if tid < BLOCK_M:
                smf[STAT_OFF // 4 + STAT_M * BLOCK_M + tid] = float32(NEG_INF)
            # The item before is done with shared memory (its output read out by the generic
            # proxy) before this one's copies land there (the async proxy).
            ptx.fence_proxy_async()
            cuda.syncthreads()
            # (the thread's index made anew for each item: the compilers would otherwise keep
            # the walk's addresses made from it live across the loop, in registers; the mask
            # gives back what the opaque move hides, that it is in [0, NTHREADS), without which
            # the thread's roles and every address made from them are signed 64-bit floor
            # divisions and remainders)
            tid = ptx.opaque_i32(tid) & (NTHREADS - 1)
            wg, wtid, lane = roles(tid)
            whole = False
            if MIXED:  # (a whole sequence: its first piece, to its last tile)
                whole = p == 0 and chunk[cur, 4] < 0
            parity = walk(q, storage, block_table, bias, scale, part_out, part_lse, tmap_q,
                          tmap_kv, smk, smf, sb, tid, wg, wtid, lane, b, row0, r0, nrows, nq,
                          length, p, q_lo, q_hi, kstart, kend, t0, t1, t_end, qphase, parity,
                          loaded, cur + 1, end, chunk, q_offsets, lengths, out, lse, whole)
            if t0 < t_end:  # (DIRECT's item without a tile copies no queries)
                qphase ^= 1
            loaded = 2 if AHEAD else 1 if QEARLY else 0
            cur = smk[NEXT_OFF // 4]  # (written before the walk's barriers)

    if MIXED:
        @cuda.jit(**JIT_OPTIONS)
        def runs_kernel(q, q_offsets, storage, block_table, lengths, bias, scale, chunk,
                        part_out, part_lse, out, lse, tmap_q, tmap_kv):
            run_items(q, q_offsets, storage, block_table, lengths, bias, scale, chunk,
                      part_out, part_lse, out, lse, tmap_q, tmap_kv)
    else:
        @cuda.jit(**JIT_OPTIONS)
        def runs_kernel(q, q_offsets, storage, block_table, lengths, bias, scale, chunk,
                        part_out, part_lse, tmap_q, tmap_kv):
            run_items(q, q_offsets, storage, block_table, lengths, bias, scale, chunk,
                      part_out, part_lse, part_out, part_lse, tmap_q, tmap_kv)

    return runs_kernel if runs else partition_kernel
