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
workspace and the merge; ``heuristics.MIXED_RUNS``; beside them, "merged by the last piece":
the same runs if each cut sequence's last piece merged it, a design built, timed slower on an
H100 and reverted: docs/performance.md), then what ``runs_split`` and the selector take
(``--mixed`` / ``--no-mixed``: with ``MIXED_RUNS`` on / off; by default as the library has
it). The model is the library's: it has been 0-15% optimistic for the runs forms on an H100
(docs/performance.md), so a modelled gain is a reason to build and time, not a measurement.

Usage: python scripts/schedule_model.py [--shapes 64x128x4096,...] [--spreads 0,0.25,0.5]
                                        [--sms 132] [--mixed | --no-mixed] [--bench JSON]
``--bench``: a bench run's varlen rows of ``"mma"`` beside the model, microseconds a modelled
tile-time of the schedule the model takes (with the flags as that run had them), FlashMLA's
beside: how far the model's costs are from the times, schedule by schedule.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from numba_mla import heuristics as hz  # noqa: E402
from numba_mla.bench.configs import SPREADS, VARLEN_SHAPES, Config  # noqa: E402
from numba_mla.cli import _parse_shapes  # noqa: E402
from numba_mla.bench.problems import draw_lengths  # noqa: E402
from numba_mla.kernels.mma import BLOCK_M, BLOCK_N  # noqa: E402  (the seesaw kernel's too)


