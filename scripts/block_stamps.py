"""Where a block's time goes, block by block: a diagnostic build of a kernel that reads the
GPU's global timer (``%globaltimer_lo``, nanoseconds; ``seesaw-pairs``: the SM's cycle
counter too) at points of every block and writes the readings into the block's own results
(which are then wrong: this is a measurement, never a result).

``--kernel transposed`` (kernels/transposed.py, "e4m3" rows at H = 16): five points (entry;
Q's image in place, the prologue's barrier; the first tile's rows in place, the loop's first
barrier; the loop's end; the epilogue's end, thread 0's stores issued), written over dims 0-4
of the block's first output row of the workspace (split shapes only).

``--kernel seesaw`` (kernels/seesaw.py's grid kernel, 16-bit rows): seven points read by
thread 0 (warpgroup 0): entry; the walk's start (after the block's set-up barrier); Q in
place; the first tile's S in its registers (its first scores); the pair loop's end; the
output's start (the row sums and LSE in place, the last barrier); the output's stores
issued. They are written over the LSE of the block's first seven rows (``lse``, or the
workspace's where the shape splits), so every shape can be stamped, one partition or many.

``--kernel seesaw-runs``: the runs kernel (``selector.SEESAW_RUNS`` on: the cut runs,
``heuristics.run_schedule``; with ``--model`` the cost model's choice, which may be the
whole-sequence runs, ``heuristics.whole_runs``, or no runs at all, then reported;
``--mixed`` the model's choice with ``heuristics.MIXED_RUNS`` on (the library's default: the
choice may then be the mixed runs, whose items that are whole sequences write out themselves,
the others the workspace; the one shape of the varlen sweep that takes them is
``--shapes 64x128x4096@0.5``), ``--no-mixed`` with it off;
``seesaw.RUNS_AHEAD`` off, so that an item's output is staged as the grid kernel's, and
``seesaw.RUNS_Q_EARLY`` as the module has it, on by default: an item's queries were then
copied under the item before's output, and "q ready" times only their wait) with the same
readings from each item's walk (six: the walk's start in place of the block's entry), written
over the LSE of the item's first rows in its slot of the workspace (or of ``lse``, where every
item is a whole sequence) and read back item by item from the runs table, with each item's
block and tiles; it prints a tile's median time in the loop beside the points. Stamps taken
before 9518058 (``plots/block_stamps_seesaw-runs_a03a7d8_h100.*``) had no early queries.

``--kernel seesaw-pairs`` (the grid kernel, 16-bit rows, H = 128 only): where a pair of tiles'
time goes in the seesaw loop, warpgroup by warpgroup. Every thread reads the SM's cycle
counter (``%clock``) at points of its warpgroup's pair loop and adds each step since its last
reading to a float32 register of its own (no branch in the loop: a first form, in which one
thread a warpgroup added the steps to shared memory and ``qk`` read the counter between its
products, ran 1.5x the kernel's time), ``PAIR_PHASES``: warpgroup 0 (buffer 0) the tiles
and rows it looks up, its scores, softmax and rescale, P0's publishing (the barrier, its
store, the fence), P0 V0, the refill of K0's boxes 0-3, the wait for warpgroup 1's scale,
then the rescale and P1 V1; warpgroup 1 (buffer 1) its lookups and scores, the wait for
warpgroup 0's scale, the rescale with P0 V0 issued, its softmax and P1's store, P0 V0's
drain, then the refill of K0's boxes 4-8, the rescale and P1 V1; each then the refill of its
K1 boxes and the next tile's S (its boxes' waits included). (The first profile,
plots/pairs_seesaw_d9524a0_h100.*, counted the lookups with the scores and warpgroup 0's
refill with its wait.) ptxas may move instructions across a reading, so the split between
neighbouring phases is approximate; their sums are not.
Each warpgroup also counts its pairs (the loop's turns), its S tiles within the loop (the
first is before it) and warpgroup 0 the pairs with a second tile (P1 V1); warpgroup 0 reads
the global timer and the counter at the loop's start and end, to turn cycles into time block
by block. After the loop each warpgroup's first thread puts its 16 words into shared memory
(64 words after the barriers), which thread 0 writes over the LSE of the block's first 32
rows; for each shape the median over blocks of each phase's cycles a pair (a tile, for S),
in cycles and microseconds, is printed for both warpgroups side by side, with the phases' sum
a pair beside the loop's own time a pair (the JSON has every block's words, phases and
times). Compare the kernel's time printed with the bench's: the readings cost a little.
``selector.SEESAW_RUNS`` is off, so that every shape runs the grid kernel.

For each shape the partition kernel alone is launched once after the bench's L2 flush, three
times, and (but for ``seesaw-pairs``) the percentiles over blocks (0, 10, 50, 90, 100) of each
point, in microseconds after the earliest entry, are printed and written to ``--out`` (JSON)
with every block's readings.

Usage (on a GPU machine, in the repository root):
    python scripts/block_stamps.py --out stamps.json [--kernel seesaw|seesaw-runs|seesaw-pairs]
                                   [--shapes 64x128x4096@0.25,128x128x1024] [--model] [--[no-]mixed]

The build is a patched copy of the package in a temporary folder: the patch names the lines
it inserts after, and stops with the line it did not find when the kernel's module has
changed under it (tests/test_block_stamps.py checks that every patch applies). The committed
transposed stamps, plots/block_stamps_transposed_*, were taken by this script's first form,
with the same five points and shapes.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TIMER = '''
from llvmlite import ir as _ir
from numba.cuda.extending import intrinsic as _intrinsic
from numba.cuda import types as _types


@_intrinsic
def _gtimer(typingctx):
    def cg(ctx, b, sig, args):
        fnty = _ir.FunctionType(_ir.IntType(32), [])
        return b.call(_ir.InlineAsm(fnty, "mov.u32 $0, %globaltimer_lo;", "=r",
                                    side_effect=True), [])
    return _types.int32(), cg
'''
STORE = '''
        if tid == 0:
            st4 = _gtimer()
            t_row0 = uint64(row0) + uint64(r0) // uint64(H)
            h0 = uint64(r0) % uint64(H)
            part_out[t_row0, h0, p, 0] = ptx.i32_as_f32(st0)
            part_out[t_row0, h0, p, 1] = ptx.i32_as_f32(st1)
            part_out[t_row0, h0, p, 2] = ptx.i32_as_f32(st2)
            part_out[t_row0, h0, p, 3] = ptx.i32_as_f32(st3)
            part_out[t_row0, h0, p, 4] = ptx.i32_as_f32(st4)
'''
#: (a line of the kernel, what goes after it), in order
PATCH_TRANSPOSED = [
    ("from .. import ptx\n", TIMER),
    ("        smk = cuda.shared.array(0, int32)\n", "        st0 = _gtimer()\n"),
    ("        # The image and the exponents are in place.\n        cuda.syncthreads()\n",
     "        st1 = _gtimer()\n        st2 = st1\n"),
    ("            # is done with the other stage (the last tile's) and the last tile's P^T.\n"
     "            cuda.syncthreads()\n",
     "            if it == 0:\n                st2 = _gtimer()\n"),
    ("        # -- the column sums: lanes g, then the four warps", None),
    ("                        part_out[t_row, h, p, d + 3] = store(y3)\n", STORE),
]
SEESAW_STORE = '''
        if tid == 0:
            t_row0 = row0 + r0 // H
            h0 = r0 % H
            for i, st in enumerate((int32(scan_from), stw, stq, sts, ste, sto, _gtimer())):
                part_lse[t_row0, h0 + i, p] = ptx.i32_as_f32(st)
'''
#: the seesaw grid kernel's: its entry's reading reaches the walk as ``scan_from`` (which only
#: the runs kernel uses), the others are the walk's
PATCH_SEESAW = [
    ("from .. import ptx\n", TIMER),
    ("            ptx.grid_dependency_wait()\n"
     "        b, r0, p, nparts, run = block_work(chunk)\n", "        st0 = _gtimer()\n"),
    ("        if tid == 0 and t0 < t_end and loaded < 2:  # the queries, then the first pair's",
     "<before>        stw = _gtimer()\n        stq = stw\n        sts = stw\n"),
    ("            while not ptx.mbar_try_wait(smk, qbar, qphase):\n                pass\n",
     "            stq = _gtimer()\n"),
    ("                    scores(s_acc, mx, pf, k0, k1, q_lo, q_hi, nrows, b, r0, length, nq,",
     "<before>                    if sts == stw:\n                        sts = _gtimer()\n"),
    ("        # -- the row sums of both warpgroups", "<before>        ste = _gtimer()\n"),
    ("        if MIXED and whole:\n            write_out(", "<before>        sto = _gtimer()\n"),
    ("                       nrows, p, tid)\n        return parity\n",
     "<replace>                       nrows, p, tid)\n" + SEESAW_STORE[1:]
     + "        return parity\n"),
    ("kend, t0, t1, t_end, 0, 0, 0, 0, 0, chunk, q_offsets, lengths,",
     "<replace>kend, t0, t1, t_end, 0, 0, 0, st0, 0, chunk, q_offsets, lengths,"),
]
#: the runs kernel's: the same readings of each item's walk (its entry has none of its own)
PATCH_RUNS = [(a, b.replace("(int32(scan_from), stw,", "(stw,")) for a, b in PATCH_SEESAW
              if "st0" not in a + b]
CLOCK = '''

@_intrinsic
def _clk(typingctx):
    def cg(ctx, b, sig, args):
        fnty = _ir.FunctionType(_ir.IntType(32), [])
        return b.call(_ir.InlineAsm(fnty, "mov.u32 $0, %clock;", "=r", side_effect=True), [])
    return _types.int32(), cg
'''
#: the pair loop's phases: (accumulator k, warpgroup 0's phase, warpgroup 1's; None: none),
#: in loop order; the last is the next tile's S (a tile, not a pair: the first S of each
#: warpgroup is before the loop)
PAIR_PHASES = (
    (8, "next tiles, rows looked up", "next tiles, rows looked up"),
    (0, "scores0", "scores1"),
    (1, "softmax0+rescale", "wait SCALE0"),
    (2, "publish P0", "rescale, P0V0 issued, softmax1, store P1"),
    (3, "P0V0", "P0V0 drain"),
    (9, "refill K0 0-3", None),
    (4, "wait SCALE1", "refill K0 4-8, rescale, P1V1"),
    (5, "rescale, P1V1", None),
    (7, "refill K1 0-3+8, S0", "refill K1 4-7, S1"),
)
S_PHASES = (7,)
#: a warpgroup's other words: its pairs (the loop's turns), its S tiles in the loop, and
#: warpgroup 0's pairs with a tile t1 (its phase 5), its loop's cycles and nanoseconds
PAIRS, S_TILES, P1V1_PAIRS, LOOP_CYCLES, LOOP_NS = 6, 12, 13, 10, 11
#: the 32 words a block writes: warpgroup 0's accumulators 0-15, then warpgroup 1's
PAIR_WORDS = tuple(
    f"wg{wg} " + {**{k: names[wg] for k, *names in PAIR_PHASES if names[wg]},
                  PAIRS: "pairs", S_TILES: "S tiles",
                  **({P1V1_PAIRS: "P1V1 pairs", LOOP_CYCLES: "loop cycles", LOOP_NS: "loop ns"}
                     if wg == 0 else {})}.get(k, "-")
    for wg in range(2) for k in range(16))
#: the accumulators a thread keeps in registers (float32: whole cycles, exact below 2^24)
_ACC_WORDS = sorted({k for k, *_ in PAIR_PHASES} | {PAIRS, S_TILES, P1V1_PAIRS})


def _stamp(k, indent, count=None):
    """Phase k ends here: every thread of the warpgroup adds the cycles since its last reading
    (``pc``) to its register ``_ak`` (and 1 to ``count``'s). No branch: a divergent path
    beside wgmma in flight can make ptxas serialise the products."""
    s = " " * indent
    return (f"{s}_c = _clk()\n{s}_a{k} += float32((_c - pc) & 0xFFFFFFFF)\n"
            + (f"{s}_a{count} += float32(1.0)\n" if count else "") + f"{s}pc = _c\n")


PAIRS_INIT = "".join(f"        _a{k} = float32(0.0)\n" for k in _ACC_WORDS) + (
    "        pc = _clk()\n        _lc = pc\n        _ln = _gtimer()\n")
PAIRS_END = (
    "        _lcf = float32((_clk() - _lc) & 0xFFFFFFFF)\n"
    "        _lnf = float32((_gtimer() - _ln) & 0xFFFFFFFF)\n"
    "        if wtid == 0 and t0 < t_end:\n"
    "            for _k in range(16):\n"
    "                smf[ACC_OFF // 4 + 32 * wg + _k] = float32(0.0)\n"
    + "".join(f"            smf[ACC_OFF // 4 + 32 * wg + {k}] = _a{k}\n" for k in _ACC_WORDS)
    + f"            if wg == 0:\n"
    f"                smf[ACC_OFF // 4 + {LOOP_CYCLES}] = _lcf\n"
    f"                smf[ACC_OFF // 4 + {LOOP_NS}] = _lnf\n")
PAIRS_STORE = '''
        if tid == 0:
            for i in range(32):
                part_lse[row0 + r0 // H, r0 % H + i, p] = smf[ACC_OFF // 4 + 32 * (i // 16)
                                                               + i % 16]
'''
#: the grid kernel's pair loop (``PAIR_PHASES``)
PATCH_PAIRS = [
    ("from .. import ptx\n", TIMER + CLOCK),
    # the words' own area after the barriers (what comes after it moves with it)
    ("SMEM_BYTES = BAR_OFF + 8 * (1 + 2 * NBOX)  # 223128\n",
     "ACC_OFF = SMEM_BYTES  # (block_stamps) 32 words a block\nSMEM_BYTES += 256\n"),
    # the walk's start: the registers, defined on every path
    ("        page_size = storage.shape[1]\n        npages = storage.shape[0]\n"
     "        qbar = sb + BAR_OFF\n", PAIRS_INIT),
    # warpgroup 0: the loop's start (its cycles and nanoseconds)
    ("                qk_tile(s_acc, smk, sb, 0, parity, wtid, -1)\n                parity ^= 1\n"
     "                fpar = 0  # (STAGE8: the parity of FREE0's next phase)\n"
     "                while True:\n",
     "<replace>                qk_tile(s_acc, smk, sb, 0, parity, wtid, -1)\n"
     "                parity ^= 1\n                fpar = 0\n                pc = _clk()\n"
     "                _lc = pc\n                _ln = _gtimer()\n                while True:\n"),
    ("                    k0 = kstart + t0 * BLOCK_N\n", "<before>" + _stamp(8, 20)),
    ("                    softmax(s_acc, mx, pf, smf, STAT_SCALE0, wtid, tid, scl, sums, sums_p)\n",
     "<before>" + _stamp(0, 20)),
    ("                    if k1 - k0 < BLOCK_N:\n"
     "                        zero_rows(smk, sb, 0, k1 - k0, wtid)\n", "<before>" + _stamp(1, 20)),
    ("                    ptx.bar_arrive(BAR_SCALE0, NTHREADS)  # m0, scale0, P0 for WG1\n",
     _stamp(2, 20)),
    ("                    pv_local(o_acc, s_acc, smk, sb, 0, 0, tid)\n"
     "                    ptx.wgmma_commit()\n                    wait_o(o_acc)\n", _stamp(3, 20)),
    ("                    ptx.bar_sync(BAR_SCALE1, NTHREADS)  # m1, scale1, P1 from WG1\n",
     "<replace>" + _stamp(9, 20)
     + "                    ptx.bar_sync(BAR_SCALE1, NTHREADS)  # m1, scale1, P1 from WG1\n"
     + _stamp(4, 20, PAIRS)),
    ("                        pv_shared(o_acc, smk, sb, 1, 0, wtid)\n"
     "                        ptx.wgmma_commit()\n                        wait_o(o_acc)\n",
     _stamp(5, 24, P1V1_PAIRS)),
    ("                    qk_tile(s_acc, smk, sb, 0, parity, wtid, fpar)\n"
     "                    parity ^= 1\n",
     _stamp(7, 20, S_TILES)),
    # warpgroup 1
    ("                if t1 < t_end:\n"
     "                    qk_tile(s_acc, smk, sb, 1, parity, wtid, -1)\n"
     "                    parity ^= 1\n                while True:\n",
     "<replace>                if t1 < t_end:\n"
     "                    qk_tile(s_acc, smk, sb, 1, parity, wtid, -1)\n"
     "                    parity ^= 1\n                pc = _clk()\n                while True:\n"),
    ("                    k0 = kstart + t1 * BLOCK_N\n", "<before>" + _stamp(8, 20)),
    ("                    ptx.bar_sync(BAR_SCALE0, NTHREADS)  # m0, scale0, P0 from WG0\n",
     "<replace>" + _stamp(0, 20)
     + "                    ptx.bar_sync(BAR_SCALE0, NTHREADS)  # m0, scale0, P0 from WG0\n"
     + _stamp(1, 20)),
    ("                    ptx.bar_arrive(BAR_SCALE1, NTHREADS)\n"
     "                    wait_o(o_acc)\n",
     "<replace>" + _stamp(2, 20) + "                    ptx.bar_arrive(BAR_SCALE1, NTHREADS)\n"
     "                    wait_o(o_acc)\n" + _stamp(3, 20)),
    ("                    pv_local(o_acc, s_acc, smk, sb, 1 if t1 < t_end else 0, 1, tid)\n"
     "                    ptx.wgmma_commit()\n                    wait_o(o_acc)\n",
     _stamp(4, 20, PAIRS)),
    ("                    if t1 < t_end:\n"
     "                        qk_tile(s_acc, smk, sb, 1, parity, wtid, -1)\n"
     "                        parity ^= 1\n", _stamp(7, 24, S_TILES)),
    # the loop's end: each warpgroup's first thread puts its words in shared memory, thread 0
    # then writes the block's 32 over the first rows' LSE
    ("        # -- the row sums of both warpgroups", "<before>" + PAIRS_END),
    ("                       nrows, p, tid)\n        return parity\n",
     "<replace>                       nrows, p, tid)\n" + PAIRS_STORE[1:]
     + "        return parity\n"),
]
KERNELS = {  # module, patch, points, shapes (B, H, L, P: None for the library's split, spread)
    "transposed": ("transposed.py", PATCH_TRANSPOSED,
                   ("entry", "q ready", "tile0 in", "loop end", "end"),
                   ((64, 16, 4096, None, 0.0), (128, 16, 8192, None, 0.0), (64, 16, 1024, 4, 0.0),
                    (64, 16, 256, 4, 0.0))),
    "seesaw": ("seesaw.py", PATCH_SEESAW,
               ("entry", "walk", "q ready", "first S", "loop end", "out start", "end"),
               ((128, 128, 1024, None, 0.0), (64, 128, 4096, None, 0.0),
                (16, 128, 32768, None, 0.0), (1, 128, 65536, None, 0.0))),
    # the runs kernel (selector.SEESAW_RUNS) with its output staged as the grid kernel's
    # (seesaw.RUNS_AHEAD off: the same code after the loop, and with RUNS_Q_EARLY the next
    # item's queries copied after the last products), a row of readings an item
    "seesaw-runs": ("seesaw.py", PATCH_RUNS,
                    ("walk", "q ready", "first S", "loop end", "out start", "end"),
                    ((16, 128, 32768, None, 0.0), (16, 128, 32768, None, 0.5),
                     (64, 128, 4096, None, 0.0), (1, 128, 65536, None, 0.0))),
    # the grid kernel's pair loop, phase by phase: 32 words a block (H = 128 only)
    "seesaw-pairs": ("seesaw.py", PATCH_PAIRS, PAIR_WORDS,
                     ((64, 128, 4096, None, 0.0), (128, 128, 1024, None, 0.0),
                      (16, 128, 32768, None, 0.0))),
}


def patched_copy(dst, kernel="transposed"):
    """The package, with the stamps in ``kernel``'s module, under ``dst``."""
    shutil.copytree(os.path.join(ROOT, "numba_mla"), os.path.join(dst, "numba_mla"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    module, patch = KERNELS[kernel][:2]
    path = os.path.join(dst, "numba_mla", "kernels", module)
    src = open(path, encoding="utf-8").read()
    for anchor, after in patch:
        if src.count(anchor) < 1:
            sys.exit(f"block_stamps: kernels/{module} has changed: no line {anchor!r}")
        if after is None:  # before the anchor: the loop's end
            src = src.replace(anchor, "        st3 = _gtimer()\n" + anchor, 1)
        elif after.startswith("<before>"):
            src = src.replace(anchor, after[len("<before>"):] + anchor, 1)
        elif after.startswith("<replace>"):
            src = src.replace(anchor, after[len("<replace>"):], 1)
        else:
            src = src.replace(anchor, anchor + after, 1)
    open(path, "w", encoding="utf-8").write(src)


def block_stamps(kernel, partition, H, npoints):
    """Every block's readings (every item's, for the runs kernel), [n, points] int64
    (nanoseconds, 32 bits), and for the runs kernel each item's (block, tiles), else None."""
    import numpy as np

    if kernel == "transposed":
        a = partition.args[8].copy_to_host()  # the workspace's output: dims 0-4, first row
        return np.ascontiguousarray(a[:, 0, :, :npoints]).view(np.uint32).astype(np.int64) \
            .reshape(-1, npoints), None
    lse = partition.args[9].copy_to_host()  # [T, H, P]: a block's (item's) first rows' LSE
    if kernel in ("seesaw", "seesaw-pairs"):
        groups = [lse[:, h0:h0 + npoints, :] for h0 in range(0, H, 64)]  # (Sq = 1: r0 = h0)
        st = np.concatenate([g.transpose(0, 2, 1).reshape(-1, npoints) for g in groups])
        if kernel == "seesaw-pairs":  # (float32 words: cycles, counts)
            return st.astype(np.float64), None
        return np.ascontiguousarray(st).view(np.uint32).astype(np.int64), None
    table = partition.args[7].copy_to_host()  # the runs table: block rows, then item rows
    offsets = partition.args[1].copy_to_host()
    lengths = partition.args[4].copy_to_host()
    rows, info = [], []
    for w in range(int(table[0, 0])):
        for i in range(int(table[w, 0]), int(table[w, 0] + table[w, 1])):
            b, g, slot, t0, t1 = (int(v) for v in table[i])
            r0 = 64 * g
            st = np.ascontiguousarray(lse[offsets[b] + r0 // H, r0 % H:r0 % H + npoints, slot])
            st = st.view(np.uint32).astype(np.int64)
            steps = np.diff(st) % (1 << 32)  # (an item that ran: in order, within 10 ms;
            if np.all(steps < 10 ** 7) and steps.sum() > 0:  # one marked empty: -inf's bits)
                rows.append(st)
                info.append((w, (-(-int(lengths[b]) // 64) if t1 < 0 else t1) - t0))
    return np.array(rows), np.array(info)


def _listed(a):
    """``a`` as nested lists, NaN as None (JSON's null)."""
    import numpy as np

    return np.where(np.isnan(a), None, np.asarray(a, object)).tolist()


def pair_profile(words):
    """The pair loop's phases from the blocks' 32 words (``block_stamps``, [n, 32]): a dict
    of the blocks that walked a pair (``blocks``: their index), each phase's cycles a pair (a
    tile, for S) of each warpgroup (``cycles``: [blocks, 2, phases], NaN where a block has no
    such pair or tile, or the warpgroup no such phase) and microseconds (``us``: at the
    block's own clock, the loop's nanoseconds over its cycles), the loop's cycles and
    microseconds a pair (warpgroup 0's), and the medians over blocks."""
    import numpy as np

    w = np.asarray(words, np.float64).reshape(-1, 2, 16)
    pairs = w[:, :, PAIRS]
    # (a block that walked its pairs: counts in range; an empty partition's LSE is -inf)
    with np.errstate(invalid="ignore"):
        ok = (np.all(np.isfinite(w), axis=(1, 2))
              & np.all((pairs > 0) & (pairs < 1 << 20), axis=1)
              & (w[:, 0, LOOP_CYCLES] > 0) & (w[:, 0, LOOP_NS] > 0))
    blocks = np.flatnonzero(ok)
    w = w[ok]
    ns_per_cycle = w[:, 0, LOOP_NS] / w[:, 0, LOOP_CYCLES]
    cycles = np.full((len(w), 2, len(PAIR_PHASES)), np.nan)
    for i, (k, *names) in enumerate(PAIR_PHASES):
        for wg in range(2):
            if names[wg] is None:
                continue
            count = w[:, wg, S_TILES if k in S_PHASES else P1V1_PAIRS if k == 5 else PAIRS]
            with np.errstate(divide="ignore", invalid="ignore"):
                cycles[:, wg, i] = np.where(count > 0, w[:, wg, k] / count, np.nan)
    us = cycles * ns_per_cycle[:, None, None] / 1000.0
    loop_cycles = w[:, 0, LOOP_CYCLES] / w[:, 0, PAIRS]
    loop_us = w[:, 0, LOOP_NS] / w[:, 0, PAIRS] / 1000.0

    def med(a):  # (over blocks; NaN where none has the phase)
        if not len(a):
            return np.full(np.shape(a)[1:], np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmedian(a, axis=0)

    return dict(blocks=blocks, cycles=cycles, us=us, loop_cycles=loop_cycles, loop_us=loop_us,
                pairs=w[:, :, PAIRS], ghz=med(1.0 / ns_per_cycle), med_cycles=med(cycles),
                med_us=med(us), sum_cycles=med(np.nansum(cycles, axis=2)),
                sum_us=med(np.nansum(us, axis=2)), med_loop_cycles=med(loop_cycles),
                med_loop_us=med(loop_us))


def print_pairs(label, rep, event_us, prof, nblocks):
    """``pair_profile``'s medians, the two warpgroups side by side."""
    n, pairs = len(prof["blocks"]), prof["pairs"]
    print(f"{label} rep {rep}: the kernel {event_us:.1f} us between events, {n} of {nblocks} "
          f"blocks walked pairs (pairs a block {int(pairs.min()) if n else 0}-"
          f"{int(pairs.max()) if n else 0}, clock {prof['ghz']:.2f} GHz); "
          "a pair's phases (S: a tile's), medians over blocks")
    print(f"   {'k':>2} {'warpgroup 0':<30}{'cycles':>8}{'us':>8}   "
          f"{'warpgroup 1':<42}{'cycles':>8}{'us':>8}")
    for i, (k, *names) in enumerate(PAIR_PHASES):
        cols = []
        for wg, width in ((0, 30), (1, 42)):
            if names[wg] is None:
                cols.append(" " * (width + 16))
            else:
                cols.append(f"{names[wg]:<{width}}{prof['med_cycles'][wg, i]:8.0f}"
                            f"{prof['med_us'][wg, i]:8.3f}")
        print(f"   {k:>2} " + "   ".join(cols).rstrip())
    c, u = prof["sum_cycles"], prof["sum_us"]
    print(f"      {'sum a pair':<30}{c[0]:8.0f}{u[0]:8.3f}   {'sum a pair':<42}{c[1]:8.0f}"
          f"{u[1]:8.3f}")
    print(f"      {'loop a pair (thread 0)':<30}{prof['med_loop_cycles']:8.0f}"
          f"{prof['med_loop_us']:8.3f}")


def parse_shapes(text):
    """``--shapes``: "BxHxL" or "BxHxL@spread", comma-separated, each at the library's split."""
    shapes = []
    for item in text.split(","):
        dims, _, spread = item.partition("@")
        B, H, L = (int(v) for v in dims.split("x"))
        shapes.append((B, H, L, None, float(spread or 0.0)))
    return tuple(shapes)


def measure(out, kernel, shapes=None, model=False, mixed=None):
    import numpy as np

    from numba_mla.bench.configs import Config, Settings
    from numba_mla.bench.problems import make_problem
    from numba_mla.bench.providers import select_providers
    from numba_mla.bench.timing import Device, time_gpu

    prov = select_providers("numba_mla:mma")[0]
    settings = Settings.gpu()
    dev = Device(use_torch=True)
    rng = np.random.default_rng(0)
    results = []
    points, default = KERNELS[kernel][2:]
    shapes = default if shapes is None else shapes
    if kernel == "seesaw-runs":
        from numba_mla import heuristics, selector
        from numba_mla.kernels import seesaw

        selector.SEESAW_RUNS = None if model or mixed is not None else True
        seesaw.RUNS_AHEAD = False
        if mixed is not None:
            heuristics.MIXED_RUNS = mixed
        elif not model:  # (the cut runs forced: their plain form, every item to the workspace)
            heuristics.MIXED_RUNS = False
        mixed = heuristics.MIXED_RUNS
    elif kernel == "seesaw-pairs":  # (the grid kernel's loop: never the runs kernel)
        from numba_mla import selector

        selector.SEESAW_RUNS = False
    for B, H, L, P, spread in shapes:
        if kernel == "seesaw-pairs" and H != 128:
            sys.exit(f"block_stamps: seesaw-pairs writes 32 words over a block's first rows' "
                     f"LSE: H = 128 only (64 rows a block, one query token), not H = {H}")
        cfg = Config(B, H, L, kv="e4m3" if kernel == "transposed" else "same",
                     num_partitions=P, spread=spread)
        problem = make_problem(cfg, dev, rng, settings, 0)
        prep = prov.prepare(problem)
        launches = prep.run.__self__.launches  # (the plan's: ..., partition[, combine])
        if kernel == "transposed" and len(launches) < 2:
            sys.exit(f"block_stamps: {cfg.label} runs in one partition (no combine): the "
                     "stamps would overwrite the output itself; pick a split shape")
        partition = launches[-2] if len(launches) >= 2 else launches[-1]
        name = partition.dispatcher.py_func.__name__
        want = {"seesaw": "partition", "seesaw-pairs": "partition",
                "seesaw-runs": "runs"}.get(kernel)
        if want and want not in name:
            sys.exit(f"block_stamps: {cfg.label} did not run the {kernel} kernel ({name})")
        unit = "items" if kernel == "seesaw-runs" else "blocks"
        for rep in range(3):
            event_us = time_gpu(dev, partition, 1, 1, settings.flush_bytes)[0]
            st, info = block_stamps(kernel, partition, H, len(points))
            if kernel == "seesaw-pairs":
                prof = pair_profile(st)
                print_pairs(cfg.label, rep, event_us, prof, len(st))
                results.append(dict(
                    shape=cfg.label, rep=rep, event_us=event_us, words=points,
                    phases=PAIR_PHASES, ghz=_listed(prof["ghz"]),
                    median_cycles=_listed(prof["med_cycles"]), median_us=_listed(prof["med_us"]),
                    sum_cycles=_listed(prof["sum_cycles"]), sum_us=_listed(prof["sum_us"]),
                    loop_cycles=_listed(prof["med_loop_cycles"]),
                    loop_us=_listed(prof["med_loop_us"]), blocks=prof["blocks"].tolist(),
                    block_words=st[prof["blocks"]].tolist(),
                    block_cycles=_listed(prof["cycles"]), block_us=_listed(prof["us"])))
                continue
            rel = ((st - st[:, 0].min()) % (1 << 32)) / 1000.0
            print(f"{cfg.label} rep {rep}: the kernel {event_us:.1f} us between events, "
                  f"{len(st)} {unit}; percentiles 0/10/50/90/100 over {unit}, us")
            for i, name in enumerate(points):
                q = np.percentile(rel[:, i], [0, 10, 50, 90, 100])
                print(f"   {name:<9}" + " ".join(f"{v:6.1f}" for v in q))
            steps = np.median(np.diff(rel, axis=1), axis=0)
            print("   median steps " + ", ".join(f"{a} -> {b} {v:.2f}" for a, b, v
                                                 in zip(points, points[1:], steps)))
            row = dict(shape=cfg.label, rep=rep, event_us=event_us, points=points,
                       stamps_us=rel.tolist())
            if info is not None:  # the runs kernel: items a block, a tile's time in the loop
                loop = rel[:, points.index("loop end")] - rel[:, points.index("first S")]
                per_tile = loop / np.maximum(info[:, 1] - 1, 1)
                counts = np.bincount(info[:, 0])
                print(f"   items a block {counts.min()}-{counts.max()}, loop a tile (median, "
                      f"after the first) {np.median(per_tile):.2f} us")
                row.update(block=info[:, 0].tolist(), tiles=info[:, 1].tolist())
            results.append(row)
        del prep, launches, partition, problem
        dev.release()
    with open(out, "w") as f:
        json.dump(dict(device=dev.name, kernel=kernel, mixed=mixed, results=results), f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON this writes")
    ap.add_argument("--kernel", choices=sorted(KERNELS), default="transposed",
                    help="the kernel to stamp (default: transposed)")
    ap.add_argument("--shapes", default=None,
                    help="BxHxL[@spread],... in place of the kernel's own shapes (the library's "
                         "split, the bench's draw of lengths)")
    ap.add_argument("--model", action="store_true",
                    help="seesaw-runs: the cost model's runs (cut or whole), not the cut runs forced")
    ap.add_argument("--mixed", action=argparse.BooleanOptionalAction, default=None,
                    help="seesaw-runs: the model's choice with heuristics.MIXED_RUNS on "
                         "(--no-mixed: off; with --model alone, as the library has it)")
    ap.add_argument("--measure", action="store_true", help="(child) run in the patched copy")
    args = ap.parse_args()
    shapes = None if args.shapes is None else parse_shapes(args.shapes)
    if args.mixed is not None and args.kernel != "seesaw-runs":
        ap.error("--mixed / --no-mixed: only with --kernel seesaw-runs")
    if args.measure:
        return measure(args.out, args.kernel, shapes, args.model, args.mixed)
    with tempfile.TemporaryDirectory() as tmp:
        patched_copy(tmp, args.kernel)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [tmp] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
            NUMBA_MLA_CACHE_DIR=os.path.join(tmp, "kernels"))
        extra = ([] if args.shapes is None else ["--shapes", args.shapes]) + (
            ["--model"] if args.model else []) + (
            [] if args.mixed is None else ["--mixed" if args.mixed else "--no-mixed"])
        return subprocess.run([sys.executable, os.path.abspath(__file__), "--measure",
                               "--kernel", args.kernel, "--out", os.path.abspath(args.out)]
                              + extra, env=env, cwd=tmp).returncode


if __name__ == "__main__":
    sys.exit(main())
