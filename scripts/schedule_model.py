"""What the split-K cost model (numba_mla/heuristics.py) says about a batch, on the CPU: for
each configuration of the varlen sweep (lengths drawn as the bench draws them), or of
``--shapes``, the modelled time of each schedule the tensor-core backend has, in tile-times
(one 64-key tile of one block), and the one the library takes.

Columns: ``balanced`` (every sequence cut into pieces of one size, ``balanced_split``; P its
partitions), ``listed`` (each cut only as far as it needs, ``listed_split``; "-" where the
model refuses it), ``cut runs`` (one wave of persistent blocks walking runs across sequence
boundaries, ``run_schedule``, whatever the selector's bounds say), ``whole runs`` (whole
sequences packed longest first, ``whole_runs``; only past one (sequence, row group) pair a
multiprocessor), then what ``runs_split`` and the selector take. ``--what-if`` adds a
schedule that is not built: runs that cut only the sequences that do not fit (longest first,
each whole into the least-loaded run where it fits under the cap, else that run filled to the
cap and the rest carried on), with the uncut sequences written out by their own block, so
that only the cut ones pay the workspace and the merge (docs/performance.md, "The runs
schedule", the next step). The model is the library's: it has been 0-15% optimistic for the
runs forms on an H100 (docs/performance.md), so a modelled gain is a reason to build and time,
not a measurement.

Usage: python scripts/schedule_model.py [--shapes 64x128x4096,...] [--spreads 0,0.25,0.5]
                                        [--sms 132] [--what-if]
"""
import argparse
import heapq
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from numba_mla import heuristics as hz  # noqa: E402
from numba_mla.bench.configs import SPREADS, VARLEN_SHAPES, Config  # noqa: E402
from numba_mla.bench.problems import draw_lengths  # noqa: E402

BLOCK_N = 64  # (the seesaw kernel's key tile)
BLOCK_M = 64  # (its rows a block: the row groups are ceil(H / 64))


def mixed_pack(tiles, nruns, cap):
    """The what-if packing: a list of ``nruns`` runs, each a list of items ``(b, t0, t1)``.
    Sequences longest first; each goes whole into the least-loaded run if it fits under
    ``cap`` (an item costs its tiles plus ``RUN_ITEM_TILES``), else that run is filled to the
    cap with a piece of it (at least ``RUN_MIN_PIECE`` tiles, leaving at least as many) and
    the rest goes on to the next least-loaded run; where no such cut exists the rest stays
    whole there (over the cap)."""
    item, least = hz.RUN_ITEM_TILES, hz.RUN_MIN_PIECE
    loads = [(0, r) for r in range(nruns)]
    runs = [[] for _ in range(nruns)]
    for b in np.argsort(-tiles, kind="stable").tolist():
        n, t = int(tiles[b]), 0
        while True:
            load, r = heapq.heappop(loads)
            room = cap - load - item
            take = n - t
            if take > room and room >= least and take - room >= least:
                take = room
            runs[r].append((b, t, t + take))
            heapq.heappush(loads, (load + take + item, r))
            t += take
            if t >= n:
                break
    return runs


def mixed_cost(runs, tiles, groups, sms, share):
    """The what-if's modelled time: the longest run (its items' tiles plus
    ``RUN_ITEM_TILES``, the first item's fixed cost the block's ``BLOCK_OVERHEAD_TILES``),
    the workspace of the cut sequences' items only (each row group's block) and the merge
    where any sequence is cut. Returns (time, cut sequences)."""
    pieces = np.zeros(tiles.size, np.int64)
    for run in runs:
        for b, _, _ in run:
            pieces[b] += 1
    longest = max(sum(t1 - t0 + hz.RUN_ITEM_TILES for _, t0, t1 in run) for run in runs)
    cut_items = int(pieces[pieces > 1].sum()) * groups
    ncut = int((pieces > 1).sum())
    return (longest + hz.BLOCK_OVERHEAD_TILES - hz.RUN_ITEM_TILES
            + (share * cut_items / sms + hz.MERGE_TILES if ncut else 0.0)), ncut


def mixed_best(tiles, groups, sms, share, span=64):
    """The what-if at the cap (from the work's lower bound, ``span`` caps up) whose modelled
    time is least: (time, cut sequences, cap)."""
    nruns = max(1, sms // groups)
    lo = max(1, -(-int(tiles.sum() + hz.RUN_ITEM_TILES * tiles.size) // nruns))
    best = None
    for cap in range(lo, lo + span):
        cost, ncut = mixed_cost(mixed_pack(tiles, nruns, cap), tiles, groups, sms, share)
        if best is None or cost < best[0]:
            best = (cost, ncut, cap)
    return best


def report(cfg, sms, what_if):
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
    else:
        taken = f"cut runs (P={hz.runs_partitions(table)})"

    def rel(x):
        return "-" if x is None else f"{x:.1f} ({x / other:.3f})"

    line = (f"{cfg.batch}x{H}x{cfg.seqlen} s={cfg.spread:g}: balanced {balanced:.1f} (P={parts}), "
            f"listed {'-' if listed is None else f'{listed:.1f}'}, cut runs {rel(cut_cost)}, "
            f"whole runs {rel(whole)}; taken: {taken}")
    if what_if:
        cost, ncut, cap = mixed_best(tiles, G, sms, share)
        line += f"; what-if {rel(cost)}, {ncut} of {tiles.size} sequences cut (cap {cap})"
    return line


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=None, help="BxHxL,... (default: the varlen sweep's)")
    ap.add_argument("--spreads", default=None, help="s,... (default: the varlen sweep's)")
    ap.add_argument("--sms", type=int, default=132, help="multiprocessors (H100, H200: 132)")
    ap.add_argument("--what-if", action="store_true",
                    help="add the runs that cut only what does not fit (not built)")
    args = ap.parse_args(argv)
    shapes = (VARLEN_SHAPES if args.shapes is None else
              [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")])
    spreads = SPREADS if args.spreads is None else [float(s) for s in args.spreads.split(",")]
    print(f"modelled tile-times on {args.sms} multiprocessors; in brackets, over the "
          f"schedule the runs replace (listed, else balanced)")
    for B, H, L in shapes:
        for s in spreads:
            print(report(Config(B, H, L, spread=s, sweep="varlen"), args.sms, args.what_if))
    return 0


if __name__ == "__main__":
    sys.exit(main())
