"""Where a kernel's time goes, region by region, from the per-instruction page that
``scripts/ncu_source.sh`` writes (Nsight Compute's source page as CSV, one row per SASS
instruction with its stall samples and executions).

Usage: python scripts/ncu_regions.py OUT/ncu_B_H_L.csv

The SASS is cut at every block barrier (``BAR.SYNC``) and around every innermost loop (the
instructions between a backward branch's target and the branch); each region gets its share
of the stall samples (time) and of the executed instructions, how fast it issues against the
kernel's average (1.0 = average; below: it waits more), how many times its instructions ran
(warp executions, the median over those that ran at all: the block's count of warps for code
that runs once a block, that times the tiles for code run every tile, more for a spin loop),
its commonest stall reasons (share of its samples) and opcodes (share of its instructions).
The figures the README quotes for the FMA kernel come from this table.
"""
import argparse
import collections
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
BRANCH = re.compile(r"\bBRA\s+(?:0x)?([0-9a-fA-F]+)")


def read(path):
    """Rows of the CSV as (address, instruction, samples, executed, {stall: samples})."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    names = rows[header]
    col = {n: i for i, n in enumerate(names)}
    stalls = [n for n in names if n.startswith("stall_") and "Not Issued" not in n]
    out = []
    for r in rows[header + 1:]:
        if len(r) < len(names):
            continue
        out.append((int(r[0], 16), r[col["Source"]].strip(), int(r[col[SAMPLES]] or 0),
                    int(r[col[EXECUTED]] or 0),
                    {s[len("stall_"):]: int(r[col[s]] or 0) for s in stalls}))
    return out


def opcode(instruction):
    words = instruction.split()
    if words and words[0].startswith("@"):  # predicate
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def regions(instructions):
    """Cut points (instruction indices) and a name for each region they start."""
    index = {a: i for i, (a, *_rest) in enumerate(instructions)}
    loops = []
    for i, (a, text, *_rest) in enumerate(instructions):
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in index:
            loops.append((index[int(m.group(1), 16)], i))
    innermost = [(lo, hi) for lo, hi in loops
                 if not any(lo <= l2 and h2 <= hi and (l2, h2) != (lo, hi) for l2, h2 in loops)]
    cuts = {0: "start"}
    for lo, hi in innermost:
        cuts[lo] = "loop"
        cuts.setdefault(hi + 1, "after loop")
    for i, (_a, text, *_rest) in enumerate(instructions):
        if text.startswith("BAR.SYNC") or " BAR.SYNC" in text:
            cuts[i] = "barrier"
            cuts.setdefault(i + 1, "after barrier")
    return sorted((i, name) for i, name in cuts.items() if i < len(instructions))


def table(instructions, top=4):
    """One line per region: offset, name, % samples, % executed, relative issue rate, runs
    (the median warp executions of its instructions that ran), top stalls, top opcodes."""
    total_s = sum(x[2] for x in instructions) or 1
    total_e = sum(x[3] for x in instructions) or 1
    base = instructions[0][0] if instructions else 0
    cuts = regions(instructions)
    lines = []
    for k, (start, name) in enumerate(cuts):
        end = cuts[k + 1][0] if k + 1 < len(cuts) else len(instructions)
        part = instructions[start:end]
        samples = sum(x[2] for x in part)
        executed = sum(x[3] for x in part)
        if not samples and not executed:
            continue
        stalls = collections.Counter()
        ops = collections.Counter()
        for _a, text, _s, e, st in part:
            stalls.update(st)
            ops[opcode(text)] += e
        rate = (executed / total_e) / (samples / total_s) if samples else float("inf")
        ran = sorted(x[3] for x in part if x[3])
        lines.append(dict(
            offset=part[0][0] - base, name=name, samples=samples / total_s,
            executed=executed / total_e, rate=rate, runs=ran[len(ran) // 2] if ran else 0,
            stalls=[(s, v / samples) for s, v in stalls.most_common(top) if samples and v],
            ops=[(o, v / executed) for o, v in ops.most_common(top) if executed and v]))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="the CSV that scripts/ncu_source.sh wrote")
    ap.add_argument("--min", type=float, default=0.005,
                    help="leave out regions with a smaller share of samples and instructions")
    args = ap.parse_args(argv)
    print(f"{'offset':>7} {'region':<14} {'samples':>8} {'instr':>7} {'issue':>6} {'runs':>7}  "
          "stalls; opcodes")
    for r in table(read(args.csv)):
        if max(r["samples"], r["executed"]) < args.min:
            continue
        stalls = ", ".join(f"{s} {v:.0%}" for s, v in r["stalls"])
        ops = ", ".join(f"{o} {v:.0%}" for o, v in r["ops"])
        print(f"{r['offset']:>7x} {r['name']:<14} {r['samples']:>8.1%} {r['executed']:>7.1%} "
              f"{r['rate']:>6.2f} {r['runs']:>7}  {stalls}; {ops}")


if __name__ == "__main__":
    sys.exit(main())
