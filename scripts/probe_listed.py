"""Time configurations under the listed schedule forced at given targets, beside the
library's own choice, in one process (a probe of the cost model: docs/performance.md).

Usage (on a GPU machine): python scripts/probe_listed.py OUT.json B,H,L,s:T1,T2,... [...]
    each argument after OUT.json is a varlen configuration (lengths drawn as the bench
    draws them) and the targets to force; ``none`` as a target is the library's choice.
    A forced target T cuts sequence b into ceil(tiles_b / T) pieces (at least one).
Prints one line a run and writes every row, with its ``forced_target``, to OUT.json.
"""
import json
import sys

import numpy as np

from numba_mla import bench, heuristics


def forced(target):
    """listed_split's stand-in: ``target`` tiles a piece at most, whatever the model says."""
    def listed_split(keys, block_n, *args, **kwargs):
        tiles = -(-np.asarray(keys, np.int64) // block_n)
        return np.maximum(1, -(-tiles // target)).astype(np.int32)
    return listed_split


def main(argv):
    out, specs = argv[0], argv[1:]
    own = heuristics.listed_split
    result, rows = None, []
    for spec in specs:
        shape, targets = spec.split(":")
        B, H, L, s = shape.split(",")
        for t in targets.split(","):
            target = None if t == "none" else int(t)
            heuristics.listed_split = own if target is None else forced(target)
            cfg = bench.Config(int(B), int(H), int(L), spread=float(s), sweep="probe")
            result = bench.run([cfg], providers="numba_mla:mma", progress=False,
                               log=lambda *a: None)
            for row in result["rows"]:
                row["forced_target"] = target
                rows.append(row)
                print(B, H, L, s, "target", target, "P", row.get("num_partitions"),
                      "us %.1f" % row["us"], flush=True)
    heuristics.listed_split = own
    if result is not None:
        result["rows"] = rows
        with open(out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
