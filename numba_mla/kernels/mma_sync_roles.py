"""The warp tensor-core kernel's split-role block (``backend="mma_sync"``, sm_80 on; 16-bit
rows, 32 query rows, a block of 192 KB or more): four warps score, four multiply by V.

In the 32-row block of kernels/mma_sync.py every warp does every phase of a tile in turn,
with the others, and re-reads its Q fragments from shared memory for each product: three
quarters of S's shared-memory reads. Here the roles are split, as the two warpgroups of the
wgmma seesaw kernel split tiles:

- **score warps** 0-3: warp w = 2 sm + dh keeps Q's fragments of m16 tile sm over half the
  dims (dh: 288 dims, 18 k16 steps, 72 registers a lane) in registers for the whole
  partition, so S reads only K (two ``ldmatrix`` for four ``mma.sync`` a step). The two
  warps of a m16 tile pass each other the partial scores of the other's 16 keys (as in
  mma_sync.py), apply the mask and score mod to their own 16, share their row maxima (behind
  the pair's barrier, read before S of the next sub-tile: ``MAX_EARLY``), and write P
  (16-bit) and the rows' rescale ``alpha`` for the V warps. Each keeps the row sums
  of its own keys; the two halves add up at the end (alpha is the same in both). (With
  ``SCORE_QUARTERS``, off: 1.02-1.03x the time on an H100: warp w scores both m16 tiles over dims [144 w, 144 w + 144),
  Q's 72 registers as two tiles x 9 steps, so each sub-tile's K is read once; the four
  warps' partials meet in Xs behind the SCORE barrier and each warp then holds the same 16
  rows x 16 keys as above.)
- **V warps** 4-7: warp 4 + od owns output dims [128 od, 128 od + 128) of all 32 rows (128
  fp32 accumulators a lane); per sub-tile, after its P, O = alpha O + P V. They also issue
  every tile copy (``cp.async``, 128 threads) and hand the tiles to the score warps. (With
  ``V_WARPS = 8``, off: 1.15-1.17x the time on an H100: warps 4-11, 64 dims and 64 accumulators each, 384 threads.)

Sub-tiles of 32 keys (two a 64-key tile of the walk, so the schedule, the mask's tile
classes and skipping are the other kernels'), j = 0, 1, ... in walk order, h = j % 2: the
key rows in stage j % NS of Ks (NS = 4 stages of 32 rows, or 3 where four do not fit: an
A100), P in buffer h. Handoffs by named barriers (a producer ``bar.arrive``, the consumer
``bar.sync``, all the block's threads), each pair of ids alternating with h so that neither
side can arrive twice before the other has synced:

    KREADY[h]  V warps -> score warps: sub-tile j's rows have landed (arrived for j + 2
               during sub-tile j, after the V warps' wait for that copy; for 0 and 1 first)
    PREADY[h]  score -> V: P and alpha of sub-tile j are in buffer h
    PFREE[h]   V -> score: buffer h is free again (after P V of j, for j + 2; first for 0, 1)
    PAIR[sm]   the two score warps of m16 tile sm (64 threads): their partial scores, then
               (MAX_EARLY) their row maxima
    VDONE      the V warps (128, or 256): all are past P V of j before stage j % NS is
               refilled with sub-tile j + NS
    SCORE      the four score warps (128; ``SCORE_QUARTERS`` only): their partial scores
               (Xs is reused a sub-tile later, after every score warp's PFREE wait)

So the score warps run up to two sub-tiles ahead of P V, and each copy is issued NS - 2
sub-tiles before the score warps need it. With ``S_AHEAD`` (on, four stages) a score warp waits
for KREADY of j + 1 and computes S of j + 1 right after the maxima of j, before its PFREE
wait and P of j, so a copy is issued NS - 3 sub-tiles before it is needed; the reuse of Mx,
which the next KREADY wait ordered, is then ordered by the pair's barrier in the exchange of
j + 1 (only the two warps of a m16 tile touch its rows of Mx; with ``SCORE_QUARTERS``, by
the SCORE barrier of that exchange, which all four score warps pass, and by PFREE). Shared
memory (bytes; ``layout``):

    Qs  [32][ROWW]       the block's queries (read once into the score warps' registers)
    Ks  [NS][32][ROWW]   the key rows of NS sub-tiles (the first 512 dims are V); with
                         K_SWIZZLE (the default) a stage's rows 1,152 bytes apart in it,
                         16-byte unit u of row r at u ^ (r & 7)
    Ps  [2][32][PW]      P of two sub-tiles, 16-bit (32 keys: 16 words + 4 padding a row)
    Al  [2][32] f32      each row's alpha for those sub-tiles
    Mx  [2][32][4] f32   the row maxima of each key half (dh) of the sub-tile (LANE_MAX: each
                         lane's, tq; else the quad's, in the first 64 words)
    Xs  [4][2][32][4] f32  the partial scores passed between the score warps of a pair
                         (``SCORE_QUARTERS``: [4][4][2][32][4], each score warp's slot of
                         all its partials)
    Lf  [2][32] f32, Mf [32] f32   the final row sums of each half, the final max
    Lr  [2][32] f32      the final row sums of each half of P as rounded to 16 bits

The reference max lags, as in the wgmma kernels (kernels/mma.py): it moves only where a
row's max passes it by more than ``RESCALE_SLACK`` (8, log2 units), so alpha is 1 on most
sub-tiles and the V warps skip their 128 multiplies a lane. P (below 2^8 then) is rounded to
16 bits for P V even for a dominant key, so the output divides by the sum of P as rounded
(Lr), the LSE by the unrounded sum (Lf).

Fragment notation as in mma_sync.py (lane l = 4 gr + tq). Output as there: the partition's
normalised ``part_out`` and natural-log LSE, or ``out`` and ``lse`` with one partition.
docs/kernels/mma_sync.md: what this is for and what it measured.
"""
import math

