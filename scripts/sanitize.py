"""Run the kernels under compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over a
representative set of configurations, and print a summary table.

Usage (on a GPU machine):  python scripts/sanitize.py [--tools memcheck,racecheck] [--out FILE]
                                                     [--backend mma] [--fp8] [--log FILE]
                                                     [--hazards] [--selector FLAG[=0|1]]
                                                     [--set MODULE.FLAG[=0|1]]
Each tool runs the whole case list in one child process (``--cases``), checked against the
reference so that a sanitizer-clean wrong answer still fails. ``--log``: every tool's whole
output into FILE (the summary prints only the end of a failing one); ``--hazards``: racecheck
lists each hazard with its threads and shared address (``--racecheck-report hazard``);
``--selector``: a numba_mla.selector flag set (to True, or 0 / 1) in the children first;
``--set``: the same for a flag of another module of numba_mla (``kernels.mma_sync_roles.SCORE_QUARTERS``).
The device needs numba_mla importable in the child (run from the checkout with
``PYTHONPATH=$PWD``).
"""
import argparse
import os
import re
import subprocess
import sys
import time

#: (backend, B, H, L, Sq, dtype, cache, page, mask, P, ragged): for each backend every mask,
#: both caches, page sizes 1 and 64, odd lengths, Sq 1 and 2, one and many partitions, skipped
#: tiles, empty rows, spread lengths under the balanced schedule; the FMA kernel's two row-block
#: sizes and fp32 storage.
_SHAPES = [
    (2, 16, 97, 1, "bf16", "paged", 64, "null", None, False),
    (2, 16, 65, 2, "fp16", "paged", 1, "causal", 7, False),
    (1, 128, 129, 1, "bf16", "contiguous", 0, "window", 1, False),
    (3, 3, 70, 2, "fp32", "paged", 64, "chunked_causal", 40, True),
    (2, 16, 300, 1, "bf16", "paged", 64, "bias", 3, False),
    (2, 5, 201, 2, "fp16", "contiguous", 0, "chunked", 1, False),
    (3, 2, 133, 1, "bf16", "paged", 1, "user_fn", 50, True),
    (2, 48, 257, 2, "fp16", "paged", 64, "causal|chunked", None, False),
    # the balanced split-K schedule: spread lengths, partitions left empty by short sequences
    (8, 16, 1000, 1, "bf16", "paged", 64, "null", None, False),
    (6, 16, 2000, 2, "bf16", "contiguous", 0, "window", None, True),
]
#: Every kernel backend, and the warp split-K kernels (decoding_warp_split_k: each called
#: with the backend numba_mla.selector.WARP_SPLIT_ASKS names); the tensor-core kernels and
#: the FMA kernel's warp split-K take bf16 where a shape is fp32.
BACKENDS = ("simt", "mma", "mma_sync", "simple", "simt_warpsplit", "warpsplit")
SIXTEEN_BIT = ("mma", "mma_sync", "simt_warpsplit")
CASES = [(backend, *c[:4], "bf16" if backend in SIXTEEN_BIT and c[4] == "fp32" else c[4],
          *c[5:])
         for backend in BACKENDS[:5] for c in _SHAPES]
#: FP8 caches (the last field: the layout) in the kernels that read them: both layouts, the
#: warp tensor-core kernel's 16- and 32-row blocks, a split, a partial last tile; under
#: "mma", the transposed kernel's 16-row block (16 rows or fewer: the first and the last)
#: and its 32-row block (32 rows).
_FP8_SHAPES = [
    (2, 16, 97, 1, "bf16", "paged", 64, "causal", None, False, "e4m3"),
    (2, 20, 130, 1, "fp16", "contiguous", 0, "window", 2, False, "v32"),
    (1, 16, 300, 2, "bf16", "paged", 16, "null", 3, False, "e4m3"),
    (3, 4, 400, 1, "fp16", "contiguous", 0, "window", 3, False, "e4m3"),
]
CASES += [(backend, *c) for backend in ("simt", "mma_sync", "simple", "warpsplit")
          for c in _FP8_SHAPES]
CASES += [("mma", *c) for c in _FP8_SHAPES if c[-1] == "e4m3"]  # (wgmma: "e4m3" rows only)
#: and the transposed kernel on pages of 16 keys (its copy looks up each 16-byte piece's row),
#: its 32-row block with a partial block (2 tokens x 12 heads: 24 rows), its 64-row block of
#: two warpgroups with a partial second block (72 heads on pages of 16), and on pages of 64 the
#: seesaw kernel on "e4m3" rows (72 heads), the last three under a causal mask; then the
#: seesaw kernel in one partition of 11 tiles, so that both buffers are refilled five times,
#: on "e4m3" rows and on bf16 rows
CASES += [("mma", 2, 8, 150, 1, "bf16", "paged", 16, "null", 2, False, "e4m3"),
          ("mma", 2, 12, 200, 2, "fp16", "paged", 64, "causal", 2, False, "e4m3"),
          ("mma", 2, 72, 200, 1, "fp16", "paged", 16, "causal", 2, False, "e4m3"),
          ("mma", 2, 72, 200, 1, "fp16", "paged", 64, "causal", 2, False, "e4m3"),
          ("mma", 1, 128, 700, 1, "bf16", "contiguous", 0, "null", 1, False, "e4m3"),
          ("mma", 1, 128, 700, 1, "bf16", "contiguous", 0, "null", 1, False)]


