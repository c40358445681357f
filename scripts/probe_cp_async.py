"""Probe: which lane layout lets ``cp.async`` write a key tile into shared memory at Nsight
Compute's ideal count of wavefronts? (docs/kernels/mma_sync.md, "Next steps" item 9: the
warp tensor-core kernel's copies took 2.6x that ideal, 26% of its shared wavefronts; its
answer, plots/probe_cp_async_h100.txt: a ``cg`` copy into padded rows takes 2.6x, ``ca``,
aligned or swizzled rows the ideal, and the split-role form's stage is swizzled since.)

A block of 128 threads (the split-role form's V warps) copies tiles of 32 cache rows (576
16-bit values, 1,152 bytes, as they lie in a page) into a stage of rows 1,168 bytes apart
(the lockstep blocks' padding) or another layout, one tile after another, each waited for
and then read back by the block into an output (so that what landed is checked). Variants:

- ``lanes`` a row: 8 (the kernels': a warp-instruction writes 128 bytes of each of 4
  rows), 16 (256 bytes of 2 rows) or 32 (512 bytes of one row);
- the cache operator: ``cg`` (the kernels', L2 only) or ``ca`` (through L1);
- the zero-fill predicate: known at run time (``run``, as the kernels' copies have: a source
  size of 16 or 0) or the constant ``True`` (``const``: no source size to choose; a report on
  NVIDIA's forums had a conditional around cp.async cost its coalescing);
- the stage's layout: ``pad`` (the lockstep blocks': rows 1,168 bytes apart, so a row's 128-byte
  pieces start 16 bytes further into a 128-byte line each row), ``wide`` (rows 1,280 bytes
  apart: every piece on a 128-byte line, same banks every row) or ``xor`` (rows 1,152 bytes
  apart, every piece on a 128-byte line, its eight 16-byte units permuted by the row's low
  three bits, the swizzle of CUTLASS's tensor-core copies: ldmatrix's eight rows conflict-free).

Usage: python scripts/probe_cp_async.py [--variant LANES:OP[:PRED[:LAYOUT]]] [--tiles N] [--reps R]
(times every variant, or one, with CUDA events after a warm-up launch: each tile waited for
and read back, so the times are of a copy not overlapped with anything, not of the kernels'
copy cost; the wavefronts are the probe's point. Under Nsight Compute, one variant a run,
its first timed launch, as scripts/ncu_source.sh takes its reports: ``ncu --section
SourceCounters --kernel-name regex:copy_probe --launch-skip 1 --launch-count 1 -o R python
scripts/probe_cp_async.py --variant 8:cg:run --reps 1``, then ``ncu -i R.ncu-rep --page
source --csv --print-source sass``: each LDGSTS's "L1 Wavefronts Shared" and its "Ideal")
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from numba_mla import ptx  # noqa: E402  (before numba.cuda: numba_mla's environment shims)
from numba import cuda, int32  # noqa: E402

from numba_mla._compat import SIMULATOR  # noqa: E402
from numba_mla.kernels.mma_sync import CP_ASYNC16  # noqa: E402

ROWS, WORDS = 32, 288  # a tile's rows, 4-byte words a row
ROW_BYTES = {"pad": 1168, "wide": 1280, "xor": 1152}  # bytes from a stage row to the next
NT = 128  # threads a block
VARIANTS = ([(lanes, op, pred, "pad") for lanes in (8, 16, 32) for op in ("cg", "ca")
             for pred in ("run", "const")]
            + [(8, "cg", "run", "wide"), (8, "cg", "const", "wide")]
            + [(lanes, "cg", "run", "xor") for lanes in (8, 16, 32)] + [(8, "cg", "const", "xor")])


def make_kernel(lanes, op, pred="run", layout="pad"):
    """``copy_probe(src, out, tiles, nrows)``: block b copies tiles b, b + grid, ... of ``src``
    [n, 32, 288] int32 words into its stage and adds each landed word into ``out[b]`` [32,
    288]; with ``pred`` "run" rows from ``nrows`` on (32: none) are zero-filled, a predicate
    known only at run time, as the kernels' copies have ("const": every row copied); the
    stage's rows ``ROW_BYTES[layout]`` apart, with ``xor`` a row's 16-byte unit u at u ^ (row
    & 7)."""
    RUN = pred == "run"
    XOR = layout == "xor"
    RB = ROW_BYTES[layout]
    copy = CP_ASYNC16[op]
    rows_a_pass = NT // lanes  # rows one pass of the block writes
    pieces = 4 * WORDS // 16  # 16-byte pieces a row (72)
    per_lane = -(-pieces // lanes)  # a lane's pieces of a row (the last maybe not all lanes')

    @cuda.jit
    def copy_probe(src, out, tiles, nrows):
        words = cuda.shared.array(0, int32)
        base = ptx.smem_addr(words)
        tid = cuda.threadIdx.x
        for t in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):
            for j in range(ROWS // rows_a_pass):
                n = tid // lanes + rows_a_pass * j
                g = ptx.global_addr(src, t, n, 0)
                for u in range(per_lane):
                    p = tid % lanes + lanes * u
                    if p < pieces:
                        s = base + n * RB + 16 * ((p ^ (n & 7)) if XOR else p)
                        copy(words, s, g + 16 * p, (n < nrows) if RUN else True)
            ptx.cp_async_commit()
            ptx.cp_async_wait_all()
            cuda.syncthreads()
            for c in range(tid, ROWS * WORDS, NT):  # (every word as it landed)
                r, w = c // WORDS, c % WORDS
                u = ((w // 4) ^ (r & 7)) if XOR else w // 4
                out[cuda.blockIdx.x, r, w] += words[r * (RB // 4) + 4 * u + w % 4]
            cuda.syncthreads()

    return copy_probe


def run(lanes, op, tiles, blocks, rng=None, reps=1, pred="run", layout="pad"):
    """(out [blocks, 32, 288], the source, median ms of ``reps`` launches after a warm-up one)
    for one variant."""
    rng = np.random.default_rng(0) if rng is None else rng
    src = rng.integers(-2**20, 2**20, (tiles, ROWS, WORDS)).astype(np.int32)
    d_src = cuda.to_device(src)
    kernel = make_kernel(lanes, op, pred, layout)
    smem = ROWS * ROW_BYTES[layout]
    times = []
    for rep in range(reps + 1):
        d_out = cuda.to_device(np.zeros((blocks, ROWS, WORDS), np.int32))
        if SIMULATOR:  # (no events there: wall time)
            t0 = time.perf_counter()
            kernel[blocks, NT, 0, smem](d_src, d_out, tiles, ROWS)
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        start, stop = cuda.event(timing=True), cuda.event(timing=True)
        start.record()
        kernel[blocks, NT, 0, smem](d_src, d_out, tiles, ROWS)
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    return d_out.copy_to_host(), src, float(np.median(times[1:]))


def expected(src, blocks):
    """What ``out`` should hold: block b's sum of the tiles it copied."""
    out = np.zeros((blocks,) + src.shape[1:], np.int64)
    for t in range(src.shape[0]):
        out[t % blocks] += src[t]
    return out.astype(np.int32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", help="LANES:OP[:PRED[:LAYOUT]], e.g. 8:cg:run:xor (default: every one)")
    ap.add_argument("--tiles", type=int, default=2 if SIMULATOR else 132 * 256)
    ap.add_argument("--reps", type=int, default=1 if SIMULATOR else 5, help="timed launches")
    args = ap.parse_args()
    blocks = 1 if SIMULATOR else 132
    if args.variant:
        parts = args.variant.split(":")
        variants = [(int(parts[0]), parts[1], parts[2] if len(parts) > 2 else "run",
                     parts[3] if len(parts) > 3 else "pad")]
    else:
        variants = VARIANTS
    for lanes, op, pred, layout in variants:
        out, src, ms = run(lanes, op, args.tiles, blocks, reps=args.reps, pred=pred, layout=layout)
        ok = np.array_equal(out, expected(src, blocks))
        gbps = args.tiles * ROWS * WORDS * 4 / ms / 1e6
        print(f"lanes {lanes:2} {op} {pred:5} {layout:4}: {'right' if ok else 'WRONG'}, {ms:.3f} ms, "
              f"{gbps:.0f} GB/s")


if __name__ == "__main__":
    main()
