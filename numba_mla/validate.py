"""``numba-mla validate``: a sweep of configurations, each kernel result checked against the
float64 reference.

A case passes when (the three-way check) the kernel's largest error against float64 is
at most twice that of a same-precision NumPy run (fp32 arithmetic, output rounded to the
storage dtype) plus a few fp32 ulps of the largest value (``testing.FLOOR_ULPS``: summation
order, and the tensor cores' truncating accumulation), for both out and lse; when NaN/inf
sit exactly where the reference has them
(``out`` is pre-filled with NaN, so an unwritten element fails); and never otherwise. Cache
slots past each length hold NaN and unused block-table entries a huge page index.
"""
import itertools
import time
from dataclasses import dataclass

import numpy as np

import numba_mla as nm

from . import _compat, testing

#: Masks by id: ``make(problem, rng)`` gives what a user passes.
MASKS = {
    "null": lambda p, rng: nm.NullMask(),
    "causal": lambda p, rng: nm.CausalMask(),
    "window": lambda p, rng: nm.SlidingWindowCausalMask(max(1, int(p.lengths.max()) // 3)),
    "chunked": lambda p, rng: nm.ChunkedMask(7),
    "chunked_causal": lambda p, rng: nm.ChunkedCausalMask(5),
    "bias": lambda p, rng: nm.MaterializedMask(testing.make_bias(rng, p, per_head=True)),
    "user_fn": lambda p, rng: (lambda b, h, q_pos, k: (k + h) % 3 != 1 or k == q_pos),
    "causal|chunked": lambda p, rng: nm.CausalMask() | nm.ChunkedMask(4),
}
#: Score mods by id.
SCORE_MODS = {
    "identity": lambda p: nm.IdentityScoreMod(),
    "alibi": lambda p: nm.AlibiScoreMod(p.heads),
    "softcap": lambda p: nm.SoftCapScoreMod(2.0),
    "user_fn": lambda p: (lambda s, b, h, q_pos, k: s * 0.75 - 0.01 * (q_pos - k)),
}


@dataclass(frozen=True)
class Case:
    B: int
    H: int
    Sq: int
    L: int
    dtype: str
    cache: str
    page: int
    mask: str
    score_mod: str
    P: object  # None (heuristic) or an int
    ragged: bool = False
    backend: str = "auto"


def cases(full):
    """The sweep. Simulator-sized unless ``full``: every mask, score mod, dtype and cache kind
    appears, in tiny shapes (a simulated case costs seconds)."""
    if not full:
        dts, masks, mods = ["bf16", "fp16", "fp32"], list(MASKS), list(SCORE_MODS)
        out = []
        for j, mask in enumerate(masks):
            out.append(Case(2, 2, 1 + j % 2, 21, dts[j % 3], ("paged", "contiguous")[j % 2],
                            (1, 5)[j % 2], mask, mods[j % len(mods)], (None, 3, 9)[j % 3],
                            ragged=j == 5))
        return out
    out = []
    for (B, H, L), Sq, dt in itertools.product(
            [(1, 128, 8191), (4, 16, 4097), (16, 128, 1023), (64, 16, 257), (3, 1, 65)], [1, 2],
            ["bf16", "fp16", "fp32"]):
        out.append(Case(B, H, Sq, L, dt, "paged", 64, "null", "identity", None))
    for j, (mask, mod) in enumerate(itertools.product(MASKS, SCORE_MODS)):
        out.append(Case(4, (16, 128, 1, 16)[j % 4], 1 + j % 2, 777, ("bf16", "fp16")[j % 2],
                        ("paged", "contiguous")[j % 2], (1, 16, 64, 128)[j % 4], mask, mod,
                        (None, 1, 7, 1000)[j % 4], ragged=j % 5 == 0))
    return out


#: Why ``validate --full`` does not run on the simulator (the command line prints it).
FULL_ON_SIMULATOR = (
    "numba-mla validate: --full is refused on the CUDA simulator. Its cases are GPU-sized "
    "(up to B=1, H=128, L=8191 and B=64, H=16): the simulator runs every thread of every "
    "block in Python, one block at a time (a block barrier alone costs a few ms), so one "
    "such case takes hours and the sweep days. Run `numba-mla validate` (--quick, the "
    "simulator-sized sweep: every mask, score mod, dtype and cache kind, under a minute) "
    "here, and --full on a GPU.")


def kernel_of(case):
    """The kernel a case runs: ``backend="auto"`` resolved for the case's dtype."""
    from . import factory, launch

    if case.backend == "reference":
        return "reference"
    return launch.resolve_backend(case.backend, factory.dtype_tag(testing.DTYPES[case.dtype]))


def run_case(case, seed=0):
    """Run one case; returns a dict row (errors, pass/fail, seconds)."""
    rng = np.random.default_rng(seed)
    lengths = testing.random_lengths(rng, case.B, case.Sq, case.L, zero=case.B > 2)
    lengths[-1] = case.L  # the longest length is always present
    p = testing.make_problem(rng, case.B, case.Sq, case.H, lengths, testing.DTYPES[case.dtype],
                             case.cache, case.page, ragged=case.ragged)
    mask, mod = MASKS[case.mask](p, rng), SCORE_MODS[case.score_mod](p)
    kw = dict(mask=mask, score_mod=mod, return_lse=True)
    golden = p.run(nm.reference, **kw)
    same = p.run(nm.reference, compute_dtype=np.float32, **kw)
    same = (same[0].astype(p.dtype), same[1])
    out = np.full(p.out_shape, np.nan, p.dtype)
    t0 = time.perf_counter()
    res = p.run(nm, out=out, num_partitions=case.P, backend=case.backend, **kw)
    seconds = time.perf_counter() - t0
    row = dict(case=case, seconds=seconds, error=None, kernel=kernel_of(case))
    for name, a, s, g in (("out", res[0], same[0], golden[0]), ("lse", res[1], same[1], golden[1])):
        a, s, g = (np.asarray(x, np.float64) for x in (a, s, g))
        fin = np.isfinite(g)
        scale = max(float(np.abs(g[fin]).max(initial=0.0)), 1e-30)
        row[f"{name}_err"] = float(np.abs(a[fin] - g[fin]).max(initial=0.0))
        row[f"{name}_rel"] = row[f"{name}_err"] / scale
        row[f"{name}_ref_err"] = float(np.abs(s[fin] - g[fin]).max(initial=0.0))
        row[f"{name}_nonfinite_ok"] = bool(np.array_equal(np.isfinite(a), fin)
                                           and np.array_equal(np.isnan(a), np.isnan(g)))
        row[f"{name}_floor"] = testing.fp32_floor(g, row["kernel"])
    row["pass"] = all(row[f"{n}_nonfinite_ok"]
                      and row[f"{n}_err"] <= 2 * row[f"{n}_ref_err"] + row[f"{n}_floor"]
                      for n in ("out", "lse"))
    return row


def _fmt(row):
    c = row["case"]
    shape = f"{c.B}x{c.H}x{c.L} Sq={c.Sq}{' ragged' if c.ragged else ''}"
    status = "PASS" if row["pass"] else ("ERROR" if row["error"] else "FAIL")
    head = (f"{shape:<26} {row.get('kernel', '?'):<9} {c.dtype:<5} {c.cache[:5]}/{c.page:<4} "
            f"{c.mask:<15} {c.score_mod:<9} {str(c.P):>5}")
    if row["error"]:
        return f"{head}  {status}: {row['error']}"
    return (f"{head} "
            f"{row['out_err']:9.2e} {row['out_rel']:9.2e} {row['out_ref_err']:9.2e} "
            f"{row['lse_err']:9.2e} {row['lse_ref_err']:9.2e}  {status}")


HEADER = (f"{'shape':<26} {'kernel':<9} {'dtype':<5} {'cache':<10} {'mask':<15} "
          f"{'score_mod':<9} {'P':>5} "
          f"{'out err':>9} {'out rel':>9} {'np32 err':>9} {'lse err':>9} {'np32 err':>9}  result")


def main(full=None, backend="auto", seed=0, limit=None):
    """Run the sweep, print the table; returns the number of failed cases."""
    from tqdm import tqdm

    full = (not _compat.SIMULATOR) if full is None else full
    todo = [Case(**{**c.__dict__, "backend": backend}) for c in cases(full)
            if not (backend == "mma" and c.dtype == "fp32")][:limit]  # tensor cores: 16-bit
    where = "CUDA simulator" if _compat.SIMULATOR else _device_name()
    print(f"numba-mla validate: {len(todo)} cases, backend={backend}, on {where}")
    rows = []
    for c in tqdm(todo, unit="case", leave=False):
        try:
            rows.append(run_case(c, seed))
        except Exception as e:  # a crash is a failed case, reported in the table
            rows.append(dict(case=c, error=f"{type(e).__name__}: {e}", **{"pass": False}))
            try:
                rows[-1]["kernel"] = kernel_of(c)
            except Exception:
                pass
    print(HEADER)
    for r in rows:
        print(_fmt(r))
    failed = sum(not r["pass"] for r in rows)
    print(f"{len(rows) - failed} passed, {failed} failed "
          "(pass: error vs float64 <= 2 x a same-precision NumPy run's + a few fp32 ulps, NaN/inf as the "
          "reference)")
    return failed


def _device_name():
    from numba import cuda

    d = cuda.get_current_device()
    name = d.name.decode() if isinstance(d.name, bytes) else d.name
    return f"{name} (sm_{d.compute_capability[0]}{d.compute_capability[1]}, {d.MULTIPROCESSOR_COUNT} SMs)"