from numba import cuda, float32, int32

from .. import ptx
from .._compat import INLINE, JIT_OPTIONS, SIMULATOR
from .common import (D_QK, D_V, LN2, LOG2E, NEG_INF, make_log2_score, make_partition_walk,
                     make_tile_walk, mark_empty)
from .mma import RESCALE_SLACK
from .mma_sync import (BLOCK_N, K_ROW, ROW_BYTES, ROWW, WORDS, _make_pv, make_issue,
                       make_issue_rows, make_q_copy, make_score_rows, make_write_p,
                       pass_partials, swizzled_units)

BLOCK_M = 32  # query rows a block (two m16 tiles)
SUB = 32  # keys a sub-tile
STAGES = (4, 3)  # sub-tiles of key rows in shared memory: 4 where they fit, else 3 (an A100)
SCORE_THREADS = 128  # the four score warps (then the V warps)
# V warps (8: 64 dims and 64 accumulators each, 12 warps a block, so three a scheduler, at
# 168 registers a thread; 1.15-1.17x the time of four on an H100 with the swizzled stage,
# 1.03-1.05x with the padded rows', off)
V_WARPS = 4
HALF_STEPS = D_QK // 32  # k16 steps of S a score warp takes: its half of the dims (18)
QF = 4 * HALF_STEPS  # its Q fragments' registers a lane (72)
S_CHAINS = 4  # a score warp's accumulator chains in S (8: even and odd steps apart; 0.99-1.02x, kept 4)
# a score warp computes S of sub-tile j + 1 between the maxima of j and its wait for P's
# buffer, so that its products run under the softmax and that wait (H100, 7262b7b: 0.963-0.978
# of the time in turn at H = 128, docs/kernels/mma_sync.md); four stages only (factory.py: the
# three-stage form, an A100's, would spill)
S_AHEAD = True
# the pair of score warps of a m16 tile read each other's row maxima right after both are
# written (their own barrier), so that the loads' latency passes under S of the next
# sub-tile rather than after the wait for P's buffer (Nsight Compute, H100: the maxima's
# loads after that wait held 4% of the block's samples)
MAX_EARLY = True
# P and the rescale by ``ex2.approx.ftz`` (one instruction; values below 2^-126 of the
# reference, which at most 2^8 under the row's max (RESCALE_SLACK) leaves out of a sum of at
# least 1, flushed to zero) rather than math.exp2's range check and two multiplies
P_FTZ = True
# a lane keeps the row sums of its own keys of P through the walk and the quad adds them up
# once at the end, rather than four shuffles a row and sub-tile on the score warps' path
SUMS_LATE = True
# (with MAX_EARLY) each lane stores the max of its own keys of a row and the pair reads all
# four lanes' of both halves (two 16-byte loads a row), rather than two shuffles a row first
LANE_MAX = True
# lanes a row of the V warps' copy of a 16-byte aligned cache: 8, a warp-instruction
# writing 128 bytes of each of 4 rows, 16 (256 bytes of each of 2 rows: 0.985-0.993x, within
# noise) or 32 (512 bytes of one row: 1.03-1.05x); both timed into padded rows with "cg".
# The swizzle needs a thread's rows to share their low three bits: 32 lanes with four V
# warps (4 rows a pass) turn it off (factory.py)
COPY_LANES = 8
# ... and its cache operator: "cg" (L2 only) or "ca" (through L1). Into rows 1,168 bytes
# apart (K_SWIZZLE off) a "cg" copy puts each 128 bytes of a row across two 128-byte lines of
# shared memory, and Nsight Compute counts 2.6x the ideal shared wavefronts for such LDGSTS;
# "ca" takes the ideal there (0.94-0.95x "cg"'s time). With the swizzle, "cg" is the fastest:
# 0.89-0.90x "ca" unswizzled's time; "ca" swizzled takes 0.99x "ca" unswizzled's, about 1.1x
# "cg" swizzled's (docs/kernels/mma_sync.md, item 9)
COPY_CACHE = "cg"
# ... and a whole sub-tile's copy with a constant predicate, a partial one's at run time
# (for scripts/probe_cp_async.py's "const" variants: the same wavefronts; 0.99-1.00x)
COPY_CONST_FULL = False
# ... and the stage's rows 1,152 bytes apart with each 16-byte unit u of row r at u ^ (r & 7)
# (an XOR swizzle, the layout CUTLASS's tensor-core copies use: every 128 bytes of a row on
# one 128-byte line, which Nsight Compute's ideal asks of a "cg" copy, and ldmatrix's eight
# rows still on distinct banks), rather than 1,168 bytes apart; the readers' addresses then
# take four registers a lane where one did (245 registers, was 240). For a packed cache
# copied with a thread's rows a multiple of 8 apart (they then share their low three bits)
K_SWIZZLE = True
# each score warp takes both m16 tiles over a quarter of the dims (Q in the same 72 registers
# a lane), so that a sub-tile's K is read once, not once for each m16 tile (36.9 KB of the
# about 115 KB a sub-tile's ldmatrix reads), for a four-way exchange of partial scores (each
# warp's 32 rows x 32 keys to its slot of Xs, 16 KB, where the pairs' took 4 KB) and 16 more
# accumulator registers a lane; after the exchange a warp owns the same 16 rows x 16 keys as
# with halves. Four stages only (with it the three-stage block would not fit an A100's
# 163 KB: the factory builds that one without). 1.020-1.033x the halves' time at the four
# H = 128 shapes on an H100 (plots/ab_quarters_42a7ce7_h100.json): off
SCORE_QUARTERS = False
# ... and each warp's own block of partials kept in registers (picked by selects), the other
# three blocks through Xs (24 KB of STS/LDS a sub-tile where all four took 32); with the
# quarters, 0.994-1.010x the halves' time (the same A/B): off
QUARTERS_SKIP_OWN = False
QUARTER_STEPS = D_QK // 64  # k16 steps of a quarter of the dims (9)
PW = SUB // 2 + 4  # words a row of Ps (80 bytes: an odd number of 16-byte units)
P_ROW_BYTES = 4 * PW
# named barriers (0 is the block's)
BAR_PAIR, BAR_KREADY, BAR_PREADY, BAR_PFREE, BAR_VDONE, BAR_SCORE = 1, 3, 5, 7, 9, 11