def costs(cfg, sms, seed=0):
    """Every schedule's modelled time for one configuration (None where it has none), the
    model's choice (its name, its modelled time) and the sequences the mixed runs cut."""
    lengths = draw_lengths(cfg, seed)
    H = cfg.heads
    G = max(1, -(-H // BLOCK_M))
    tiles = -(-lengths.astype(np.int64) // BLOCK_N)
    share = hz.WORKSPACE_TILES * hz._row_share(H, G)
    chunk, parts = hz.balanced_split(lengths, BLOCK_N, G, sms=sms, rows=H)
    c = dict(balanced=hz._balanced_cost(tiles, chunk, parts, G, sms, share), parts=parts)
    pieces = hz.listed_split(lengths, BLOCK_N, G, sms=sms, rows=H, balanced=(chunk, parts))
    c["listed"] = (None if pieces is None else
                   hz._listed_cost(pieces, tiles, G, sms, share,
                                   hz.MERGE_TILES if parts == 1 else 0.0))
    c["other"] = c["balanced"] if c["listed"] is None else c["listed"]
    cut = hz.run_schedule(tiles, G, sms=sms)
    c["cut runs"] = hz._runs_cost(cut, tiles, sms, share)
    c["whole runs"] = None
    if tiles.size * G > sms and G <= sms:
        c["whole runs"] = hz._whole_cost(hz.whole_runs(tiles, G, sms=sms), tiles)
    mixed = hz.mixed_runs(tiles, G, sms=sms, share=share)
    c["mixed runs"] = hz._mixed_cost(mixed, tiles, sms, share)
    items = mixed[int(mixed[0, 0]):]
    per_seq = np.bincount(items[:, 0], minlength=tiles.size)  # (items of all row groups)
    c["ncut"] = int((per_seq > G).sum())  # (a row group's runs are the others', side by side)
    # The same runs where each cut sequence's last piece merges it (built, 1.014x the time on
    # an H100, reverted: docs/performance.md): one item of each cut (sequence, row group)
    # writes no workspace and the merge kernel goes; the merging block's reads of the other
    # pieces are left out.
    c["fold"] = (c["mixed runs"] - share * G * c["ncut"] / sms
                 - (hz.MERGE_TILES if c["ncut"] else 0.0))
    c["fold_pieces"] = int(per_seq.max(initial=0)) // G
    c["nseqs"] = tiles.size
    table = hz.runs_split(lengths, BLOCK_N, G, sms=sms, rows=H, balanced=(chunk, parts),
                          pieces=pieces)
    if table is None:
        kind, c["taken"] = ("listed", "listed") if c["listed"] is not None else (
            "balanced", f"balanced (P={parts})")
        c["taken_cost"] = c[kind]
        c["P"] = int(pieces.max()) if kind == "listed" else parts
    elif hz.runs_partitions(table) == 1 and tiles.size * G > sms:
        kind, c["taken"], c["taken_cost"], c["P"] = "whole", "whole runs", c["whole runs"], 1
    else:  # (with MIXED_RUNS the cut runs may be taken too, run by the mixed form)
        kind = "mixed" if hz.MIXED_RUNS and not np.array_equal(table, cut) else "cut"
        c["P"] = hz.runs_partitions(table)
        c["taken"] = f"{kind} runs (P={c['P']})"
        c["taken_cost"] = c[f"{kind} runs"]
    #: the name bench.providers.schedule_of gives a plan of this kind
    c["schedule"] = {"cut": "runs", "whole": "whole runs", "mixed": "mixed runs"}.get(kind, kind)
    return c


def report(cfg, sms):
    """One configuration's line: every schedule's modelled time and the model's choice."""
    c = costs(cfg, sms)

    def rel(x):
        return "-" if x is None else f"{x:.1f} ({x / c['other']:.3f})"

    listed = "-" if c["listed"] is None else f"{c['listed']:.1f}"
    return (f"{cfg.batch}x{cfg.heads}x{cfg.seqlen} s={cfg.spread:g}: balanced "
            f"{c['balanced']:.1f} (P={c['parts']}), listed {listed}, cut runs "
            f"{rel(c['cut runs'])}, whole runs {rel(c['whole runs'])}, mixed runs "
            f"{rel(c['mixed runs'])} ({c['ncut']} of {c['nseqs']} sequences cut, at most "
            f"{c['fold_pieces']} pieces; merged by the last piece {c['fold']:.1f}); "
            f"taken: {c['taken']}")


def against_bench(path, sms=None):
    """A bench JSON's varlen rows of the ``"mma"`` provider beside the model: for each
    configuration the schedule the model takes now (set the flags as the run had them), its
    modelled tile-times, the row's microseconds and partitions, microseconds a modelled
    tile-time, and the same for FlashMLA's row where the run has one. Markdown. A row whose
    partitions (or schedule, where the row names it) differ from the model's choice ran
    another schedule than the one costed: marked "(ran another)", its ratio meaningless.
    ``sms``: the run's multiprocessors unless given."""
    with open(path) as f:
        run = json.load(f)
    meta = run["meta"]
    sms = sms or meta.get("multiprocessors") or 132
    rows = [r for r in run["rows"] if r.get("sweep") == "varlen"]
    flash = {(r["batch"], r["heads"], r["seqlen"], r["spread"]): r["us"] for r in rows
             if r["provider"] == "flash_mla"}
    print(f"{meta['device']}, {meta['date']}, commit {meta['commit']} ({path}); the model "
          f"with heuristics.MIXED_RUNS {'on' if hz.MIXED_RUNS else 'off'}, {sms} "
          f"multiprocessors\n")
    print("| B x H x L | s | taken now | modelled | us (P) | us a tile-time | FlashMLA's |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if r["provider"] != "numba_mla" or r.get("backend") != "mma":
            continue
        key = (r["batch"], r["heads"], r["seqlen"], r["spread"])
        c = costs(Config(*key[:3], spread=key[3], sweep="varlen"), sms, meta.get("seed", 0))
        t = c["taken_cost"]
        fm = f"{flash[key] / t:.2f}" if key in flash else "-"
        other = (r.get("num_partitions") != c["P"]
                 or r.get("schedule", c["schedule"]) != c["schedule"])
        print(f"| {key[0]} x {key[1]} x {key[2]} | {key[3]:g} | {c['taken']} | {t:.1f} | "
              f"{r['us']:.1f} ({r.get('num_partitions')}) | {r['us'] / t:.2f}"
              f"{' (ran another)' if other else ''} | {fm} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=None, help="BxHxL,... (default: the varlen sweep's)")
    ap.add_argument("--spreads", default=None, help="s,... (default: the varlen sweep's)")
    ap.add_argument("--sms", type=int, default=None,
                    help="multiprocessors (default 132, the H100's and H200's; --bench: the run's)")
    ap.add_argument("--mixed", action=argparse.BooleanOptionalAction, default=None,
                    help="the library's choice with heuristics.MIXED_RUNS on (--no-mixed: off; "
                         "default: as the library has it)")
    ap.add_argument("--bench", default=None, metavar="JSON",
                    help="a bench JSON's varlen rows beside the model: microseconds a modelled "
                         "tile-time of the schedule taken")
    args = ap.parse_args(argv)
    shapes = VARLEN_SHAPES if args.shapes is None else _parse_shapes(args.shapes)
    spreads = SPREADS if args.spreads is None else [float(s) for s in args.spreads.split(",")]
    if args.mixed is not None:
        hz.MIXED_RUNS = args.mixed
    if args.bench:
        against_bench(args.bench, args.sms)
        return 0
    args.sms = args.sms or 132
    print(f"modelled tile-times on {args.sms} multiprocessors; in brackets, over the "
          f"schedule the runs replace (listed, else balanced); heuristics.MIXED_RUNS "
          + ("on" if hz.MIXED_RUNS else "off"))
    for B, H, L in shapes:
        for s in spreads:
            print(report(Config(B, H, L, spread=s, sweep="varlen"), args.sms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
