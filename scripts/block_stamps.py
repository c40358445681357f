"""Where a block's time goes, block by block: a diagnostic build of a kernel that reads the
GPU's global timer (``%globaltimer_lo``, nanoseconds) at points of every block and writes the
readings into the block's own results (which are then wrong: this is a measurement, never a
result).

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

For each shape the partition kernel alone is launched once after the bench's L2 flush, three
times, and the percentiles over blocks (0, 10, 50, 90, 100) of each point, in microseconds
after the earliest entry, are printed and written to ``--out`` (JSON) with every block's
readings.

Usage (on a GPU machine, in the repository root):
    python scripts/block_stamps.py --out stamps.json [--kernel seesaw|seesaw-runs]
                                   [--shapes 64x128x4096@0.25,128x128x1024] [--model] [--[no-]mixed]

The build is a patched copy of the package in a temporary folder: the patch names the lines
it inserts after, and stops with the line it did not find when the kernel's module has
changed under it (tests/test_block_stamps.py checks that both patches apply). The committed
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
    ("                         part_out, part_lse, tmap_q, tmap_kv):\n"
     "        b, r0, p, nparts, run = block_work(chunk)\n", "        st0 = _gtimer()\n"),
    ("        if tid == 0 and t0 < t_end and loaded < 2:  # the queries, then the first pair's",
     "<before>        stw = _gtimer()\n        stq = stw\n        sts = stw\n"),
    ("            while not ptx.mbar_try_wait(smk, qbar, qphase):\n                pass\n",
     "            stq = _gtimer()\n"),
    ("                    scores(s_acc, mx, k0, k1, q_lo, q_hi, nrows, b, r0, length, nq, qscale,",
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
    if kernel == "seesaw":
        groups = [lse[:, h0:h0 + npoints, :] for h0 in range(0, H, 64)]  # (Sq = 1: r0 = h0)
        st = np.concatenate([g.transpose(0, 2, 1).reshape(-1, npoints) for g in groups])
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
    for B, H, L, P, spread in shapes:
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
        want = {"seesaw": "partition", "seesaw-runs": "runs"}.get(kernel)
        if want and want not in name:
            sys.exit(f"block_stamps: {cfg.label} did not run the {kernel} kernel ({name})")
        unit = "items" if kernel == "seesaw-runs" else "blocks"
        for rep in range(3):
            event_us = time_gpu(dev, partition, 1, 1, settings.flush_bytes)[0]
            st, info = block_stamps(kernel, partition, H, len(points))
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
