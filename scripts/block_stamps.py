"""Where a transposed-kernel block's time goes, block by block: a diagnostic build of
kernels/transposed.py that reads the GPU's global timer (``%globaltimer_lo``, nanoseconds) at
five points of every block and writes the readings over dims 0-4 of the block's first output
row (the partition's results are then wrong: this is a measurement, never a result).

The points: entry; Q's image in place (the prologue's barrier); the first tile's rows in place
(the loop's first barrier); the loop's end; the epilogue's end (thread 0's stores issued).
For each shape the partition kernel alone is launched once after the bench's L2 flush, three
times, and the percentiles over blocks (0, 10, 50, 90, 100) of each point, in microseconds
after the earliest entry, are printed and written to ``--out`` (JSON) with every block's
readings.

Usage (on a GPU machine, in the repository root):
    python scripts/block_stamps.py --out stamps.json

The build is a patched copy of the package in a temporary folder: the patch names the lines
it inserts after, and stops with the line it did not find when kernels/transposed.py has
changed under it. (The committed stamps, plots/block_stamps_transposed_*, were taken by this
script's first form, with the same five points and shapes; this form has not yet run on a
GPU.)
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
PATCH = [
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
POINTS = ("entry", "q ready", "tile0 in", "loop end", "end")
SHAPES = ((64, 16, 4096, None), (128, 16, 8192, None), (64, 16, 1024, 4), (64, 16, 256, 4))


def patched_copy(dst):
    """The package, with the stamps in transposed.py, under ``dst``."""
    shutil.copytree(os.path.join(ROOT, "numba_mla"), os.path.join(dst, "numba_mla"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = os.path.join(dst, "numba_mla", "kernels", "transposed.py")
    src = open(path, encoding="utf-8").read()
    for anchor, after in PATCH:
        if src.count(anchor) < 1:
            sys.exit(f"block_stamps: kernels/transposed.py has changed: no line {anchor!r}")
        if after is None:  # before the anchor: the loop's end
            src = src.replace(anchor, "        st3 = _gtimer()\n" + anchor, 1)
        else:
            src = src.replace(anchor, anchor + after, 1)
    open(path, "w", encoding="utf-8").write(src)


def measure(out):
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
    for B, H, L, P in SHAPES:
        cfg = Config(B, H, L, kv="e4m3", num_partitions=P)
        problem = make_problem(cfg, dev, rng, settings, 0)
        prep = prov.prepare(problem)
        launches = prep.run.__self__.launches  # (the plan's: ..., partition, combine)
        if len(launches) < 2:
            sys.exit(f"block_stamps: {cfg.label} runs in one partition (no combine): the "
                     "stamps would overwrite the output itself; pick a split shape")
        partition = launches[-2]
        part_out = partition.args[8]
        for rep in range(3):
            event_us = time_gpu(dev, partition, 1, 1, settings.flush_bytes)[0]
            a = part_out.copy_to_host()
            st = np.ascontiguousarray(a[:, 0, :, :5]).view(np.uint32).astype(np.int64)
            st = st.reshape(-1, 5)
            rel = ((st - st[:, 0].min()) % (1 << 32)) / 1000.0
            print(f"{cfg.label} rep {rep}: the kernel {event_us:.1f} us between events, "
                  f"{len(st)} blocks; percentiles 0/10/50/90/100 over blocks, us")
            for i, name in enumerate(POINTS):
                q = np.percentile(rel[:, i], [0, 10, 50, 90, 100])
                print(f"   {name:<9}" + " ".join(f"{v:6.1f}" for v in q))
            results.append(dict(shape=cfg.label, rep=rep, event_us=event_us, points=POINTS,
                                stamps_us=rel.tolist()))
        del prep, launches, partition, part_out, problem
        dev.release()
    with open(out, "w") as f:
        json.dump(dict(device=dev.name, results=results), f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON this writes")
    ap.add_argument("--measure", action="store_true", help="(child) run in the patched copy")
    args = ap.parse_args()
    if args.measure:
        return measure(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        patched_copy(tmp)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [tmp] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
            NUMBA_MLA_CACHE_DIR=os.path.join(tmp, "kernels"))
        return subprocess.run([sys.executable, os.path.abspath(__file__), "--measure",
                               "--out", os.path.abspath(args.out)], env=env, cwd=tmp).returncode


if __name__ == "__main__":
    sys.exit(main())