def threads(v_warps=V_WARPS):
    """Threads a block: the four score warps and ``v_warps`` V warps."""
    return SCORE_THREADS + 32 * v_warps


def quarters_at(stages):
    """Whether the form with ``stages`` stages takes ``SCORE_QUARTERS`` (four stages and four
    S chains only): the factory's build, the selector's shared memory and ``stages_that_fit``
    all ask this."""
    return bool(SCORE_QUARTERS and stages == 4 and S_CHAINS == 4)


def layout(stages=4, quarters=None):
    """Word offsets of Qs, Ks, Ps, Al, Mx, Xs, Lf, Mf, Lr in dynamic shared memory with ``stages``
    stages of key rows, and its size in words (each offset a multiple of 4 words: 16-byte
    aligned); Xs four times as large with ``quarters`` (``quarters_at(stages)`` when None)."""
    assert stages in STAGES, stages
    quarters = quarters_at(stages) if quarters is None else quarters
    sizes = (BLOCK_M * ROWW, stages * SUB * ROWW, 2 * BLOCK_M * PW, 2 * BLOCK_M,
             2 * BLOCK_M * 4, (16 if quarters else 4) * 2 * 32 * 4, 2 * BLOCK_M, BLOCK_M,
             2 * BLOCK_M)
    offs, at = [], 0
    for n in sizes:
        offs.append(at)
        at += -(-n // 4) * 4
    return tuple(offs), at


def smem_bytes(stages=4, quarters=None):
    return 4 * layout(stages, quarters)[1]


def stages_that_fit(limit):
    """The most stages whose block fits ``limit`` bytes of shared memory a block (4 on an
    H100 or H200: 198 KB; 3 on an A100: 161 KB of its 163), or 0 (an Ada GPU's 99 KB), each
    as the factory builds it (``quarters_at``)."""
    return max((n for n in STAGES if smem_bytes(n) <= limit), default=0)


def _make_q_load(steps, tiles=1):
    """``load_q(qf, words, qaddr, tid)``: this lane's A fragments of Q for ``steps`` k16 steps
    (32 bytes apart from ``qaddr``) into ``qf[4 s .. 4 s + 3]``, written out so that every
    index is a constant and ``qf`` stays in registers; with ``tiles`` 2 also the second m16
    tile's (16 rows further) into ``qf[4 (steps + s) ..]``."""
    lines = ["def load_q(qf, words, qaddr, tid):"]
    for t in range(tiles):
        for s in range(steps):
            f = 4 * (steps * t + s)
            lines.append(f"    qf[{f}], qf[{f + 1}], qf[{f + 2}], qf[{f + 3}] = "
                         f"ldsm(words, qaddr + {16 * ROW_BYTES * t + 32 * s}, tid)")
    scope = {"ldsm": ptx.ldmatrix_x4}
    exec("\n".join(lines), scope)  # (generated here, from the lines above: no outside input)
    return cuda.jit(device=True, **INLINE)(scope["load_q"])


def _make_scores(tag, steps, chains=4, swizzle=False, tiles=1):
    """``scores(s2, qf, words, ka0, ka1, ka2, ka3, tid)``: s2 += Q K^T over ``steps`` k16
    steps for 32 keys (n8 tiles 0-3 at s2[0], [4], [8], [12]); ``ka0`` this lane's ldmatrix
    address of the first 16 keys' step 0 (the next 16 keys are 16 rows further; ``ka1`` ..
    ``ka3`` unused), or with ``swizzle`` (``K_SWIZZLE``'s rows) ``ka{m}`` its address of step
    m, step 4 q + m then 128 q bytes further. Written out like ``_make_q_load``. ``chains``:
    4, each step's four products added into s2 (four chains of ``steps`` dependent HMMAs), or
    8, the odd steps' into a second set added at the end (half as long). ``tiles`` 2: both
    m16 tiles' (``_make_q_load``'s qf), the second's n8 tiles at s2[16], [20], [24], [28]."""
    assert chains in (4, 8) and tiles in (1, 2) and not (chains == 8 and tiles == 2)
    lines = ["def scores(s2, qf, words, ka0, ka1, ka2, ka3, tid):"]
    if chains == 8:
        lines += ["    s2b = cuda.local.array(16, float32)",
                  "    for k in range(16):",
                  "        s2b[k] = float32(0.0)"]
    for s in range(steps):
        acc = "s2b" if chains == 8 and s % 2 else "s2"
        at, row = ((f"ka{s % 4}", 128 * (s // 4)), K_ROW) if swizzle else (("ka0", 32 * s), ROW_BYTES)
        lines += [f"    b0, b1, b2, b3 = ldsm(words, {at[0]} + {at[1]}, tid)",
                  f"    c0, c1, c2, c3 = ldsm(words, {at[0]} + {16 * row + at[1]}, tid)"]
        for t in range(tiles):
            a = ", ".join(f"qf[{4 * (steps * t + s) + k}]" for k in range(4))
            lines += [f"    mma({acc}, {16 * t}, {a}, b0, b1, tid)",
                      f"    mma({acc}, {16 * t + 4}, {a}, b2, b3, tid)",
                      f"    mma({acc}, {16 * t + 8}, {a}, c0, c1, tid)",
                      f"    mma({acc}, {16 * t + 12}, {a}, c2, c3, tid)"]
    if chains == 8:
        lines += ["    for k in range(16):",
                  "        s2[k] += s2b[k]"]
    scope = {"ldsm": ptx.ldmatrix_x4, "mma": ptx.mma_m16n8k16(tag), "cuda": cuda,
             "float32": float32}
    exec("\n".join(lines), scope)  # (generated here, from the lines above: no outside input)
    return cuda.jit(device=True, **INLINE)(scope["scores"])


@cuda.jit(device=True, **INLINE)
def _block_of(s2, v, i):
    """s2[8 v + i] for a run-time v in 0..3 (a warp's index), by selects: an index that
    depends on v would put s2 in local memory."""
    a = s2[i] if v == 0 else s2[8 + i]
    b = s2[16 + i] if v == 2 else s2[24 + i]
    return a if v < 2 else b


@cuda.jit(device=True, **INLINE)
def pass_quarters(s, s2, floats, x_mine, x_read, own):
    """S's exchange among the four score warps, each of which scored both m16 tiles' 32 keys
    over its quarter of the dims (``s2``: m16 tile t's n8 tiles at s2[16 t], [+ 4], [+ 8],
    [+ 12], so that block v = 2 t + key half, the 16 keys warp v owns, is s2[8 v .. 8 v + 7]):
    ``s2``'s blocks to this warp's slot of Xs at byte ``x_mine`` (block v at 1,024 v, each n8
    tile's 16 bytes a lane, 512 apart), the score warps' barrier, then into ``s[8]`` the sum of
    the four warps' partials of this warp's block, read at ``x_read`` (its block of the
    slot of warp 0; warp u's 4,096 u further), in the quarters' order, the same in every
    warp. ``own``: -1, every block through Xs, or this warp's index (``QUARTERS_SKIP_OWN``):
    its own block stays in registers and joins the sum in its place (the same sums)."""
    for v in range(4):
        if v != own:  # (warp-uniform)
            for j in range(2):
                ptx.sts128(floats, x_mine + 1024 * v + 512 * j, s2[8 * v + 4 * j],
                           s2[8 * v + 4 * j + 1], s2[8 * v + 4 * j + 2], s2[8 * v + 4 * j + 3])
    ptx.bar_sync(BAR_SCORE, 128)  # every score warp's partials are in
    for j in range(2):
        x0 = x1 = x2 = x3 = float32(0.0)
        for u in range(4):
            if u == own:
                y0, y1 = _block_of(s2, own, 4 * j), _block_of(s2, own, 4 * j + 1)
                y2, y3 = _block_of(s2, own, 4 * j + 2), _block_of(s2, own, 4 * j + 3)
            else:
                y0, y1, y2, y3 = ptx.lds128(floats, x_read + 4096 * u + 512 * j)
            if u == 0:
                x0, x1, x2, x3 = y0, y1, y2, y3
            else:
                x0, x1, x2, x3 = x0 + y0, x1 + y1, x2 + y2, x3 + y3
        s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3] = x0, x1, x2, x3


def make_partition_kernel(*, tag, store, locate, mask_apply, mask_classify, mask_key_range,
                          score_mod, fold_scale, heads, wide=True, stages=4, key_count=None,
                          s_chains=S_CHAINS, s_ahead=S_AHEAD, v_warps=V_WARPS,
                          max_early=MAX_EARLY, p_ftz=P_FTZ, sums_late=SUMS_LATE,
                          lane_max=LANE_MAX, packed=True, copy_lanes=COPY_LANES,
                          copy_cache=COPY_CACHE, copy_const_full=COPY_CONST_FULL,
                          k_swizzle=K_SWIZZLE, score_quarters=SCORE_QUARTERS,
                          quarters_skip_own=QUARTERS_SKIP_OWN):
    """The split-role kernel for one configuration (factory.py; arguments as for
    mma_sync.make_partition_kernel, 16-bit rows, 32 rows a block; ``stages`` of key rows,
    ``STAGES``; ``s_chains`` the score warps' accumulator chains in S, ``S_CHAINS``;
    ``s_ahead``: S of the next sub-tile before this one's P, ``S_AHEAD``; ``v_warps``, 4
    or 8, ``V_WARPS``; ``max_early``: the pair's maxima read before S of the next sub-tile,
    ``MAX_EARLY``; ``p_ftz``: P and alpha by ``ptx.exp2_ftz``, ``P_FTZ``; ``sums_late``: the
    row sums added across a quad once, after the walk, ``SUMS_LATE``; ``lane_max``: each
    lane's row maxima to the pair, not the quad's, ``LANE_MAX``, with ``max_early`` only;
    ``packed``: the storage is C-contiguous, its rows back to back; ``copy_lanes``,
    ``copy_cache``, ``copy_const_full``: lanes a row of the copy of a 16-byte aligned, packed
    cache, its cache operator and its predicate, ``COPY_LANES``, ``COPY_CACHE``,
    ``COPY_CONST_FULL``; ``k_swizzle``: such a cache's stage rows swizzled, ``K_SWIZZLE``;
    ``score_quarters``: each score warp both m16 tiles over a quarter of the dims,
    ``SCORE_QUARTERS``, four stages and four S chains only; ``quarters_skip_own``: with it,
    each warp's own block of partials kept in registers, ``QUARTERS_SKIP_OWN``)."""
    lane_max = lane_max and max_early
    assert v_warps in (4, 8), v_warps
    NT = threads(v_warps)
    OD = D_V // v_warps  # output dims a V warp owns (128 of four, 64 of eight)
    NACC = 2 * OD // 8 * 4  # its accumulators a lane
    QUARTERS = bool(score_quarters)
    SKIP_OWN = bool(quarters_skip_own and QUARTERS)
    assert not QUARTERS or (stages == 4 and s_chains == 4), "quarters: four stages, 4 chains"
    offsets, _ = layout(stages, QUARTERS)
    (Q_OFF, K_OFF, P_OFF, AL_OFF, MX_OFF, X_OFF, LF_OFF, MF_OFF, LR_OFF) = offsets
    NS = stages
    # sub-tile j + NS (copied once P V of j is done) is half (h + NS) % 2 of the tile
    # (h + NS) // 2 = 1 or 2 ahead of sub-tile j's (t1 or t2 below)
    AHEAD_HALF = NS % 2
    KS_BYTES = 4 * SUB * ROWW  # a stage
    H = heads
    JIT = JIT_OPTIONS if SIMULATOR else dict(JIT_OPTIONS, launch_bounds=(NT, 1))
    key_tiles, next_tile = make_tile_walk(mask_classify, mask_key_range, BLOCK_N, heads,
                                          key_count=key_count)
    first_tiles = make_partition_walk(key_tiles, next_tile)
    score_rows = make_score_rows(make_log2_score(mask_apply, score_mod, fold_scale), heads,
                                 lane_max)
    exp2 = ptx.exp2_ftz if p_ftz else math.exp2
    write_p = make_write_p(ptx.pack_bf16x2 if tag == "bf16" else ptx.pack_f16x2,
                           ptx.bf16x2_to_f32 if tag == "bf16" else ptx.f16x2_to_f32, exp2,
                           not sums_late)
    SUMS_LATE, LANE_MAX = sums_late, lane_max
    load_q = _make_q_load(QUARTER_STEPS, 2) if QUARTERS else _make_q_load(HALF_STEPS)
    S2N = 32 if QUARTERS else 16  # a score warp's partial scores a lane
    copy_q = make_q_copy(BLOCK_M, NT, Q_OFF)
    WIDE = wide and packed
    SWZ = bool(k_swizzle and WIDE)
    assert not SWZ or (NT - SCORE_THREADS) // copy_lanes % 8 == 0, (
        "the swizzle's key: a thread's rows a multiple of 8 apart")
    KR = K_ROW if SWZ else ROW_BYTES  # bytes from a stage row to the next
    scores = (_make_scores(tag, QUARTER_STEPS, 4, SWZ, 2) if QUARTERS
              else _make_scores(tag, HALF_STEPS, s_chains, SWZ))
    S_AHEAD = s_ahead  # (constants of the kernel)
    MAX_EARLY = max_early
    pv = _make_pv(tag, 2, OD, SWZ)
    scale_acc = ptx.acc_scale_halves(NACC)
    zero_acc = ptx.acc_zero(NACC)
    # (a 16-byte aligned cache whose rows lie back to back: the copy's shared and global
    # bases a thread computed once, each row's address from its index; a strided storage, a
    # torch view of wider rows, takes each row's address from its strides)
    if not WIDE:
        copy_lanes, copy_cache, copy_const_full = 8, "cg", False
    CL = copy_lanes  # (lanes a row of the 16-byte copy)
    issue = (make_issue_rows(locate, NT - SCORE_THREADS, SUB, KR, 4 * WORDS, CL,
                             copy_cache, copy_const_full) if WIDE
             else make_issue(locate, wide, NT - SCORE_THREADS, SUB, K_OFF, ROW_BYTES, 4 * WORDS))

    @cuda.jit(device=True, **INLINE)
    def lanes_max(floats, at):
        """The max of the four floats at byte ``at`` of shared memory (a row's four lanes')."""
        x0, x1, x2, x3 = ptx.lds128(floats, at)
        return max(max(x0, x1), max(x2, x3))

    @cuda.jit(device=True, **INLINE)
    def score_sub(s2, qf, words, ka0, ka1, ka2, ka3, off, kready, tid):
        """A score warp's S of one sub-tile (its rows at ``ka0`` .. ``ka3`` plus the stage's
        ``off``, as ``scores`` takes them) into s2, from zero, once the V warps say on barrier
        ``kready`` that the rows have landed."""
        ptx.bar_sync(kready, NT)
        for k in range(S2N):
            s2[k] = float32(0.0)
        scores(s2, qf, words, ka0 + off, ka1 + off, ka2 + off, ka3 + off, tid)

    @cuda.jit(device=True, **INLINE)
    def issue_sub(words, base, storage, block_table, b, kstart, kend, t, t_end, h, j, vtid,
                  dst0, src0):
        """The copy of sub-tile j (half h of tile t) into stage j % NS (the V warps; nothing
        but an empty group where t is past the walk's end, so that every sub-tile is one
        group); ``dst0``, ``src0``: this thread's first piece's addresses (``WIDE``)."""
        if t < t_end:  # (a half past the keys copies zeros, looking up key kend - 1)
            k0 = ptx.min_i32(kstart + t * BLOCK_N + SUB * h, kend)
            k1 = ptx.min_i32(k0 + SUB, kend)
            stage = j & 3 if NS == 4 else j % NS
            if WIDE:
                issue(words, dst0 + KS_BYTES * stage, storage, block_table, b, k0, k1, src0,
                      vtid)
            else:
                issue(words, base, KS_BYTES * stage, storage, block_table, b, k0, k1, vtid)
        else:
            ptx.cp_async_commit()

    @cuda.jit(**JIT)
    def partition_kernel(q, q_offsets, storage, block_table, lengths, bias, scale, chunk,
                         part_out, part_lse):
        # q [T, H, 288] and storage [pages, page_size, 288]: int32 words of 16-bit pairs;
        # q_offsets [B+1], chunk: tiles a partition, part_out [T, H, P, 512], part_lse [T, H, P]
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

        q_lo, q_hi, kstart, kend, t, t_end = first_tiles(length, nq, r0, nrows, p, nparts, chunk)
        if t >= t_end and nparts > 1:  # (one partition writes out itself: zeros, below)
            mark_empty(part_lse, row0, r0, nrows, p, H, tid, NT)
            return  # uniform in the block, before any barrier

        copy_q(words, base, q, row0, r0, nrows, H, tid)  # the block's queries into Qs
        cuda.syncthreads()

        gr, tq = lane // 4, lane % 4
        sm_scale = float32(scale.real)
        fold = float32(sm_scale * LOG2E)
        a_row, a_col = lane % 8 + 8 * (lane // 8 % 2), 8 * (lane // 16)
        # The V warps' O (128 accumulators a lane), declared here, where both roles pass: an
        # array defined in one branch and read after the two join is a pointer chosen by the
        # branch taken, which keeps the whole array in local memory
        acc = cuda.local.array(NACC, float32)
        if warp < 4:
            # ---- a score warp: m16 tile sm, dims [288 dh, 288 dh + 288) ----
            # (QUARTERS: S over dims [144 warp, + 144) of both m16 tiles, then, exchanged,
            # the same 16 rows x 16 keys as with halves)
            sm, dh = warp // 2, warp % 2
            qf = cuda.local.array(QF, int32)
            if QUARTERS:
                load_q(qf, words, base + 4 * Q_OFF + a_row * ROW_BYTES + 2 * a_col
                       + 32 * QUARTER_STEPS * warp, tid)
                k_unit = lane // 8 % 2 + 2 * QUARTER_STEPS * warp  # (16-byte units)
            else:
                load_q(qf, words, base + 4 * Q_OFF + (16 * sm + a_row) * ROW_BYTES + 2 * a_col
                       + 32 * HALF_STEPS * dh, tid)
                k_unit = lane // 8 % 2 + 2 * HALF_STEPS * dh
            if SWZ:  # (step m's unit u at u ^ the row's low bits: lane % 8)
                ka0, ka1, ka2, ka3 = swizzled_units(
                    base + 4 * K_OFF + (lane % 8 + 8 * (lane // 16)) * KR, k_unit, lane % 8)
            else:
                ka0 = (base + 4 * K_OFF + (lane % 8 + 8 * (lane // 16)) * ROW_BYTES
                       + 16 * k_unit)
                ka1 = ka2 = ka3 = ka0  # (unused)
            if QUARTERS:  # (this warp's slot of Xs; its block of warp 0's)
                x_give = base + 4 * X_OFF + 4096 * warp + 16 * lane
                x_take = base + 4 * X_OFF + 1024 * warp + 16 * lane
            else:
                x_give = base + 4 * (X_OFF + 256 * warp) + 16 * lane
                x_take = base + 4 * (X_OFF + 256 * (warp ^ 1)) + 16 * lane
            # partial scores: 32 keys over half the dims (QUARTERS: 32 rows x 32 keys over a
            # quarter of the dims)
            s2 = cuda.local.array(S2N, float32)
            s = cuda.local.array(8, float32)  # this warp's 16 keys: rows gr, gr + 8 of sm
            m_run = cuda.local.array(2, float32)  # rows 16 sm + gr + 8 half
            l_own = cuda.local.array(2, float32)  # ... the sums of P over this warp's keys
            l_rnd = cuda.local.array(2, float32)  # ... of P as rounded to 16 bits
            for j in range(2):
                m_run[j] = float32(NEG_INF)
                l_own[j] = float32(0.0)
                l_rnd[j] = float32(0.0)
            j = 0
            if S_AHEAD and t < t_end:  # (S of sub-tile 0 before the walk)
                score_sub(s2, qf, words, ka0, ka1, ka2, ka3, 0, BAR_KREADY, tid)
            while t < t_end:
                k0 = kstart + t * BLOCK_N
                k1 = min(k0 + BLOCK_N, kend)
                cls = mask_classify(k0, k1, q_lo, q_hi)
                t_next = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi)
                for h in range(2):
                    if not S_AHEAD:  # (sub-tile j's)
                        score_sub(s2, qf, words, ka0, ka1, ka2, ka3, KS_BYTES * (j % NS),
                                  BAR_KREADY + h, tid)
                    # the partner's 16 keys to it, its partials of this warp's 16 from it
                    if QUARTERS:
                        pass_quarters(s, s2, floats, x_give, x_take,
                                      warp if SKIP_OWN else -1)
                    else:
                        pass_partials(s, s2, floats, x_give, x_take, dh, BAR_PAIR + sm)
                    # mask and score mod on this warp's keys, their row maxima to Mx[dh]
                    score_rows(s, floats, MX_OFF + BLOCK_M * dh * (4 if LANE_MAX else 1),
                               float32(1.0), fold, sm_scale,
                               cls, b, 16 * sm + gr, r0, nrows, length, nq,
                               k0 + SUB * h + 16 * dh, k1, bias, tq, tid)
                    mx0 = mx1 = mx2 = mx3 = float32(NEG_INF)
                    if LANE_MAX:  # (the pair's 8 lanes' maxima of each row, taken now)
                        ptx.bar_sync(BAR_PAIR + sm, 64)
                        at = base + 4 * (MX_OFF + 4 * (16 * sm + gr))  # (row gr, dh 0)
                        mx0 = lanes_max(floats, at)
                        mx1 = lanes_max(floats, at + 16 * BLOCK_M)  # (dh 1)
                        mx2 = lanes_max(floats, at + 16 * 8)  # (row gr + 8)
                        mx3 = lanes_max(floats, at + 16 * (BLOCK_M + 8))
                    elif MAX_EARLY:  # (the pair's maxima in: loaded now, taken after S below)
                        ptx.bar_sync(BAR_PAIR + sm, 64)
                        mx0 = floats[MX_OFF + 16 * sm + gr]
                        mx1 = floats[MX_OFF + BLOCK_M + 16 * sm + gr]
                        mx2 = floats[MX_OFF + 16 * sm + gr + 8]
                        mx3 = floats[MX_OFF + BLOCK_M + 16 * sm + gr + 8]
                    if S_AHEAD and (h == 0 or t_next < t_end):
                        # S of sub-tile j + 1 now, its products under this one's softmax (its
                        # partner's pair barrier, not KREADY, now orders the maxima's reuse)
                        score_sub(s2, qf, words, ka0, ka1, ka2, ka3, KS_BYTES * ((j + 1) % NS),
                                  BAR_KREADY + 1 - h, tid)
                    # Buffer h is free (P V of j - 2 done). All four score warps wait here,
                    # so this also orders both halves' maxima before their reads below (where
                    # not read above: there the pair's next exchange orders their reuse).
                    ptx.bar_sync(BAR_PFREE + h, NT)
                    for half in range(2):
                        i = 16 * sm + gr + 8 * half
                        m_old = m_run[half]
                        if MAX_EARLY:
                            m_new = max(m_old, max(mx2, mx3) if half else max(mx0, mx1))
                        else:
                            m_new = max(m_old, max(floats[MX_OFF + i],
                                                   floats[MX_OFF + BLOCK_M + i]))
                        if m_new <= m_old + float32(RESCALE_SLACK):  # (False for NaN)
                            m_new = m_old  # the reference lags: alpha 1
                        m_ref = m_new if m_new != float32(NEG_INF) else float32(0.0)
                        alpha = exp2(m_old - m_ref)
                        m_run[half] = m_new
                        row_sum, row_rnd = write_p(s, words, half, m_ref,
                                                   P_OFF + (BLOCK_M * h + i) * PW + 8 * dh, tq,
                                                   tid)
                        l_own[half] = l_own[half] * alpha + row_sum
                        l_rnd[half] = l_rnd[half] * alpha + row_rnd
                        if dh == 0 and tq == 0:
                            floats[AL_OFF + BLOCK_M * h + i] = alpha
                    ptx.bar_arrive(BAR_PREADY + h, NT)  # P and alpha of sub-tile j
                    j += 1
                t = t_next
            # the final row sums of each half and the max, for the V warps
            if SUMS_LATE:  # (each lane's so far: its keys')
                for half in range(2):
                    l_own[half] += ptx.shfl_xor(l_own[half], 1, tid)
                    l_rnd[half] += ptx.shfl_xor(l_rnd[half], 1, tid)
                    l_own[half] += ptx.shfl_xor(l_own[half], 2, tid)
                    l_rnd[half] += ptx.shfl_xor(l_rnd[half], 2, tid)
            if tq == 0:
                for half in range(2):
                    i = 16 * sm + gr + 8 * half
                    floats[LF_OFF + BLOCK_M * dh + i] = l_own[half]
                    floats[LR_OFF + BLOCK_M * dh + i] = l_rnd[half]
                    if dh == 0:
                        floats[MF_OFF + i] = m_run[half]
        else:
            # ---- a V warp: output dims [128 od, 128 od + 128) of all 32 rows ----
            od = warp - 4
            vtid = tid - SCORE_THREADS
            zero_acc(acc)
            p_addr = base + 4 * P_OFF + a_row * P_ROW_BYTES + 2 * a_col
            v_addr = base + 4 * K_OFF + a_row * ROW_BYTES + 2 * (a_col + OD * od)
            if SWZ:  # (pair m's unit u at u ^ the row's low bits: lane % 8)
                va0, va1, va2, va3 = swizzled_units(base + 4 * K_OFF + a_row * KR,
                                                    OD // 8 * od + lane // 16, lane % 8)
            else:
                va0 = va1 = va2 = va3 = v_addr  # (unused)
            # the walk two tiles ahead (t1, t2): sub-tile j + 2 is of t1, j + NS of t1 or t2
            t1 = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi) if t < t_end else t_end
            # this thread's copy pieces: row vtid // CL of a stage, 16-byte unit vtid % CL of it
            # (SWZ: XOR the row's low three bits, the same for each of the thread's rows)
            dst0 = base + 4 * K_OFF + vtid // CL * KR + 16 * (
                ((vtid % CL) ^ (vtid // CL % 8)) if SWZ else vtid % CL)
            src0 = ptx.global_addr(storage, 0, 0, 0) + 16 * (vtid % CL) if t < t_end else 0
            for h in range(2):
                issue_sub(words, base, storage, block_table, b, kstart, kend, t, t_end, h, h,
                          vtid, dst0, src0)
            for h in range(NS - 2):
                issue_sub(words, base, storage, block_table, b, kstart, kend, t1, t_end, h,
                          2 + h, vtid, dst0, src0)
            t2 = next_tile(t1 + 1, t_end, kstart, kend, q_lo, q_hi) if t1 < t_end else t_end
            # sub-tiles 0 and 1 (this thread's pieces): all but the NS - 2 copies after them
            if NS == 4:
                ptx.cp_async_wait_two()
            else:
                ptx.cp_async_wait_one()
            if t < t_end:  # (an arrival no score warp waits for would be left over)
                for h in range(2):
                    ptx.bar_arrive(BAR_KREADY + h, NT)
                    ptx.bar_arrive(BAR_PFREE + h, NT)  # (no P V before sub-tiles 0 and 1)
            j = 0
            while t < t_end:
                for h in range(2):
                    ptx.bar_sync(BAR_PREADY + h, NT)  # P and alpha of sub-tile j
                    if t1 < t_end:  # sub-tile j + 2's rows (copied since sub-tile j + 2 - NS)
                        if NS == 4:  # (all but the newest copy, j + 3's)
                            ptx.cp_async_wait_one()
                        else:
                            ptx.cp_async_wait_all()
                        ptx.bar_arrive(BAR_KREADY + h, NT)
                    a0 = floats[AL_OFF + BLOCK_M * h + gr]
                    a1 = floats[AL_OFF + BLOCK_M * h + gr + 8]
                    a2 = floats[AL_OFF + BLOCK_M * h + gr + 16]
                    a3 = floats[AL_OFF + BLOCK_M * h + gr + 24]
                    if a0 != float32(1.0) or a1 != float32(1.0) or a2 != float32(1.0) or (
                            a3 != float32(1.0)):
                        scale_acc(acc, a0, a1, a2, a3)
                    pa = p_addr + P_ROW_BYTES * BLOCK_M * h
                    vo = KS_BYTES * (j % NS)
                    va = v_addr + vo
                    for step in range(SUB // 16):
                        c0, c1, c2, c3 = ptx.ldmatrix_x4(words, pa + 32 * step, tid)
                        c4, c5, c6, c7 = ptx.ldmatrix_x4(words, pa + 16 * P_ROW_BYTES
                                                         + 32 * step, tid)
                        if SWZ:
                            o = vo + 16 * KR * step
                            pv(acc, words, va0 + o, va1 + o, va2 + o, va3 + o, c0, c1, c2, c3,
                               c4, c5, c6, c7, tid)
                        else:
                            pv(acc, words, va + 16 * ROW_BYTES * step, c0, c1, c2, c3, c4, c5,
                               c6, c7, tid)
                    if t1 < t_end:
                        ptx.bar_arrive(BAR_PFREE + h, NT)  # for sub-tile j + 2's P
                    ptx.bar_sync(BAR_VDONE, NT - SCORE_THREADS)  # every V warp is past j
                    issue_sub(words, base, storage, block_table, b, kstart, kend,
                              t2 if h + NS >= 4 else t1, t_end, (h + AHEAD_HALF) % 2, j + NS,
                              vtid, dst0, src0)
                    j += 1
                t, t1 = t1, t2
                t2 = next_tile(t2 + 1, t_end, kstart, kend, q_lo, q_hi) if t2 < t_end else t_end
        cuda.syncthreads()  # the score warps' final sums and max

        if warp >= 4:
            od = warp - 4
            for jr in range(4):  # rows gr + 8 jr: m16 tile jr // 2
                i = gr + 8 * jr
                if i < nrows:
                    t_row, hh = row0 + (r0 + i) // H, (r0 + i) % H
                    lsum = floats[LR_OFF + i] + floats[LR_OFF + BLOCK_M + i]  # (P as rounded)
                    inv = float32(0.0) if lsum == 0.0 else float32(1.0) / lsum
                    at = (jr // 2) * (NACC // 2) + 2 * (jr % 2)
                    for n8 in range(OD // 8):
                        d = OD * od + 8 * n8 + 2 * tq
                        part_out[t_row, hh, p, d] = store(acc[at + 4 * n8] * inv)
                        part_out[t_row, hh, p, d + 1] = store(acc[at + 4 * n8 + 1] * inv)
            if od == 0 and tq == 0:  # the rows' LSE (a loop apart: 8 registers fewer)
                for jr in range(4):
                    i = gr + 8 * jr
                    if i < nrows:
                        lsum = floats[LF_OFF + i] + floats[LF_OFF + BLOCK_M + i]
                        part_lse[row0 + (r0 + i) // H, (r0 + i) % H, p] = (
                            float32(NEG_INF) if lsum == 0.0 else
                            (floats[MF_OFF + i] + math.log2(lsum)) * float32(LN2))

    # what this kernel was built with (the tests ask which form the selector launched)
    partition_kernel.form = dict(stages=stages, wide=wide, s_chains=s_chains, s_ahead=s_ahead,
                                 v_warps=v_warps, max_early=max_early, p_ftz=p_ftz,
                                 sums_late=sums_late, lane_max=lane_max,
                                 packed=bool(packed), copy_lanes=copy_lanes,
                                 copy_cache=copy_cache, copy_const_full=bool(copy_const_full),
                                 k_swizzle=SWZ, score_quarters=QUARTERS,
                                 quarters_skip_own=SKIP_OWN)
    return partition_kernel
