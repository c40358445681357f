"""What the split-K cost model (numba_mla/heuristics.py) says about a batch, on the CPU: for
each configuration of the varlen sweep (lengths drawn as the bench draws them), or of
``--shapes``, the modelled time of each schedule the tensor-core backend has, in tile-times
(one 64-key tile of one block), and the one the library takes.

Columns: ``balanced`` (every sequence cut into pieces of one size, ``balanced_split``; P its
partitions), ``listed`` (each cut only as far as it needs, ``listed_split``; "-" where the
model refuses it), ``cut runs`` (one wave of persistent blocks walking runs across sequence
boundaries, ``run_schedule``, whatever the selector's bounds say), ``whole runs`` (whole
sequences packed longest first, ``whole_runs``; only past one (sequence, row group) pair a
multiprocessor), ``mixed runs`` (``mixed_runs``: runs that cut only the sequences that do
not fit, the uncut ones written out by their own items, so that only the cut ones pay the
workspace and the merge; ``heuristics.MIXED_RUNS``), then what ``runs_split``
and the selector take (``--mixed`` / ``--no-mixed``: with ``MIXED_RUNS`` on / off; by default
as the library has it). The model is the library's: it
has been 0-15% optimistic for the runs forms on an H100 (docs/performance.md), so a modelled
gain is a reason to build and time, not a measurement.

Usage: python scripts/schedule_model.py [--shapes 64x128x4096,...] [--spreads 0,0.25,0.5]
                                        [--sms 132] [--mixed | --no-mixed]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from numba_mla import heuristics as hz  # noqa: E402
from numba_mla.bench.configs import SPREADS, VARLEN_SHAPES, Config  # noqa: E402
from numba_mla.bench.problems import draw_lengths  # noqa: E402
from numba_mla.kernels.mma import BLOCK_M, BLOCK_N  # noqa: E402  (the seesaw kernel's too)


def report(cfg, sms):
    """One configuration's line: every schedule's modelled time and the model's choice."""
    lengths = draw_lengths(cfg)
    H = cfg.heads
    G = max(1, -(-H // BLOCK_M))
    tiles = -(-lengths.astype(np.int64) // BLOCK_N)
    share = hz.WORKSPACE_TILES * hz._row_share(H, G)
    chunk, parts = hz.balanced_split(lengths, BLOCK_N, G, sms=sms, rows=H)
    balanced = hz._balanced_cost(tiles, chunk, parts, G, sms, share)
    pieces = hz.listed_split(lengths, BLOCK_N, G, sms=sms, rows=H, balanced=(chunk, parts))
    listed = (None if pieces is None else
              hz._listed_cost(pieces, tiles, G, sms, share, hz.MERGE_TILES if parts == 1 else 0.0))
    other = balanced if listed is None else listed
    cut = hz.run_schedule(tiles, G, sms=sms)
    cut_cost = hz._runs_cost(cut, tiles, sms, share)
    whole = None
    if tiles.size * G > sms and G <= sms:
        whole = hz._whole_cost(hz.whole_runs(tiles, G, sms=sms), tiles)
    table = hz.runs_split(lengths, BLOCK_N, G, sms=sms, rows=H, balanced=(chunk, parts),
                          pieces=pieces)
    if table is None:
        taken = "listed" if listed is not None else f"balanced (P={parts})"
    elif hz.runs_partitions(table) == 1 and tiles.size * G > sms:
        taken = "whole runs"
    else:  # (with MIXED_RUNS the cut runs may be taken too, run by the mixed form)
        kind = "mixed" if hz.MIXED_RUNS and not np.array_equal(table, cut) else "cut"
        taken = f"{kind} runs (P={hz.runs_partitions(table)})"

    mixed = hz.mixed_runs(tiles, G, sms=sms, share=share)
    items = mixed[int(mixed[0, 0]):]
    ncut = int((np.bincount(items[items[:, 1] == 0, 0], minlength=tiles.size) > 1).sum())

    def rel(x):
        return "-" if x is None else f"{x:.1f} ({x / other:.3f})"

    return (f"{cfg.batch}x{H}x{cfg.seqlen} s={cfg.spread:g}: balanced {balanced:.1f} "
            f"(P={parts}), listed {'-' if listed is None else f'{listed:.1f}'}, cut runs "
            f"{rel(cut_cost)}, whole runs {rel(whole)}, mixed runs "
            f"{rel(hz._mixed_cost(mixed, tiles, sms, share))} ({ncut} of {tiles.size} "
            f"sequences cut); taken: {taken}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=None, help="BxHxL,... (default: the varlen sweep's)")
    ap.add_argument("--spreads", default=None, help="s,... (default: the varlen sweep's)")
    ap.add_argument("--sms", type=int, default=132, help="multiprocessors (H100, H200: 132)")
    ap.add_argument("--mixed", action=argparse.BooleanOptionalAction, default=None,
                    help="the library's choice with heuristics.MIXED_RUNS on (--no-mixed: off; "
                         "default: as the library has it)")
    args = ap.parse_args(argv)
    shapes = (VARLEN_SHAPES if args.shapes is None else
              [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")])
    spreads = SPREADS if args.spreads is None else [float(s) for s in args.spreads.split(",")]
    if args.mixed is not None:
        hz.MIXED_RUNS = args.mixed
    print(f"modelled tile-times on {args.sms} multiprocessors; in brackets, over the "
          f"schedule the runs replace (listed, else balanced); heuristics.MIXED_RUNS "
          + ("on" if hz.MIXED_RUNS else "off"))
    for B, H, L in shapes:
        for s in spreads:
            print(report(Config(B, H, L, spread=s, sweep="varlen"), args.sms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