def run_cases(only=None, fp8_only=False):
    import numpy as np

    import numba_mla as nm
    from numba_mla import testing, validate
    from numba_mla.selector import WARP_SPLIT_ASKS

    rng = np.random.default_rng(0)
    bad = 0
    for backend, B, H, L, Sq, dt, cache, page, mask, P, ragged, *kv in CASES:
        if (only and backend != only) or (fp8_only and not kv):
            continue
        lengths = testing.random_lengths(rng, B, Sq, L)
        lengths[-1] = L
        p = testing.make_problem(rng, B, Sq, H, lengths, testing.DTYPES[dt], cache, page or 16,
                                 ragged=ragged)
        if kv:  # the cache quantized: the reference reads its codes' exact values
            p = testing.with_fp8_cache(p, kv[0])
        m = validate.MASKS[mask](p, rng)
        out = np.full(p.out_shape, np.nan, p.dtype)
        if backend in WARP_SPLIT_ASKS:  # decoding_warp_split_k
            plan = p.warp_split_plan(m, None, P, out, WARP_SPLIT_ASKS[backend])
            assert plan.spec.backend == backend, plan.spec.backend
            plan.launch()
            res = plan.result()
        else:
            res = p.run(nm, mask=m, return_lse=True, num_partitions=P, out=out, backend=backend)
        ref = p.run(nm.reference, mask=m, return_lse=True)
        err = float(np.nanmax(np.abs(res[0].astype(np.float64) - ref[0])))
        ok = np.array_equal(np.isfinite(res[0]), np.isfinite(ref[0])) and err < 0.05
        bad += not ok
        print(f"case {backend} B={B} H={H} L={L} Sq={Sq} {dt}{'/' + kv[0] if kv else ''} "
              f"{cache}/{page} {mask} P={P}: "
              f"max err {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", action="store_true", help="(child) run the cases")
    ap.add_argument("--tools", default="memcheck,racecheck,synccheck,initcheck")
    ap.add_argument("--out", default=None, help="also write the summary here")
    ap.add_argument("--backend", default=None, choices=BACKENDS,
                    help="only this backend's cases")
    ap.add_argument("--fp8", action="store_true", help="only the FP8 cases")
    ap.add_argument("--log", default=None, help="every tool's whole output into this file")
    ap.add_argument("--hazards", action="store_true",
                    help="racecheck: each hazard with its threads and address")
    ap.add_argument("--selector", action="append", default=[], metavar="FLAG[=0|1]",
                    help="set numba_mla.selector.FLAG first, to True or to the value given "
                         "(e.g. MMA_SYNC_ROLES=0: the mma_sync kernel's lockstep 32-row "
                         "block; MMA_SYNC_ROLES_THREE_STAGES: a form that is off)")
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.FLAG[=0|1]",
                    help="the same for numba_mla.MODULE.FLAG (e.g. kernels.mma_sync_roles.SCORE_QUARTERS)")
    args = ap.parse_args()
    import importlib

    for option, item in ([("--selector", "selector." + i) for i in args.selector]
                         + [("--set", i) for i in args.set]):
        name, _, value = item.partition("=")
        path, _, flag = name.rpartition(".")
        try:
            module = importlib.import_module("numba_mla." + path)
        except ImportError:
            module = None
        if not path or module is None or not hasattr(module, flag):
            ap.error(f"{option}: numba_mla.{name} does not exist")
        if value not in ("", "0", "1"):
            ap.error(f"{option}: {item!r}: the value is 0 or 1")
        setattr(module, flag, value != "0")
    if args.cases:
        sys.exit(1 if run_cases(args.backend, args.fp8) else 0)
    env = dict(os.environ, NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS="0", PYTHONUNBUFFERED="1")
    rows = []
    for tool in args.tools.split(","):
        t0 = time.time()
        report = (["--racecheck-report", "hazard"] if tool == "racecheck" and args.hazards
                  else [])
        cmd = ["compute-sanitizer", "--tool", tool, *report, "--target-processes", "all",
               sys.executable, __file__, "--cases"] + (
                   ["--backend", args.backend] if args.backend else []) + (
                   ["--fp8"] if args.fp8 else []) + [
                   a for flag in args.selector for a in ("--selector", flag)] + [
                   a for flag in args.set for a in ("--set", flag)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        text = r.stdout + r.stderr
        if args.log:
            with open(args.log, "a") as f:
                f.write(f"===== {tool}: {' '.join(cmd)}\n{text}\n")
        # memcheck/synccheck/initcheck: "ERROR SUMMARY: N errors";
        # racecheck: "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)"
        m = (re.search(r"ERROR SUMMARY: (\d+) error", text)
             or re.search(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error", text))
        errors = int(m.group(1)) if m else None
        if errors is None:
            print(text[-3000:])
        wrong = text.count("WRONG")
        rows.append((tool, errors, wrong, r.returncode, time.time() - t0))
        if errors or wrong or r.returncode:
            print(text[-4000:])
    lines = [f"{'tool':<10} {'errors':>7} {'wrong':>6} {'rc':>3} {'seconds':>8}"]
    lines += [f"{t:<10} {str(e):>7} {w:>6} {rc:>3} {s:8.0f}" for t, e, w, rc, s in rows]
    cases = [c for c in CASES if args.backend in (None, c[0]) and (not args.fp8 or len(c) > 11)]
    lines.append(f"{len(cases)} cases per tool: " + "; ".join(
        f"{c[0]} B={c[1]} H={c[2]} L={c[3]} Sq={c[4]} {c[5]}{'/' + c[11] if len(c) > 11 else ''} "
        f"{c[6]}/{c[7]} {c[8]} P={c[9]}"
        for c in cases))
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    sys.exit(0 if all(e == 0 and w == 0 and rc == 0 for _, e, w, rc, _ in rows) else 1)


if __name__ == "__main__":
    main()
