"""The split-K FMA kernels (``backend="simt"``: kernels/simt.py + kernels/combine.py) against
the NumPy reference.

Every kernel result is checked three ways (docs/testing.md, ``assert_three_way``): its largest error
against the float64 reference may be at most twice that of a same-precision NumPy run
(``compute_dtype=np.float32``, out rounded to the storage dtype), for ``out`` and ``lse``
separately, with NaN/inf exactly where the float64 reference has them. ``out`` is pre-filled
with NaN, so an element the kernels never write fails; the problems hold NaN in every cache
slot past a length and a huge page index in every unused block-table entry (make_problem), so
an out-of-bounds read fails too.

Two suites:

- Simulator-sized (marked ``kernel``): tiny shapes, run in CI under ``NUMBA_ENABLE_CUDASIM=1``
  and on a GPU alike. The factors (mask, score mod, cache, dtype, Sq, num_partitions, padded or
  ragged q) are far too many for their full product in the simulator (a simulated call costs
  seconds), so ``all_pairs`` picks cases in which every pair of factor values appears at least
  once; ``test_pairwise_selection_covers_every_pair`` proves it.
- GPU (marked ``gpu``; skipped unless a real GPU is present, see conftest.py): every mask x
  every score mod at moderate shapes, a shape sweep up to 64K keys, the generated code (no call
  left, no local memory), torch and Numba device arrays. On the GPU machine:
  ``python -m pytest tests/test_kernels.py -m gpu``.
"""
import re
from dataclasses import dataclass
from itertools import combinations
from typing import Optional

import numpy as np
import pytest

import numba_mla as nm
from numba import cuda
from helpers import (
    BF16,
    DTYPES,
    MASK_CASES,
    MASKS,
    SCORE_MOD_CASES,
    SCORE_MODS,
    assert_three_way,
    cuda_torch,
    fp32_floor,
    f64,
    make_problem,
    random_counts,
    random_lengths,
    references,
    simt_tile,
    to_numpy,
    to_torch,
)
from numba_mla import factory, heuristics, launch, selector
from numba_mla.testing import DEEPSEEK_SCALE
from numba_mla.kernels import mma_sync_roles, seesaw, simple
from numba_mla.mods import as_mask, as_score_mod

#: Runs the kernels: in the CUDA simulator in CI, on the device when there is one.
KERNEL = pytest.mark.kernel
#: The split-K kernels: FMA, tensor cores (wgmma; mma.sync: 16-bit data only) and the
#: readable FMA kernel.
KERNEL_BACKENDS = ("simt", "mma", "mma_sync", "simple")
TENSOR_CORES = ("mma", "mma_sync")


def tiles(length, block_n=32):
    """Key tiles of ``block_n`` keys that ``length`` keys fill (by default the FMA kernel's
    smallest tile: ``tiles + 1`` partitions then exceed the tiles of every configuration)."""
    return -(-int(length) // block_n)


def lengths_with_longest(rng, B, Sq, longest, zero=True):
    """``random_lengths`` (Sq, and 0 if ``zero`` and B > 1, always present) with its largest
    entry set to ``longest``, so the tile count is known."""
    lengths = random_lengths(rng, B, Sq, longest, zero=zero)
    lengths[np.argmax(lengths)] = longest
    return lengths


def ragged_counts(rng, lengths, Sq):
    """Query rows per sequence for ragged q: random (0 to Sq, at most a nonzero length), and
    Sq for the longest sequence, so a call never has no row at all."""
    counts = random_counts(rng, lengths, Sq)
    counts[np.argmax(lengths)] = Sq
    return counts


def assert_matches_reference(out, lse, golden, same_precision, backend="simt"):
    assert_three_way(out, same_precision[0], golden[0], floor=fp32_floor(golden[0], backend),
                     what="out")
    assert_three_way(lse, same_precision[1], golden[1], floor=fp32_floor(golden[1], backend),
                     what="lse")


def check_kernel(p, mask, score_mod, num_partitions=None, backend="simt"):
    """Run ``backend`` on problem p into a NaN-filled ``out`` and check out and lse three ways
    against the references (computed first, from the same mask objects)."""
    golden, same = references(p, mask, score_mod)
    out = np.full(p.out_shape, np.nan, p.dtype)
    got, lse = p.run(nm, mask=mask, score_mod=score_mod, num_partitions=num_partitions,
                     return_lse=True, out=out, backend=backend)
    assert got is out
    assert isinstance(lse, np.ndarray) and lse.shape == p.lse_shape and lse.dtype == np.float32
    assert_matches_reference(out, lse, golden, same, backend)
    return out, lse


def check_case(case, rng, backend="simt"):
    """check_kernel on an all-pairs case: its problem, mask, score mod and partitions."""
    p = case.problem(rng)
    mask = MASKS[case.mask].make(p, rng)
    return check_kernel(p, mask, SCORE_MODS[case.score_mod].make(p), case.num_partitions, backend)


# ---------------------------------------------------------------------------------------------
# All-pairs selection
# ---------------------------------------------------------------------------------------------
def _pair(names, a, x, b, y):
    """A pair of (factor, value)s in the factors' order."""
    return ((a, x), (b, y)) if names.index(a) < names.index(b) else ((b, y), (a, x))


def all_pairs(factors):
    """A deterministic greedy all-pairs selection over ``factors`` ({name: [values]}): a list
    of cases ({name: value}) in which every pair of values of two different factors appears.

    Each case starts from the first pair not yet covered (in the factors' order, so the two
    largest factors, listed first, are seeded one pair per case), then every other factor
    takes the value that covers the most new pairs with the values already chosen; ties go
    to the value used least so far, then to the first listed."""
    names = list(factors)
    rank = {n: {v: j for j, v in enumerate(vals)} for n, vals in factors.items()}
    uses = {n: dict.fromkeys(vals, 0) for n, vals in factors.items()}
    uncovered = {((a, x), (b, y)) for a, b in combinations(names, 2)
                 for x in factors[a] for y in factors[b]}

    def order(pair):
        (a, x), (b, y) = pair
        return names.index(a), rank[a][x], names.index(b), rank[b][y]

    cases = []
    while uncovered:
        (a, x), (b, y) = min(uncovered, key=order)
        case = {a: x, b: y}
        for n in names:
            if n not in case:
                def score(v, n=n, case=case):
                    gain = sum(_pair(names, m, case[m], n, v) in uncovered for m in case)
                    return gain, -uses[n][v], -rank[n][v]

                case[n] = max(factors[n], key=score)
        case = {n: case[n] for n in names}
        for n in names:
            uses[n][case[n]] += 1
        uncovered -= {_pair(names, a, case[a], b, case[b]) for a, b in combinations(names, 2)}
        cases.append(case)
    return cases


def missing_pairs(factors, cases):
    """The pairs of factor values that no case holds."""
    names = list(factors)
    want = {((a, x), (b, y)) for a, b in combinations(names, 2)
            for x in factors[a] for y in factors[b]}
    have = {((a, c[a]), (b, c[b])) for c in cases for a, b in combinations(names, 2)}
    return want - have


#: The simulator's factors. Masks: every kind in MASK_CASES with one user function
#: (``user_fn``; the ``*_scalar`` variants differ only in how the reference evaluates them).
SIM_FACTORS = {
    "mask": [c.id for c in MASK_CASES if "scalar" not in c.id],
    "score_mod": [c.id for c in SCORE_MOD_CASES if "scalar" not in c.id],
    "cache": ["contiguous", "paged1", "paged5", "paged16"],
    "dtype": ["bf16", "fp16", "fp32"],
    "sq": [1, 2],
    "partitions": ["1", "3", "tiles+1"],
    "layout": ["padded", "ragged"],
}


@dataclass(frozen=True)
class SimCase:
    """One simulator case: the factor values, plus H and the longest length derived from
    the case's index (H cycles over 1, 2, 3; the longest length gives 1 to 3 key tiles)."""

    index: int
    mask: str
    score_mod: str
    cache: str
    dtype: str
    sq: int
    partitions: str
    layout: str

    @property
    def heads(self):
        return (1, 2, 3)[self.index % 3]

    @property
    def longest(self):
        if self.partitions == "1":
            return (40, 51, 64)[self.index % 3]         # 2 tiles in one partition
        if self.partitions == "3":
            return (65, 70, 67)[self.index % 3]         # 3 tiles: one per partition
        return (5, 20, 33, 40)[self.index % 4]          # 1-2 tiles, 2-3 partitions

    @property
    def edge(self):
        """The other sequence's length: 0 (no key), or Sq (its first query sees one key)."""
        if self.partitions == "3":
            return 0
        return self.sq if self.index % 2 else 0

    @property
    def num_partitions(self):
        return {"1": 1, "3": 3, "tiles+1": tiles(self.longest) + 1}[self.partitions]

    def problem(self, rng):
        # Two sequences: every simulated key tile costs seconds, whatever it holds.
        B = 2
        lengths = rng.permutation([self.edge, self.longest]).astype(np.int32)
        kind = self.cache if self.cache in ("contiguous", "ragged") else "paged"
        page_size = int(self.cache[5:]) if kind == "paged" else 16
        ragged = self.layout == "ragged"
        return make_problem(rng, B, self.sq, self.heads, lengths, DTYPES[self.dtype], kind,
                            page_size, ragged=ragged,
                            q_counts=ragged_counts(rng, lengths, self.sq) if ragged else None)

    def __str__(self):
        return (f"{self.mask}-{self.score_mod}-{self.cache}-{self.dtype}-Sq{self.sq}-H{self.heads}"
                f"-P{self.partitions}-{self.layout}")


SIM_CASES = [SimCase(j, **c) for j, c in enumerate(all_pairs(SIM_FACTORS))]


def each_value_once(factors):
    """Cases in which every value of every factor appears: case j takes value j (cycling) of
    each factor, as many cases as the longest factor has values."""
    n = max(len(v) for v in factors.values())
    return [{name: vals[j % len(vals)] for name, vals in factors.items()} for j in range(n)]


#: The factors of the each-value-once matrices below: the ragged cache (rows back to back,
#: NaN rows between the sequences) too, at no extra case (the masks are more values).
EACH_FACTORS = {**SIM_FACTORS, "cache": SIM_FACTORS["cache"] + ["ragged"]}

#: The tensor-core kernel in the simulator: every value of every factor at least once (16-bit
#: data only), not every pair: its simulated call costs about ten seconds (256 threads). The GPU
#: suite runs it over every mask x score mod and the shape sweep.
MMA_SIM_CASES = [SimCase(j, **c) for j, c in enumerate(
    each_value_once({**EACH_FACTORS, "dtype": ["bf16", "fp16"]}))]


#: The simple kernel in the simulator: every value of every factor at least once, all three
#: dtypes. Its 8-key tiles make "1" and "3" partitions runs of several tiles (up to 9), the
#: last one partial. Its warp split-K variant (decoding_warp_split_k) runs the same cases.
SIMPLE_SIM_CASES = [SimCase(j, **c) for j, c in enumerate(each_value_once(EACH_FACTORS))]


def test_pairwise_selection_covers_every_pair():
    cases = [{n: getattr(c, n) for n in SIM_FACTORS} for c in SIM_CASES]
    assert not missing_pairs(SIM_FACTORS, cases)
    # The lower bound: every (mask, score mod) pair needs a case of its own.
    assert len(cases) >= len(SIM_FACTORS["mask"]) * len(SIM_FACTORS["score_mod"])
    assert len({str(c) for c in SIM_CASES}) == len(SIM_CASES)      # unique test ids
    # The check can fail: without its first case, the selection misses that case's pairs.
    assert missing_pairs(SIM_FACTORS, cases[1:])


@pytest.mark.parametrize("factors", [
    {"a": [0, 1, 2], "b": [0, 1, 2], "c": [0, 1, 2], "d": [0, 1, 2]},
    {f"f{j}": [False, True] for j in range(10)},
    {"big": list(range(7)), "one": ["x"], "two": [1, 2], "five": list("abcde")},
], ids=["3^4", "2^10", "mixed"])
def test_all_pairs_generator(factors):
    cases = all_pairs(factors)
    assert not missing_pairs(factors, cases)
    assert all(set(c) == set(factors) and all(c[n] in factors[n] for n in c) for c in cases)
    assert cases == all_pairs(factors)                               # deterministic
    sizes = sorted(len(v) for v in factors.values())
    assert sizes[-1] * sizes[-2] <= len(cases) <= 2 * sizes[-1] * sizes[-2] + 4


# ---------------------------------------------------------------------------------------------
# Simulator-sized kernel tests
# ---------------------------------------------------------------------------------------------
@KERNEL
@pytest.mark.parametrize("case", SIM_CASES, ids=str)
def test_kernel_pairwise(case, rng):
    check_case(case, rng)


@KERNEL
@pytest.mark.parametrize("case", MMA_SIM_CASES, ids=str)
def test_mma_kernel_each_factor(case, rng):
    check_case(case, rng, "mma")


@KERNEL
@pytest.mark.parametrize("case", MMA_SIM_CASES, ids=str)
def test_mma_sync_kernel_each_factor(case, rng):
    """The warp tensor-core kernel (kernels/mma_sync.py) on the tensor-core cases: its 64-key
    tiles make the partitions runs of several tiles."""
    check_case(case, rng, "mma_sync")


@KERNEL
@pytest.mark.parametrize("case", SIMPLE_SIM_CASES, ids=str)
def test_simple_kernel_each_factor(case, rng):
    check_case(case, rng, "simple")


@KERNEL
@pytest.mark.parametrize("case", SIMPLE_SIM_CASES, ids=str)
def test_warp_split_k_each_factor(case, rng):
    """The simple kernel with decoding_warp_split_k (kernels/warpsplit.py): each block's keys
    split over its 4 warps, and over num_partitions blocks."""
    p = case.problem(rng)
    mask, score_mod = MASKS[case.mask].make(p, rng), SCORE_MODS[case.score_mod].make(p)
    golden, same = references(p, mask, score_mod)
    out = np.full(p.out_shape, np.nan, p.dtype)
    plan = p.warp_split_plan(mask, score_mod, case.num_partitions, out, "simple")
    assert plan.spec.backend == "warpsplit"
    plan.launch()
    got, lse = plan.result()
    assert got is out
    assert_matches_reference(out, lse, golden, same, "warpsplit")


@pytest.mark.parametrize("n", [288, 20])
def test_dot_in_runs(n, rng):
    """The simple kernels' score sum (kernels/common.dot_in_runs): 16 products into a run's
    sum, then the runs (n = 20: a last run of 4), bit for bit as NumPy does it in that order
    (the simulator rounds each product and sum; a GPU may fuse them into one FMA, rounded
    once: either order of roundings is taken there); on 200 float32 dot products of 288 terms
    of scores' size it is closer to the exact sum than the one chain it replaced, on average
    (docs/testing.md, "The simple kernel's sums")."""
    from numba_mla import _compat
    from numba_mla.kernels.common import DOT_RUN, dot_in_runs

    @cuda.jit
    def dots(x, y, out):
        i = cuda.threadIdx.x
        if i < out.size:
            out[i] = dot_in_runs(x[i], y[i], x.shape[1])

    m = 200 if n == 288 else 4
    x = rng.standard_normal((m, n)).astype(np.float32)
    y = (3 * rng.standard_normal((m, n))).astype(np.float32)
    got = np.zeros(m, np.float32)
    dots[1, m](x, y, got)

    def in_runs(fused):
        def add(acc, d):  # acc + x[:, d] * y[:, d], fused: the exact product, one rounding
            if fused:
                return (acc.astype(np.float64)
                        + x[:, d].astype(np.float64) * y[:, d]).astype(np.float32)
            return acc + x[:, d] * y[:, d]
        total = np.zeros(m, np.float32)
        for d0 in range(0, n, DOT_RUN):
            run = np.zeros(m, np.float32)
            for d in range(d0, min(d0 + DOT_RUN, n)):
                run = add(run, d)
            total = total + run
        return total

    runs = in_runs(fused=False)
    if _compat.SIMULATOR or not np.array_equal(got, in_runs(fused=True)):
        np.testing.assert_array_equal(got, runs)
    if n == 288:
        chain = np.zeros(m, np.float32)
        for d in range(n):
            chain = chain + x[:, d] * y[:, d]
        exact = np.einsum("md,md->m", x.astype(np.float64), y.astype(np.float64))
        assert np.abs(got - exact).mean() < np.abs(chain - exact).mean()


@KERNEL
@pytest.mark.parametrize("case", MMA_SIM_CASES, ids=str)
def test_simt_warp_split_k_each_factor(case, rng):
    """The FMA kernel with decoding_warp_split_k (kernels/simt.py, two groups of four warps,
    each walking half of a partition's 32-key tiles, merged in shared memory) on the 16-bit
    cases: one tile a group ("1"), a group with none ("3": one tile a partition), empty
    partitions ("tiles+1")."""
    p = case.problem(rng)
    mask, score_mod = MASKS[case.mask].make(p, rng), SCORE_MODS[case.score_mod].make(p)
    golden, same = references(p, mask, score_mod)
    out = np.full(p.out_shape, np.nan, p.dtype)
    plan = p.warp_split_plan(mask, score_mod, case.num_partitions, out, "simt")
    assert plan.spec.backend == "simt_warpsplit" and plan.spec.block_n == 32
    plan.launch()
    got, lse = plan.result()
    assert got is out
    assert_matches_reference(out, lse, golden, same, "simt_warpsplit")


@KERNEL
@pytest.mark.parametrize("mask_id,partitions", [("causal", 1), ("window3", 2)])
def test_simt_warp_split_k_runs_of_tiles(mask_id, partitions, rng):
    """Warp split-K in the FMA kernel where each group walks several tiles (7 tiles of 32
    keys in one partition: 4 and 3), with Sq = 2 ragged q; and a sliding window, whose kept
    keys lie in the last tile: in two partitions the first walks that tile (its first group;
    its second walks none, whose terms merge with weight 0) and the second is empty."""
    lengths = np.array([7 * 32 - 5, 0], np.int32)
    p = make_problem(rng, 2, 2, 2, lengths, BF16, "paged", 16, ragged=True,
                     q_counts=np.array([2, 0], np.int32))
    mask = MASKS[mask_id].make(p, rng)
    golden, same = references(p, mask, None)
    out = np.full(p.out_shape, np.nan, p.dtype)
    plan = p.warp_split_plan(mask, None, partitions, out, "auto")
    assert plan.spec.backend == "simt_warpsplit" and plan.spec.num_partitions == partitions
    plan.launch()
    got, lse = plan.result()
    assert_matches_reference(out, lse, golden, same, "simt_warpsplit")


@KERNEL
@pytest.mark.parametrize("cache_kind,page_size,tma,heads", [
    ("contiguous", 16, True, 2), ("paged", 64, True, 2), ("paged", 48, False, 2),
    ("paged", 64, True, seesaw.LAG_HEADS)])
def test_mma_copy_path(cache_kind, page_size, tma, heads, rng, monkeypatch):
    """The tensor-core kernel takes its tiles by TMA where a 64-key tile lies in one page and
    by cp.async elsewhere; both paths over several tiles (the mbarrier phases alternate, the
    last tile is partial and its slots past the length hold NaN) match the reference. From
    seesaw.LAG_HEADS heads the seesaw kernel's reference max lags (its other form)."""
    chosen = []
    build, build_seesaw = factory.mma_partition_kernel, factory.seesaw_partition_kernel

    def recording(*args):
        chosen.append(args[6])  # (mask, score_mod, tag, cache_cls, heads, direct, tma, fp8)
        return build(*args)

    def recording_seesaw(*args, **kwargs):
        chosen.append("seesaw")
        return build_seesaw(*args, **kwargs)

    monkeypatch.setattr(factory, "mma_partition_kernel", recording)
    monkeypatch.setattr(factory, "seesaw_partition_kernel", recording_seesaw)
    p = make_problem(rng, 1, 1, heads, [150], BF16, cache_kind, page_size)
    mask = MASKS["causal"].make(p, rng)
    check_kernel(p, mask, SCORE_MODS["identity"].make(p), 1, "mma")
    # TMA tiles: the seesaw kernel (the simulator compiles nothing, so it never spills), and
    # the lockstep kernel is not even built; cp.async tiles: the lockstep kernel
    assert chosen == (["seesaw"] if tma else [False])


@KERNEL
@pytest.mark.parametrize("window", [None, 300])
def test_seesaw_rows_ahead(window, rng, monkeypatch):
    """From seesaw.LAG_HEADS heads the seesaw kernel looks up the page-table rows of a pair's
    refills at the top of the pair before and carries them (seesaw.ROWS_AHEAD): one partition
    walking nine tiles (five pairs, the last of one partial tile) over shuffled pages of 64
    matches the reference, with every tile and with a window that skips the first four. ALiBi
    makes each key's score depend on its position, so that two tiles' rows swapped would not
    give the same output. The seesaw kernel must be the one that ran (on a GPU a build that
    spills gives way to another seesaw form, and where all do to the lockstep kernel: with the
    window, the form that looks the rows up in their own pair runs there, as the carried
    rows' build spills)."""
    assert seesaw.ROWS_AHEAD
    chosen = []
    build_seesaw, build_lockstep = factory.seesaw_partition_kernel, factory.mma_partition_kernel
    monkeypatch.setattr(factory, "seesaw_partition_kernel",
                        lambda *a, **k: chosen.append("seesaw") or build_seesaw(*a, **k))
    monkeypatch.setattr(factory, "mma_partition_kernel",
                        lambda *a, **k: chosen.append("lockstep") or build_lockstep(*a, **k))
    p = make_problem(rng, 1, 1, seesaw.LAG_HEADS, [9 * 64 - 5], BF16, "paged", 64)
    mask = nm.NullMask() if window is None else nm.SlidingWindowCausalMask(window)
    check_kernel(p, mask, SCORE_MODS["alibi"].make(p), 1, "mma")
    assert set(chosen) == {"seesaw"}  # (more than one form on a GPU where a build spills)


@KERNEL
@pytest.mark.parametrize("flag,value,attr", [("MAX_EARLY1", True, "max_early1"),
                                             ("S_UNROLL", False, "s_unroll"),
                                             ("PACK_P", False, "pack_p"),
                                             ("ROWS_LEAD", True, "rows_lead")],
                         ids=["max_early1", "s_loop", "pack_p", "rows_lead"])
@pytest.mark.parametrize("heads,num_partitions,order", [
    (seesaw.LAG_HEADS, 1, "low"), (seesaw.LAG_HEADS, 2, "high+late"), (2, 1, "high"),
    (2, 2, "low+late")])
def test_seesaw_forms(heads, num_partitions, order, flag, value, attr, rng, monkeypatch):
    """The seesaw kernel's forms other than the default: warpgroup 1's tile maxima stored
    before its wait at SCALE0 (``seesaw.MAX_EARLY1``, off: an experiment; into its row-sum
    row of ``stat``, which the walk's end then overwrites), and S as a loop over a tile's nine
    boxes (``seesaw.S_UNROLL`` False; the default writes them out, each descriptor a 32-bit
    add, ``ptx.desc_advance_lo``), P packed again for the stores and P V where the default
    packs it once in the softmax (``seesaw.PACK_P`` False), and the refills' page-table rows
    looked up by each warpgroup's first warp only (``seesaw.ROWS_LEAD``, on for "e4m3" rows
    only; with shuffled pages a row from any other warp would copy a wrong tile). Nine tiles
    (five pairs, the last of one partial tile) over shuffled pages of 64, in one partition
    and in two, at 64 heads and 2, with either warpgroup's threads run first (and, in two
    partitions, each arrival without a wait run last: a warpgroup's P V still in flight when
    it lets the other go), match the reference; ALiBi makes each key's score depend on its
    position. The kernel that ran must
    be the seesaw build of that form."""
    from numba_mla import _numba

    monkeypatch.setattr(seesaw, flag, value)
    specs = launched_specs(monkeypatch)
    p = make_problem(rng, 1, 1, heads, [9 * 64 - 5], BF16, "paged", 64)
    with _numba.sim_turn_order(order):
        check_kernel(p, nm.NullMask(), SCORE_MODS["alibi"].make(p), num_partitions, "mma")
    assert [(s.backend, getattr(s.dispatcher, attr)) for s in specs] == [("seesaw", value)], (
        f"expected the seesaw build with {flag} = {value}")


@KERNEL
@pytest.mark.parametrize("flags,mask,sq,sign,heads,q_times", [
    (("WHOLE_TILES",), "null", 1, 1, seesaw.LAG_HEADS, 1),
    (("WHOLE_TILES",), "causal", 2, 1, seesaw.LAG_HEADS, 1),
    (("EXP_FOLD",), "null", 1, 1, seesaw.LAG_HEADS, 1),
    (("EXP_FOLD",), "causal", 2, 1, seesaw.LAG_HEADS, 1),
    (("WHOLE_TILES", "EXP_FOLD"), "null", 1, 1, seesaw.LAG_HEADS, 1),
    (("WHOLE_TILES", "EXP_FOLD"), "null", 1, -1, seesaw.LAG_HEADS, 1),
    (("WHOLE_TILES", "EXP_FOLD"), "causal", 3, 1, 2, 1),
    (("EXP_FOLD",), "null", 1, 1, seesaw.LAG_HEADS, 4)],
    ids=["whole-null", "whole-causal", "fold-null", "fold-causal", "both-null",
         "both-null-negative-scale", "both-causal-2-heads", "fold-large-scores"])
def test_seesaw_score_forms(flags, mask, sq, sign, heads, q_times, rng, monkeypatch):
    """The seesaw kernel's score forms for a boolean mask and no score mod: a tile with all
    its keys takes its scores without their bounds (``seesaw.WHOLE_TILES``), and the scores
    stay raw products with the scale in the exponent where it is positive
    (``seesaw.EXP_FOLD``; a negative scale takes the scaled form). Two sequences, one of nine
    tiles with a partial last tile and one of eight whole tiles, over shuffled pages of 64,
    in two partitions (a partition's last tile whole and partial), at seesaw.LAG_HEADS
    heads, null and causal over two query rows, and at 2 heads (the softmax without the lag;
    three query rows, 6 rows of the block's 64: rows past the block), match the reference
    (which raw scores under a negative scale or a bound missed on a partial tile would not).
    With q times 4 (exact in bf16) the raw products reach some hundreds: a row maximum left
    raw, not scaled, would then put every exponent far below 2^-126, and P at 0. The kernel
    that ran must be the seesaw build with the flags."""
    for flag in flags:
        monkeypatch.setattr(seesaw, flag, True)
    specs = launched_specs(monkeypatch)
    p = make_problem(rng, 2, sq, heads, [9 * 64 - 5, 8 * 64], BF16, "paged", 64,
                     scale=sign * DEEPSEEK_SCALE)
    p.q[...] *= q_times
    check_kernel(p, nm.NullMask() if mask == "null" else nm.CausalMask(),
                 nm.IdentityScoreMod(), 2, "mma")
    assert [(s.backend, s.dispatcher.whole_tiles, s.dispatcher.exp_fold) for s in specs] == [
        ("seesaw", "WHOLE_TILES" in flags, "EXP_FOLD" in flags)], (
        f"expected the seesaw build with {flags}")


@KERNEL
@pytest.mark.parametrize("num_partitions", [1, 2])
def test_mma_out_not_aligned_for_vector_stores(num_partitions, rng):
    """A caller's ``out`` that starts 2 bytes past an 8-byte boundary: where the tensor-core
    kernel writes ``out`` itself (one partition) its rows go an element a store there (a
    4-element store would fault: the simulator checks the real address), and the result
    matches the reference; with two partitions the combine writes ``out``."""
    from numba import cuda

    p = make_problem(rng, 1, 1, 2, [150], DTYPES["fp16"], "contiguous", 16)
    mask, score_mod = MASKS["causal"].make(p, rng), SCORE_MODS["identity"].make(p)
    golden, same = references(p, mask, score_mod)
    buf = cuda.to_device(np.full(int(np.prod(p.out_shape)) + 1, np.nan, np.float16))
    out = buf[1:].reshape(p.out_shape)
    face = (out.__cuda_array_interface__ if hasattr(out, "__cuda_array_interface__")
            else out.__array_interface__)  # (the simulator's arrays)
    assert face["data"][0] % 8 == 2
    cache = nm.ContiguousKVCache(cuda.to_device(p.cache.kv), cuda.to_device(p.lengths))
    got, lse = nm.mla_decode(cuda.to_device(p.q), cache, p.scale, mask, score_mod,
                             num_partitions=num_partitions, return_lse=True, out=out,
                             backend="mma")
    assert got is out
    assert_matches_reference(out.copy_to_host(), lse.copy_to_host(), golden, same, "mma")


@KERNEL
def test_mma_tma_falls_back_when_the_seesaw_spills(rng, monkeypatch):
    """Where the seesaw kernel would spill registers (a mask with much arithmetic), TMA tiles
    go to the lockstep kernel's TMA variant, which matches the reference too; every seesaw
    form is tried first, each once (selector._seesaw_fit): at 64 heads where
    ``seesaw.FOLLOWS`` the one launched to follow the kernel before it and then the plain one,
    both with the refills' rows carried from the pair before and then without; at 2 heads,
    which carry none, the second two are the first two and are not built again."""
    for follows, heads in ((True, seesaw.LAG_HEADS), (False, seesaw.LAG_HEADS), (True, 2),
                           (False, 2)):
        monkeypatch.setattr(seesaw, "FOLLOWS", follows)
        considered = []

        def spills(self):
            considered.append(self.dispatcher)
            return self.dispatcher in seesaw_kernels

        seesaw_kernels = []
        build_seesaw = factory.seesaw_partition_kernel

        def recording_seesaw(*args, **kwargs):
            seesaw_kernels.append(build_seesaw(*args, **kwargs))
            return seesaw_kernels[-1]

        with monkeypatch.context() as m:
            m.setattr(factory, "seesaw_partition_kernel", recording_seesaw)
            m.setattr(launch._Launch, "spills", spills)
            p = make_problem(rng, 1, 1, heads, [150], BF16, "paged", 64)
            mask = MASKS["window3"].make(p, rng)
            check_kernel(p, mask, SCORE_MODS["alibi"].make(p), 1, "mma")
        assert considered == list({id(k): k for k in seesaw_kernels}.values())
        forms = [(k.follows, k.rows_late) for k in considered]
        carried = [(True, False), (False, False)] if follows else [(False, False)]
        assert forms == (carried + [(f, True) for f, _ in carried] if heads >= seesaw.LAG_HEADS
                         else carried)


@KERNEL
def test_seesaw_follows_falls_back_to_the_plain_form(rng, monkeypatch):
    """Where the seesaw build launched to follow the kernel before it (``seesaw.FOLLOWS``)
    would spill (the wait at its start moves ptxas's allocation), the plain seesaw build runs,
    not the lockstep kernel, and matches the reference (64 heads, a sliding window, ALiBi over
    nine tiles on shuffled pages)."""
    monkeypatch.setattr(seesaw, "FOLLOWS", True)
    monkeypatch.setattr(launch._Launch, "spills",
                        lambda self: getattr(self.dispatcher, "follows", False))
    specs = launched_specs(monkeypatch)
    p = make_problem(rng, 1, 1, seesaw.LAG_HEADS, [9 * 64 - 5], BF16, "paged", 64)
    check_kernel(p, nm.SlidingWindowCausalMask(300), SCORE_MODS["alibi"].make(p), 1, "mma")
    assert [(s.backend, s.dispatcher.follows, s.dispatcher.rows_late) for s in specs] == [
        ("seesaw", False, False)]


@KERNEL
@pytest.mark.parametrize("follows", [True, False])
def test_seesaw_rows_late_where_carried_rows_spill(follows, rng, monkeypatch):
    """Where the seesaw builds that carry the refills' rows from the pair before
    (``seesaw.ROWS_AHEAD``) would spill (64 heads, a sliding window and ALiBi: 40 bytes on an
    H100, with or without ``seesaw.FOLLOWS``), the seesaw form that looks them up in their own
    pair runs, not the lockstep kernel, and matches the reference over nine tiles on shuffled
    pages (the window skips the first four)."""
    monkeypatch.setattr(seesaw, "FOLLOWS", follows)
    monkeypatch.setattr(launch._Launch, "spills",
                        lambda self: not getattr(self.dispatcher, "rows_late", True))
    specs = launched_specs(monkeypatch)
    p = make_problem(rng, 1, 1, seesaw.LAG_HEADS, [9 * 64 - 5], BF16, "paged", 64)
    check_kernel(p, nm.SlidingWindowCausalMask(300), SCORE_MODS["alibi"].make(p), 1, "mma")
    assert [(s.backend, s.dispatcher.follows, s.dispatcher.rows_late) for s in specs] == [
        ("seesaw", follows, True)]


def launched_specs(monkeypatch):
    """The kernels the selector picks from here on (a list it appends to): what ran, after
    any fallback from a form whose build uses local memory."""
    specs, real = [], selector.select_kernel
    monkeypatch.setattr(selector, "select_kernel",
                        lambda *args: specs.append(real(*args)) or specs[-1])
    return specs


@KERNEL
def test_mma_sync_roles_eight_chains(rng, monkeypatch):
    """The split-role form with its score warps' S in eight accumulator chains
    (``mma_sync_roles.S_CHAINS = 8``, off: 0.99-1.02x the time on an H100; the odd steps'
    products apart, added at the end) matches the reference: two tiles, the second partial,
    20 query rows."""
    monkeypatch.setattr(mma_sync_roles, "S_CHAINS", 8)
    specs = launched_specs(monkeypatch)
    p = make_problem(rng, 1, 1, 20, [100], BF16, "paged", 16)
    check_kernel(p, nm.CausalMask(), SCORE_MODS["softcap"].make(p), 1, "mma_sync")
    assert [(s.backend, s.dispatcher.form["s_chains"]) for s in specs] == [
        ("mma_sync_roles", 8)], "expected the split-role kernel with eight chains"


@KERNEL
@pytest.mark.parametrize("ahead,order,swizzle,heads,skip_own", [
    (True, "low", True, 17, False), (True, "high", True, 17, False),
    (False, "low", True, 17, False), (True, "high", False, 17, False),
    (True, "low", True, 32, False), (True, "high", True, 32, True), (False, "low", True, 17, True)])
def test_mma_sync_roles_score_quarters(ahead, order, swizzle, heads, skip_own, rng,
                                       monkeypatch):
    """The split-role form with each score warp scoring both m16 tiles over a quarter of the
    dims (``mma_sync_roles.SCORE_QUARTERS``, off, 1.02-1.03x the time on an H100: Q's 72 registers a lane as two
    tiles x 9 steps, a four-way exchange of partial scores through Xs under one barrier of
    the four score warps) matches the reference: three tiles, the last partial, the second
    m16 tile with one row (17) or all 16 (32: every lane's rows of both tiles), beside an
    empty sequence; S ahead of P and in turn, the score warps run ahead of the V warps
    ("low") and behind ("high"), swizzled rows and padded; with each warp's own block of
    partials kept in registers (``QUARTERS_SKIP_OWN``, off) too."""
    from numba_mla import _numba

    monkeypatch.setattr(mma_sync_roles, "SCORE_QUARTERS", True)
    monkeypatch.setattr(mma_sync_roles, "QUARTERS_SKIP_OWN", skip_own)
    monkeypatch.setattr(mma_sync_roles, "S_AHEAD", ahead)
    monkeypatch.setattr(mma_sync_roles, "K_SWIZZLE", swizzle)
    monkeypatch.setattr(launch, "_aligned16", lambda dev: True)
    assert mma_sync_roles.stages_that_fit(heuristics.smem_per_block()) == 4
    specs = launched_specs(monkeypatch)
    p = make_problem(rng, 2, 1, heads, [133, 0], BF16, "paged", 16)
    with _numba.sim_turn_order(order):
        check_kernel(p, nm.CausalMask(), SCORE_MODS["softcap"].make(p), 1, "mma_sync")
    assert [(s.backend, s.dispatcher.form["score_quarters"], s.dispatcher.form["k_swizzle"],
             s.dispatcher.form["quarters_skip_own"])
            for s in specs] == [("mma_sync_roles", True, swizzle, skip_own)], (
        "expected the split-role kernel with its score work in quarters")


@KERNEL
@pytest.mark.parametrize("order", ["low", "high"])
@pytest.mark.parametrize("flags", [
    dict(MAX_EARLY=False, P_FTZ=False, SUMS_LATE=False),  # (the form before them)
    dict(LANE_MAX=False),  # (the pair's maxima early, each the quad's)
], ids=["late_maxima_exp2_quad_sums", "early_quad_maxima"])
def test_mma_sync_roles_softmax_forms(flags, order, rng, monkeypatch):
    """The split-role form's softmax with its flags off: the pair's row maxima read after the
    wait for P's buffer (``mma_sync_roles.MAX_EARLY = False``), P by ``math.exp2``
    (``P_FTZ = False``) and each sub-tile's row sums added across the quad (``SUMS_LATE =
    False``); or the maxima read early but each the quad's (``LANE_MAX = False``). Each
    matches the reference with the score warps ahead and behind: two tiles, the second
    partial, 20 query rows."""
    from numba_mla import _numba

    for name, value in flags.items():
        monkeypatch.setattr(mma_sync_roles, name, value)
    specs = launched_specs(monkeypatch)
    p = make_problem(rng, 1, 1, 20, [100], BF16, "paged", 16)
    with _numba.sim_turn_order(order):
        check_kernel(p, nm.CausalMask(), SCORE_MODS["softcap"].make(p), 1, "mma_sync")
    want = dict(max_early=flags.get("MAX_EARLY", True), p_ftz=flags.get("P_FTZ", True),
                sums_late=flags.get("SUMS_LATE", True), lane_max=False)
    assert [(s.backend, {k: s.dispatcher.form[k] for k in want}) for s in specs] == [
        ("mma_sync_roles", want)], "expected the split-role kernel with those flags"


@KERNEL
@pytest.mark.parametrize("lanes,cache,const_full,swizzle", [
    (16, "cg", False, False), (32, "cg", False, False), (8, "cg", False, False),
    (8, "ca", True, False), (8, "ca", False, False), (16, "ca", True, True)])
def test_mma_sync_roles_copy_lanes(lanes, cache, const_full, swizzle, rng, monkeypatch):
    """The split-role form's copy variants, each of which the default (8 lanes a row, ``.cg``,
    the stage's rows swizzled: ``test_mma_sync_roles``) is not: rows 1,168 bytes apart
    (``mma_sync_roles.K_SWIZZLE`` off) copied by 16, 32 or 8 lanes a row
    (``COPY_LANES``; a thread's rows of a stage 4 or 8, the last pieces of a row by half or a
    quarter of the lanes), through L1 (``COPY_CACHE = "ca"``), whole sub-tiles with a
    constant predicate (``COPY_CONST_FULL``: the last, partial, keeps its zero-fill); and
    swizzled rows copied by 16 lanes through L1, whole sub-tiles with a constant predicate
    (the swizzle's key the row's low three bits, which a thread's rows share with 8 or 16
    lanes; a reader of K or V that takes the unswizzled unit, or a copy whose key is
    narrowed, fails ``test_mma_sync_roles``'s 16-byte cases: tried, each)
    matches the reference: three tiles, the last partial, pages of 16 keys, beside an empty
    sequence, a 16-byte aligned cache."""
    monkeypatch.setattr(mma_sync_roles, "COPY_LANES", lanes)
    monkeypatch.setattr(mma_sync_roles, "COPY_CACHE", cache)
    monkeypatch.setattr(mma_sync_roles, "COPY_CONST_FULL", const_full)
    monkeypatch.setattr(mma_sync_roles, "K_SWIZZLE", swizzle)
    monkeypatch.setattr(launch, "_aligned16", lambda dev: True)
    specs = launched_specs(monkeypatch)
    p = make_problem(rng, 2, 1, 20, [150, 0], BF16, "paged", 16)
    check_kernel(p, nm.CausalMask(), SCORE_MODS["softcap"].make(p), 1, "mma_sync")
    form = [(s.backend, s.dispatcher.form["copy_lanes"], s.dispatcher.form["copy_cache"],
             s.dispatcher.form["copy_const_full"], s.dispatcher.form["k_swizzle"]) for s in specs]
    assert form == [("mma_sync_roles", lanes, cache, const_full, swizzle)], (
        "expected the split-role kernel with that copy")


@KERNEL
def test_mma_sync_roles_strided_cache(rng, monkeypatch):
    """A cache whose rows lie further apart than a row (a torch view of rows of 600 values,
    the first 576 of each the row's; GPU only: a Numba device array cannot be viewed as the
    kernels' words, and a host array is copied packed): the split-role form takes each row's
    address from the strides (``packed`` False), not from the row's index, and matches the
    reference."""
    import dataclasses

    from helpers import cuda_torch

    torch = cuda_torch()
    specs = launched_specs(monkeypatch)
    p = make_problem(rng, 2, 1, 20, [150, 0], DTYPES["fp16"], "paged", 16)
    rows = np.asarray(p.cache.storage)
    wide = np.zeros(rows.shape[:2] + (600,), rows.dtype)
    wide[..., :576] = rows
    view = torch.from_numpy(wide).cuda()[:, :, :576]
    assert not view.is_contiguous()
    cache = nm.PagedKVCache(view, p.cache.block_table_host, p.lengths)
    check_kernel(dataclasses.replace(p, cache=cache), nm.CausalMask(),
                 SCORE_MODS["softcap"].make(p), 1, "mma_sync")
    assert [(s.backend, s.dispatcher.form["packed"]) for s in specs] == [
        ("mma_sync_roles", False)], "expected the split-role kernel, rows by their strides"


@KERNEL
@pytest.mark.parametrize("order,quarters", [("low", False), ("high", False), ("high", True)])
def test_mma_sync_roles_eight_v_warps(order, quarters, rng, monkeypatch):
    """The split-role form with eight V warps of 64 dims (``mma_sync_roles.V_WARPS = 8``,
    off: 12 warps a block, 1.15-1.17x the time of four on an H100 with the swizzled
    stage) matches the reference with the score warps run ahead of the V warps and behind
    them: one partition of three tiles, the last partial, beside an empty sequence; 17 query
    rows (the second m16 tile one row); and with the score work in quarters as well
    (``SCORE_QUARTERS``: 1.29-1.46x together; 168 registers and no local memory for sm_90
    with a null mask at 128 heads)."""
    from numba_mla import _numba

    monkeypatch.setattr(mma_sync_roles, "V_WARPS", 8)
    monkeypatch.setattr(mma_sync_roles, "SCORE_QUARTERS", quarters)
    if quarters:  # (and the swizzled rows, the default, as a GPU's 16-byte aligned cache has)
        monkeypatch.setattr(launch, "_aligned16", lambda dev: True)
    specs = launched_specs(monkeypatch)
    p = make_problem(rng, 2, 1, 17, [133, 0], DTYPES["fp16"], "paged", 16)
    # (with the score work in quarters a causal mask and ALiBi put the build in local memory
    # on a GPU, where the selector then runs another form: the null mask builds without)
    mask, mod = ((nm.NullMask(), SCORE_MODS["identity"].make(p)) if quarters
                 else (nm.CausalMask(), SCORE_MODS["alibi"].make(p)))
    with _numba.sim_turn_order(order):
        check_kernel(p, mask, mod, 1, "mma_sync")
    assert [(s.backend, s.dispatcher.form["v_warps"], s.dispatcher.form["score_quarters"],
             s.threads) for s in specs] == [("mma_sync_roles", 8, quarters, 384)], (
        "expected the split-role kernel with eight V warps")


@KERNEL
def test_mma_sync_roles_falls_back_when_it_spills(rng, monkeypatch):
    """Where the mma_sync kernel's split-role form would spill (a score mod with much
    arithmetic), the lockstep 32-row block runs in its place, and matches the reference."""
    considered = []

    def spills(self):
        considered.append(self.dispatcher)
        return self.dispatcher in roles_kernels

    roles_kernels, built_lockstep = [], []
    build_roles, build_lockstep = (factory.mma_sync_roles_partition_kernel,
                                   factory.mma_sync_partition_kernel)

    def recording_roles(*args):
        roles_kernels.append(build_roles(*args))
        return roles_kernels[-1]

    def recording_lockstep(*args):
        built_lockstep.append(args[4])  # (its block_m)
        return build_lockstep(*args)

    monkeypatch.setattr(factory, "mma_sync_roles_partition_kernel", recording_roles)
    monkeypatch.setattr(factory, "mma_sync_partition_kernel", recording_lockstep)
    monkeypatch.setattr(launch._Launch, "spills", spills)
    p = make_problem(rng, 1, 1, 20, [150], BF16, "paged", 64)  # 20 query rows: 32 a block
    check_kernel(p, MASKS["window3"].make(p, rng), SCORE_MODS["alibi"].make(p), 1, "mma_sync")
    assert considered == roles_kernels and len(roles_kernels) == 1
    assert built_lockstep == [32]


MANY_ROWS = [  # (dtype, layout, mask, score mod): H * Sq = 18 query rows per sequence
    ("bf16", "padded", "causal", "alibi"),                 # one group, BLOCK_M = 32
    ("fp16", "ragged", "bias_B_H_Sq_S", "softcap"),        # one group, BLOCK_M = 32
    ("fp32", "ragged", "chunked_causal4", "user_fn"),      # two groups of BLOCK_M = 16
]


@KERNEL
@pytest.mark.parametrize("dtype,layout,mask_id,score_id", MANY_ROWS,
                         ids=[f"{d}-H9-Sq2-{lay}" for d, lay, _, _ in MANY_ROWS])
def test_kernel_many_rows(dtype, layout, mask_id, score_id, rng):
    """More than 16 query rows per sequence (H = 9, Sq = 2): BLOCK_M = 32 for 16-bit storage,
    two row groups (the second partly filled) for fp32. The other sequence has no query rows
    (ragged) or no keys (padded): its blocks have nothing to do."""
    B, Sq, H = 2, 2, 9
    sixteen = dtype != "fp32"
    block_m = heuristics.simt_block_m(Sq * H, sixteen)
    assert block_m == (32 if sixteen else 16)
    p = make_problem(rng, B, Sq, H, [29, 0] if layout == "ragged" else [31, 0], DTYPES[dtype],
                     "paged", 5, ragged=layout == "ragged", q_counts=[2, 0])
    check_kernel(p, MASKS[mask_id].make(p, rng), SCORE_MODS[score_id].make(p), num_partitions=1)


@KERNEL
def test_num_partitions_beyond_tiles(rng):
    """6 partitions over 2 key tiles (the second holding one key): 4 partitions keep nothing
    and must not disturb the combine."""
    n = simt_tile(4, BF16)
    p = make_problem(rng, 1, 2, 2, [n + 1], BF16, "paged", 16)
    assert tiles(p.lengths.max(), n) == 2
    check_kernel(p, nm.CausalMask(), nm.AlibiScoreMod(2), num_partitions=6)


def test_auto_backend_by_capability():
    """"auto": wgmma's kernels on sm_90 (and in the simulator, capability None), the warp
    tensor-core kernel on the other GPUs from sm_80 on (A100, Ada, and later ones without
    wgmma), the FMA kernel before sm_80 and for fp32."""
    from numba_mla.selector import auto_backend

    for tag in ("bf16", "f16"):
        assert auto_backend(tag, None) == "mma" and auto_backend(tag, (9, 0)) == "mma"
        for cc in ((8, 0), (8, 6), (8, 9), (10, 0), (12, 0)):
            assert auto_backend(tag, cc) == "mma_sync", cc
        for cc in ((7, 0), (7, 5), (6, 1)):
            assert auto_backend(tag, cc) == "simt", cc
    for cc in (None, (7, 5), (8, 0), (9, 0)):
        assert auto_backend("f32", cc) == "simt"


@KERNEL
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_auto_picks_a_kernel_and_return_lse(dtype, rng):
    """backend="auto" is a tensor-core kernel for 16-bit data (wgmma's on sm_90 and in the
    simulator, the warp one on other GPUs from sm_80 on) and the FMA kernel for fp32: the same
    bits as that backend. Without ``return_lse`` and ``out`` the result is a new array of q's
    dtype and out shape; with it, (out, lse [B, Sq, H])."""
    from numba import cuda

    from numba_mla import _compat, launch, selector

    cc = None if _compat.SIMULATOR else cuda.get_current_device().compute_capability
    expected = selector.auto_backend(factory.dtype_tag(DTYPES[dtype]), cc)
    assert launch.resolve_backend("auto", factory.dtype_tag(DTYPES[dtype])) == expected
    p = make_problem(rng, 2, 2, 3, [0, 29], DTYPES[dtype], "paged", 5)
    kw = dict(mask=nm.SlidingWindowCausalMask(20), score_mod=nm.SoftCapScoreMod(4.0))
    auto = p.run(nm, backend="auto", **kw)
    assert isinstance(auto, np.ndarray) and auto.shape == p.out_shape and auto.dtype == p.dtype
    chosen, lse = p.run(nm, backend=expected, return_lse=True, **kw)
    assert chosen.shape == (2, 2, 3, 512) and lse.shape == (2, 2, 3) and lse.dtype == np.float32
    np.testing.assert_array_equal(auto, chosen)
    golden, same = references(p, kw["mask"], kw["score_mod"])
    assert_matches_reference(chosen, lse, golden, same, expected)


@KERNEL
@pytest.mark.parametrize("backend", TENSOR_CORES)
def test_tensor_cores_refuse_fp32(rng, backend):
    """The tensor cores take 16-bit data: backend="mma" or "mma_sync" with fp32 is refused
    before launch, and decoding_warp_split_k with them too."""
    p = make_problem(rng, 1, 1, 2, [9], np.float32, "contiguous")
    out = np.full(p.out_shape, 7.0, np.float32)
    with pytest.raises(ValueError, match=f"^backend: '{backend}'.*float32"):
        p.run(nm, backend=backend, out=out)
    assert np.all(out == 7.0)
    with pytest.raises(ValueError, match="^decoding_warp_split_k"):
        nm.flare_mla_decoding(out, p.q, p.cache, None, None, None, p.scale, backend=backend,
                              decoding_warp_split_k=True)
    assert np.all(out == 7.0)


@KERNEL
def test_no_keys_anywhere(rng):
    """Every length 0: out exactly 0 and lse -inf everywhere (written over the NaN fill);
    a ragged call with no query rows at all returns empty arrays."""
    p = make_problem(rng, 2, 2, 2, [0, 0], np.float32, "paged", 5)
    out, lse = check_kernel(p, nm.NullMask(), nm.IdentityScoreMod(), num_partitions=2)
    assert np.all(out == 0) and np.all(np.isneginf(lse))

    p = make_problem(rng, 2, 2, 2, [0, 3], BF16, "contiguous", ragged=True, q_counts=[0, 0])
    out, lse = p.run(nm, backend="simt", return_lse=True)
    assert out.shape == (0, 2, 512) and out.dtype == BF16 and lse.shape == (0, 2)


@KERNEL
def test_nan_in_one_query_row_stays_in_that_row(rng):
    """NaN in q of one (token, head) row makes that row's out and lse NaN, as in the reference,
    across several partitions; every other row is unaffected (checked three ways)."""
    p = make_problem(rng, 2, 2, 2, [40, 37], BF16, "paged", 16)
    p.q[1, 0, 1, 7] = np.nan
    golden, same = references(p, nm.NullMask(), nm.IdentityScoreMod())
    assert np.isnan(golden[0][1, 0, 1]).all() and np.isnan(golden[1][1, 0, 1])
    out, lse = check_kernel(p, nm.NullMask(), nm.IdentityScoreMod(), num_partitions=3)
    assert np.isnan(f64(out)).sum() == 512 and np.isnan(lse).sum() == 1


FLARE_KINDS = ["cache", "array", "array_all_keys", "ragged"]


@KERNEL
@pytest.mark.parametrize("k_kind", FLARE_KINDS)
def test_flare_mla_decoding_writes_output(k_kind, rng):
    """MAX's call shape: ``output`` is written and returned, for a cache object, the
    [B, S, 1, 576] array overload (with per-sequence lengths, and with None: all S keys) and
    ragged q (valid_length = the row offsets)."""
    Sq, H = 2, 2
    mask, score_mod = nm.CausalMask(), nm.AlibiScoreMod(H)
    if k_kind == "array_all_keys":   # no slot past a length: S = every length
        p = make_problem(rng, 1, Sq, H, [29], np.float16, "contiguous", capacity=29)
    else:
        p = make_problem(rng, 2, Sq, H, [29, 0], BF16,
                         "contiguous" if k_kind == "array" else "paged", 5,
                         ragged=k_kind == "ragged", q_counts=[2, 0])
    if k_kind == "cache":
        k, valid_length = p.cache, None
    elif k_kind == "ragged":
        k, valid_length = p.cache, p.q_offsets
    else:
        k = p.cache.kv[:, :, None, :]                                   # [B, S, 1, 576]
        valid_length = None if k_kind == "array_all_keys" else p.lengths
    golden, same = references(p, mask, score_mod)
    output = np.full(p.out_shape, np.nan, p.dtype)
    got = nm.flare_mla_decoding(output, p.q, k, mask, score_mod, valid_length, p.scale,
                                backend="simt", use_score_mod=True)
    assert got is output
    assert_three_way(output, same[0], golden[0], floor=fp32_floor(golden[0]), what="output")


def poison_before(p, b, stop):
    """Write NaN into the cache slots of tokens [0, stop) of sequence b (valid keys)."""
    storage, bt = p.cache.storage, p.cache.block_table
    for t in range(stop):
        if bt is None:
            storage[b, t] = np.nan
        else:
            storage[bt[b, t // p.page_size], t % p.page_size] = np.nan


WINDOWS = [  # (mask id, the mask, the first key it keeps for a query at q (SPEC), Sq, dtype,
    #           cache, page size, num_partitions, ragged)
    ("window5", lambda: nm.SlidingWindowCausalMask(5), lambda q: q - 4,
     1, "fp32", "paged", 5, None, False),
    ("window20", lambda: nm.SlidingWindowCausalMask(20), lambda q: q - 19,
     2, "bf16", "contiguous", 0, 3, True),
    ("chunked_causal32", lambda: nm.ChunkedCausalMask(32), lambda q: q // 32 * 32,
     2, "fp16", "paged", 16, 2, False),
]


@KERNEL
@pytest.mark.parametrize("backend", ["simt", "simple"])
@pytest.mark.parametrize("mask_id,make_mask,first_kept,Sq,dtype,kind,page_size,P,ragged",
                         WINDOWS, ids=[w[0] for w in WINDOWS])
def test_window_reads_only_the_window(mask_id, make_mask, first_kept, Sq, dtype, kind, page_size,
                                      P, ragged, backend, rng):
    """Tile skipping: a window (or chunk) near the end of a long cache. The references come
    from the clean cache; then every key tile (on the kernel's tile grid from 0) wholly before the
    first key any query may keep is overwritten with NaN. A kernel that reads a skipped tile
    puts NaN into the output (0 x NaN in P @ V)."""
    B, H = 2, 2
    p = make_problem(rng, B, Sq, H, [230, 197], DTYPES[dtype], kind, page_size or 16,
                     ragged=ragged, q_counts=[2, 1])
    mask = make_mask()
    golden, same = references(p, mask, nm.IdentityScoreMod())
    block_n = simple.BLOCK_N if backend == "simple" else simt_tile(2 * H, p.dtype)
    for b in range(B):
        L, n = int(p.lengths[b]), int(p.counts[b])
        stop = first_kept(L - n) // block_n * block_n      # its first query keeps the most
        assert stop >= 128                                # most of the cache is poisoned
        poison_before(p, b, stop)
    out = np.full(p.out_shape, np.nan, p.dtype)
    _, lse = p.run(nm, mask=mask, num_partitions=P, return_lse=True, out=out, backend=backend)
    assert_matches_reference(out, lse, golden, same, backend)


# ---------------------------------------------------------------------------------------------
# GPU suite (skipped without a real GPU: conftest.py)
# ---------------------------------------------------------------------------------------------
#: A call in PTX (predicated or not) and its callee: ``call.uni (retval0), name, (...);``.
PTX_CALLEE = re.compile(r"\bcall(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?([A-Za-z_$][\w$]*)")
#: A local array in PTX: ``.local .align 8 .b8 __local_depot1[40];``.
PTX_LOCAL_DEPOT = re.compile(r"__local_depot\d+\[(\d+)\]")
#: Calls that a score mod's own math brings, which no inlining removes: helpers'
#: user_score_mod_scalar takes math.sin of a float64 (0.3 * k), and libdevice keeps sin's
#: large-argument (Payne-Hanek) reduction out of line, with a 40-byte local array of its own.
LIBDEVICE_CALLS = {"user_fn_scalar": frozenset({"__internal_trig_reduction_slowpathd"})}


def assert_compiled_flat(p, mask, score_mod, allowed_calls=frozenset(), backend="simt"):
    """The partition kernel compiled for problem p's configuration (factory.py) has no call
    left in its PTX (the mods are inlined; ``allowed_calls``: libdevice's own) and uses no
    local memory but the local arrays its PTX declares (none without such a call): no
    spills. The tensor-core kernel's SASS holds its wgmma instructions (HGMMA)."""
    tag = factory.dtype_tag(p.dtype)
    seesaws, forms = [], []
    if backend == "mma":  # workspace or one-partition (direct) output; TMA or cp.async tiles
        dispatchers = [factory.mma_partition_kernel(as_mask(mask), as_score_mod(score_mod), tag,
                                                    type(p.cache), p.heads, direct, tma)
                       for direct in (False, True) for tma in (False, True)]
        # TMA tiles: the seesaw kernel (its forms in selector._seesaw_fit's order), or the
        # lockstep kernel's TMA variant where they spill
        seesaws = [factory.seesaw_partition_kernel(as_mask(mask), as_score_mod(score_mod), tag,
                                                   type(p.cache), p.heads, direct,
                                                   follows=follows, rows_ahead=rows_ahead)
                   for rows_ahead in (True, False)
                   for follows in ((True, False) if seesaw.FOLLOWS else (True,))
                   for direct in (False, True)]
    elif backend == "mma_sync":
        # 16 or 32 query rows a block (heuristics.mma_sync_block_m), direct or workspace
        dispatchers = [factory.mma_sync_partition_kernel(as_mask(mask), as_score_mod(score_mod),
                                                         tag, type(p.cache), block_m, p.heads,
                                                         direct)
                       for block_m in (16, 32) for direct in (False, True)]
        # the 32-row block's split-role form, where the selector takes it (MMA_SYNC_ROLES)
        forms = [factory.mma_sync_roles_partition_kernel(as_mask(mask), as_score_mod(score_mod),
                                                         tag, type(p.cache), p.heads, direct,
                                                         wide, stages)
                 for direct in (False, True) for wide in (False, True)
                 for stages in mma_sync_roles.STAGES]
    elif backend == "simple":
        dispatchers = [factory.simple_partition_kernel(as_mask(mask), as_score_mod(score_mod),
                                                       tag, type(p.cache), simple.BLOCK_M,
                                                       p.heads, direct)
                       for direct in (False, True)]
    else:
        block_m = heuristics.simt_block_m(int(p.counts.max()) * p.heads, tag != "f32")
        dispatchers = [factory.partition_kernel(as_mask(mask), as_score_mod(score_mod), tag,
                                                type(p.cache), block_m, p.heads, direct)
                       for direct in (False, True)]  # workspace or one-partition output
    kernels = [k for d in dispatchers + seesaws + forms for k in d.overloads.values()]
    assert kernels, "the partition kernel for this configuration was never compiled"
    if backend == "mma_sync":
        rows = int(p.counts.max()) * p.heads
        block_m = heuristics.mma_sync_block_m(rows)
        roles = selector._mma_sync_roles(None, rows, None)
        # (a form whose build uses local memory gives way to the lockstep 32-row block)
        fell_back = roles and any(k.local_mem_per_thread > 0
                                  for d in forms for k in d.overloads.values())
        used = (dispatchers[2:] if fell_back else forms) if roles else (
            dispatchers[:2] if block_m == 16 else dispatchers[2:])
        assert any(d.overloads for d in used), (
            "expected the split-role form" if roles and not fell_back
            else f"expected the {block_m}-row mma_sync block")
    if backend == "mma":  # the copy engine brings the tiles wherever a tile fits one page
        tma = p.cache.kind == "contiguous" or p.cache.page_size % 64 == 0
        used = seesaws + dispatchers[1::2] if tma else dispatchers[0::2]
        assert any(d.overloads for d in used), (
            f"expected the {'TMA' if tma else 'cp.async'} variant for {p.cache!r}")
    for d in dispatchers + seesaws + forms:
        for k in d.overloads.values():
            # cc=None: the PTX the kernel was built from (the current device's architecture,
            # "sm_90a" on an H200), kept with the kernel; (9, 0) would compile it for "sm_90".
            ptx = k.inspect_asm(None)
            if backend == "mma_sync":  # 4 a step of S's loop (unrolled as the compiler likes),
                # 32 a step of P V's
                assert ptx.count("mma.sync.aligned.m16n8k16") >= 4 + 32
            if backend == "mma":
                # The lockstep kernel: 36 wgmma for Q.K^T and 4 for P.V; the seesaw's (16-bit
                # rows): seesaw.wgmma_count of the build's own S_UNROLL.
                assert ptx.count("wgmma.mma_async") == (
                    seesaw.wgmma_count(d.s_unroll) if d in seesaws else 40)
            callees = set(PTX_CALLEE.findall(ptx))
            assert callees <= allowed_calls, (
                f"call(s) left in the partition kernel's PTX: {sorted(callees - allowed_calls)}")
            declared = sum(int(n) for n in PTX_LOCAL_DEPOT.findall(ptx))
            assert declared == 0 or callees, (
                f"the kernel's PTX declares {declared} B of local memory")
            if callees and backend == "mma":
                # The call's ABI saves the live accumulators to local memory around it (and
                # ptxas serialises the wgmmas): slow, and expected of a score mod with a call.
                continue
            if d in forms and k.local_mem_per_thread > declared:
                # built only for the selector's local-memory check: the lockstep block ran
                assert any(x.overloads for x in dispatchers[2:]), (
                    "the split-role form uses local memory and no lockstep block replaced it")
                continue
            if d in seesaws and k.local_mem_per_thread > declared:
                # A seesaw kernel that spills is not launched: the plain seesaw form after the
                # one launched to follow (the same direct) or the lockstep kernel's TMA variant
                # was compiled in its place (it is compiled for nothing else).
                direct = seesaws.index(d) % 2
                assert (any(x.overloads for x in seesaws[seesaws.index(d) + 2::2])
                        or dispatchers[2 * direct + 1].overloads), (
                    "the seesaw kernel spills and no other seesaw form or lockstep TMA kernel "
                    "replaced it")
                continue
            assert k.local_mem_per_thread <= declared, (
                f"the partition kernel uses {k.local_mem_per_thread} bytes of local memory per "
                f"thread (its PTX declares {declared}): spills")


@dataclass(frozen=True)
class GpuCrossCase:
    """Every mask x every score mod; the other factors cycle with the case's index."""

    index: int
    mask: str
    score_mod: str
    backend: str = "simt"

    @property
    def heads(self):
        return (1, 16, 128)[self.index % 3]

    @property
    def dtype(self):
        if self.backend in TENSOR_CORES:  # 16-bit only
            return ("bf16", "fp16")[(self.index + self.index // 3) % 2]
        return ("bf16", "fp16", "fp32")[(self.index + self.index // 3) % 3]

    @property
    def cache(self):
        return (("contiguous", 0), ("paged", 1), ("paged", 16), ("paged", 64),
                ("paged", 128))[self.index % 5]

    @property
    def num_partitions(self):
        return (None, 1, 3, 1000)[self.index % 4]

    @property
    def sq(self):
        return 1 + (self.index // 7) % 2

    @property
    def ragged(self):
        return self.index % 7 == 3

    def __str__(self):
        kind, ps = self.cache
        return (f"{self.backend}-{self.mask}-{self.score_mod}-H{self.heads}-{self.dtype}-"
                f"{kind}{ps or ''}-P{self.num_partitions}-Sq{self.sq}"
                f"{'-ragged' if self.ragged else ''}")


GPU_CROSS = [GpuCrossCase(j, m.id, s.id, backend)
             for backend in KERNEL_BACKENDS
             for j, (m, s) in enumerate((m, s) for m in MASK_CASES for s in SCORE_MOD_CASES)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CROSS, ids=str)
def test_gpu_masks_and_score_mods(case, rng):
    B = 3
    longest = int(rng.choice([289, 297, 301, 311]))
    lengths = lengths_with_longest(rng, B, case.sq, longest, zero=case.index % 2 == 0)
    kind, page_size = case.cache
    p = make_problem(rng, B, case.sq, case.heads, lengths, DTYPES[case.dtype], kind,
                     page_size or 16, ragged=case.ragged,
                     q_counts=ragged_counts(rng, lengths, case.sq) if case.ragged else None)
    mask, score_mod = MASKS[case.mask].make(p, rng), SCORE_MODS[case.score_mod].make(p)
    check_kernel(p, mask, score_mod, case.num_partitions, case.backend)
    assert_compiled_flat(p, mask, score_mod, LIBDEVICE_CALLS.get(case.score_mod, frozenset()),
                         case.backend)


@dataclass(frozen=True)
class Shape:
    B: int
    H: int
    L: int              # the longest length (odd); the others are random in [Sq, L]
    sq: int
    dtype: str
    cache: str
    page_size: int
    mask: str           # "null" or "causal"
    num_partitions: Optional[int] = None
    ragged: bool = False

    @property
    def reference_flop(self):
        """The float64 reference's work at most: q.K (576) and P.V (512) for every key."""
        return 2 * self.B * self.sq * self.H * self.L * (576 + 512)

    def __str__(self):
        return (f"B{self.B}-H{self.H}-L{self.L}-Sq{self.sq}-{self.dtype}-{self.cache}"
                f"{self.page_size or ''}-{self.mask}-P{self.num_partitions}"
                f"{'-ragged' if self.ragged else ''}")


SHAPES = [
    Shape(2, 128, 32767, 1, "bf16", "paged", 64, "null"),
    Shape(64, 16, 4097, 1, "fp16", "paged", 1, "causal"),
    Shape(16, 128, 8191, 1, "bf16", "paged", 128, "causal"),
    Shape(8, 1, 20001, 2, "fp32", "contiguous", 0, "causal"),
    Shape(1, 128, 65535, 1, "bf16", "paged", 64, "causal"),
    Shape(32, 16, 2049, 2, "fp16", "paged", 16, "causal", 3, ragged=True),
    Shape(4, 128, 16383, 2, "fp32", "contiguous", 0, "null"),
    Shape(64, 128, 513, 1, "bf16", "paged", 16, "null", 64),       # 17 tiles, 64 partitions
    Shape(3, 16, 32767, 2, "fp16", "paged", 1, "causal", 7),
    Shape(64, 1, 1025, 1, "fp32", "paged", 128, "null", ragged=True),
]


def test_shape_sweep_reference_stays_affordable():
    """Each sweep case's float64 reference stays under ~40 GFLOP (NumPy, on the host)."""
    for s in SHAPES:
        assert s.reference_flop <= 40e9, f"{s}: {s.reference_flop / 1e9:.1f} GFLOP"
    assert {s.page_size for s in SHAPES if s.cache == "paged"} == {1, 16, 64, 128}


@pytest.mark.gpu
@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gpu_shapes(shape, backend, rng):
    if backend in TENSOR_CORES and shape.dtype == "fp32":
        pytest.skip("the tensor-core kernels take 16-bit data")
    lengths = lengths_with_longest(rng, shape.B, shape.sq, shape.L, zero=shape.B > 2)
    p = make_problem(rng, shape.B, shape.sq, shape.H, lengths, DTYPES[shape.dtype], shape.cache,
                     shape.page_size or 16, ragged=shape.ragged,
                     q_counts=ragged_counts(rng, lengths, shape.sq) if shape.ragged else None)
    check_kernel(p, MASKS[shape.mask].make(p, rng), nm.IdentityScoreMod(), shape.num_partitions,
                 backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_gpu_torch_tensors(backend, rng):
    """torch CUDA tensors in (q, pages, block table, lengths, out): torch tensors out, on
    q's device, q's dtype; lse a float32 torch tensor."""
    torch = cuda_torch()

    p = make_problem(rng, 3, 2, 16, lengths_with_longest(rng, 3, 2, 301), BF16, "paged", 64)
    mask, score_mod = nm.CausalMask(), nm.SoftCapScoreMod(5.0)
    golden, same = references(p, mask, score_mod)
    q = to_torch(torch, p.q)
    cache = nm.PagedKVCache(to_torch(torch, p.cache.storage), to_torch(torch, p.cache.block_table),
                            to_torch(torch, p.lengths))
    out, lse = nm.mla_decode(q, cache, p.scale, mask, score_mod, return_lse=True, backend=backend)
    assert isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)
    assert out.device == q.device and lse.device == q.device
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert tuple(out.shape) == p.out_shape and tuple(lse.shape) == p.lse_shape
    assert_matches_reference(to_numpy(torch, out), to_numpy(torch, lse), golden, same, backend)

    out_t = torch.full(p.out_shape, float("nan"), dtype=torch.bfloat16, device=q.device)
    got = nm.mla_decode(q, cache, p.scale, mask, score_mod, out=out_t, backend=backend)
    assert got is out_t
    np.testing.assert_array_equal(f64(to_numpy(torch, out_t)), f64(to_numpy(torch, out)))


@KERNEL
@pytest.mark.parametrize("rows", [pytest.param(2, id="16rows"),
                                  pytest.param(32, id="32rows", marks=pytest.mark.slow)])
def test_cache_not_16_byte_aligned_copies_words(rows, rng, monkeypatch):
    """A cache whose start is not 16-byte aligned (a view into a larger buffer: see the GPU
    test below) is copied in 4-byte pieces: the same answers. Here the alignment check is
    made to say no, so the simulator runs that variant too. (32 rows, a minute in the
    simulator, runs with the slow tests; CI reaches its 4-byte copy through
    test_one_partition_of_several_tiles.)"""
    monkeypatch.setattr(launch, "_aligned16", lambda dev: False)
    p = make_problem(rng, 2, 1, rows, [simt_tile(rows, BF16) + 3, 9], BF16, "paged", 16)
    check_kernel(p, nm.CausalMask(), nm.IdentityScoreMod(), num_partitions=2)


@KERNEL
@pytest.mark.parametrize("wide", [True, False], ids=["16B", "4B"])
@pytest.mark.parametrize("rows", [2, 32], ids=["16rows", "32rows"])
def test_one_partition_of_several_tiles(rows, wide, rng, monkeypatch):
    """One partition walks three tiles: each next tile's copy goes out a few pieces a trip of
    the P.V loop (16- or 4-byte pieces; two keys a thread at 16 rows), and at 32 rows the
    scores convert their slice of the tile as they go. A piece copied late or not at all
    leaves the previous tile's keys (or NaN) in its place."""
    monkeypatch.setattr(launch, "_aligned16", lambda dev: wide)
    n = simt_tile(rows, BF16)
    p = make_problem(rng, 1, 1, rows, [2 * n + 5], BF16, "paged", 16)
    check_kernel(p, nm.NullMask(), nm.IdentityScoreMod(), num_partitions=1)


@KERNEL
@pytest.mark.parametrize("case", [
    # (B, Sq, H, lengths, dtype, cache, page, mask, mod, P): the second m16 tile holding one
    # row (17), a partition of two tiles (the stages swap) beside one of one, the window's
    # first keys cut (CI's case)
    (1, 1, 17, [130], "bf16", "paged", 16, "window100", "identity", 2),
    # two row groups (32 rows, then 8), one partition of four tiles, ALiBi
    (1, 2, 20, [200], "fp16", "contiguous", 0, "causal", "alibi", 1),
], ids=str)
def test_mma_sync_32_rows(case, rng):
    """The warp tensor-core kernel's 32-row block (8 warps, two key tiles in flight), which
    the selector takes where a sequence has more than 16 query rows and the device gives a
    block 192 KB (the simulator counts as an H100)."""
    from numba_mla import heuristics

    B, Sq, H, lengths, dtype, kind, page, mask_id, mod_id, P = case
    assert heuristics.mma_sync_block_m(Sq * H) == 32
    p = make_problem(rng, B, Sq, H, lengths, DTYPES[dtype], kind, page)
    mask = (nm.SlidingWindowCausalMask(100) if mask_id == "window100" else
            MASKS[mask_id].make(p, rng))
    check_kernel(p, mask, SCORE_MODS[mod_id].make(p), P, "mma_sync")


@KERNEL
@pytest.mark.parametrize("case,order,stages", [
    # (B, Sq, H, lengths, dtype, cache, page, mask, mod, P, wide): one partition of three
    # tiles (six sub-tiles: every stage and buffer taken twice, the copies a stage count of
    # sub-tiles ahead) whose last holds 5 keys (its second half past the end), the second
    # m16 tile with one row (17), beside an empty sequence (no tile: out 0, LSE -inf, written
    # by the block itself); with the V warps run ahead ("high") and four stages, and with
    # the score warps ahead ("low"), four stages and three (an A100's), 4-byte copies
    ((2, 1, 17, [133, 0], "bf16", "paged", 16, "null", "identity", 1, True), "high", 4),
    ((2, 1, 17, [133, 0], "fp16", "paged", 16, "causal", "alibi", 1, False), "low", 4),
    ((2, 1, 17, [133, 0], "fp16", "paged", 16, "causal", "alibi", 1, False), "low", 3),
    # ... and three stages with 16-byte copies into swizzled rows (an A100's default)
    ((2, 1, 17, [133, 0], "bf16", "paged", 16, "causal", "identity", 1, True), "low", 3),
    # 16-byte copies from a contiguous and a ragged cache (each row's address from the
    # cache's own lookup: b x capacity + slot, the run's offset + key)
    ((3, 1, 20, [70, 0, 133], "bf16", "contiguous", 0, "null", "identity", 1, True), "high", 4),
    ((3, 1, 20, [70, 0, 133], "fp16", "ragged", 0, "causal", "softcap", 1, True), "low", 4),
    # (GPU machine) two row groups (32 rows, then 8) in two partitions; a window that skips
    # tiles, an empty sequence and split-K in three
    pytest.param((1, 2, 20, [100], "fp16", "contiguous", 0, "causal", "alibi", 2, False),
                 "fifo", 4, marks=pytest.mark.slow),
    pytest.param((2, 1, 32, [300, 0], "bf16", "paged", 64, "window100", "softcap", 3, True),
                 "fifo", 4, marks=pytest.mark.slow),
], ids=str)
@pytest.mark.parametrize("ahead", [False, True], ids=["s_in_turn", "s_ahead"])
def test_mma_sync_roles(case, order, stages, ahead, rng, monkeypatch):
    """The 32-row block's split-role form (kernels/mma_sync_roles.py: four warps score with
    Q in registers, four multiply by V and copy the tiles), which the selector takes with
    ``MMA_SYNC_ROLES`` on (in three stages with ``MMA_SYNC_ROLES_THREE_STAGES`` too). With
    the score warps run ahead of the V warps ("low") and behind them ("high"), a handoff
    without its barrier reads a buffer before it is written or writes it before it is read,
    and a wait for one copy group too few reads a stage not yet landed (tried: each of its
    five handoffs removed, and each wait one short, fails the "high" four-stage case or the
    "low" three-stage one). Also with the score warps' S of the next sub-tile issued before
    this one's P (``mma_sync_roles.S_AHEAD``, the default; four stages only) and without.
    """
    from numba_mla import _numba

    B, Sq, H, lengths, dtype, kind, page, mask_id, mod_id, P, wide = case
    if ahead and stages == 3:
        pytest.skip("the three-stage form keeps S in turn (factory.py): s_in_turn's case")
    monkeypatch.setattr(mma_sync_roles, "S_AHEAD", ahead)
    monkeypatch.setattr(selector, "MMA_SYNC_ROLES", True)
    monkeypatch.setattr(selector, "MMA_SYNC_ROLES_THREE_STAGES", True)
    monkeypatch.setattr(launch, "_aligned16", lambda dev: wide)
    if stages == 3:  # (an A100's block: the 32-row block itself does not fit)
        monkeypatch.setattr(heuristics, "smem_per_block", lambda: 166912)
        assert heuristics.mma_sync_block_m(Sq * H) == 16
    assert mma_sync_roles.stages_that_fit(heuristics.smem_per_block()) == stages
    specs = launched_specs(monkeypatch)
    p = make_problem(rng, B, Sq, H, lengths, DTYPES[dtype], kind, page)
    mask = (nm.SlidingWindowCausalMask(100) if mask_id == "window100" else
            MASKS[mask_id].make(p, rng))
    with _numba.sim_turn_order(order):
        check_kernel(p, mask, SCORE_MODS[mod_id].make(p), P, "mma_sync")
    assert [(spec.backend, spec.dispatcher.form) for spec in specs] == [
        ("mma_sync_roles", dict(stages=stages, wide=wide, s_chains=4, s_ahead=ahead,
                                v_warps=4, max_early=True, p_ftz=True, sums_late=True,
                                lane_max=True, packed=True, copy_lanes=8,
                                copy_cache="cg", copy_const_full=False, k_swizzle=wide,
                                score_quarters=False, quarters_skip_own=False))], (
        "expected the split-role kernel, its copies, stages and S")


@KERNEL
@pytest.mark.parametrize("heads,block_m,swizzle", [(16, 16, True), (20, 32, True),
                                                   (16, 16, False)])
def test_mma_sync_swizzled_stages(heads, block_m, swizzle, rng, monkeypatch):
    """The lockstep blocks (16 rows, and 32 with the split-role form off) with their key
    stages swizzled (``mma_sync.K_SWIZZLE``, the default for a 16-byte aligned cache: each
    16-byte unit u of a row at u ^ (row & 7), the copy's pieces and every ldmatrix address of
    K and V with it), and with the padded rows it replaced, match the reference: two tiles,
    the second partial, pages of 16 keys, beside an empty sequence, a 16-byte aligned
    cache."""
    from numba_mla.kernels import mma_sync

    monkeypatch.setattr(mma_sync, "K_SWIZZLE", swizzle)
    monkeypatch.setattr(selector, "MMA_SYNC_ROLES", False)
    monkeypatch.setattr(launch, "_aligned16", lambda dev: True)
    assert heuristics.mma_sync_block_m(heads) == block_m
    specs = launched_specs(monkeypatch)
    p = make_problem(rng, 2, 1, heads, [100, 0], BF16, "paged", 16)
    check_kernel(p, nm.CausalMask(), SCORE_MODS["softcap"].make(p), 1, "mma_sync")
    assert [(s.backend, s.dispatcher.form["k_swizzle"]) for s in specs] == [
        ("mma_sync", swizzle)], "expected the lockstep block with its stages as asked"


@KERNEL
def test_mma_sync_tile_copies_in_words(rng, monkeypatch):
    """The warp tensor-core kernel's cp.async tile copy in 4-byte pieces (a cache that does
    not start 16-byte aligned; the 16-byte pieces are every other mma_sync case's): one
    partition of two tiles whose rows cross 16-key pages, the second partial (zeros past the
    end; the slots past the length hold NaN)."""
    from numba_mla.kernels import mma_sync

    monkeypatch.setattr(launch, "_aligned16", lambda dev: False)
    p = make_problem(rng, 1, 1, 1, [mma_sync.BLOCK_N + 5], BF16, "paged", 16)
    check_kernel(p, nm.NullMask(), nm.IdentityScoreMod(), 1, "mma_sync")


@pytest.mark.gpu
def test_gpu_cache_not_16_byte_aligned(rng):
    """A torch cache that starts 4 bytes past a 16-byte boundary: the FMA kernel copies it
    in 4-byte pieces and gives the reference's answer; 'auto' falls back to it; 'mma'
    (16-byte copies) refuses before any launch, leaving ``out`` as it was."""
    torch = cuda_torch()
    p = make_problem(rng, 3, 1, 32, lengths_with_longest(rng, 3, 1, 200), BF16, "paged", 16)
    mask, score_mod = nm.CausalMask(), nm.IdentityScoreMod()
    golden, same = references(p, mask, score_mod)
    pages = to_torch(torch, p.cache.storage)
    buf = torch.empty(pages.numel() + 2, dtype=pages.dtype, device=pages.device)
    shifted = buf[2:].view(pages.shape)
    shifted.copy_(pages)
    assert shifted.data_ptr() % 16 == 4
    cache = nm.PagedKVCache(shifted, to_torch(torch, p.cache.block_table),
                            to_torch(torch, p.lengths))
    q = to_torch(torch, p.q)
    for backend in ("simt", "auto"):
        out, lse = nm.mla_decode(q, cache, p.scale, mask, score_mod, return_lse=True,
                                 backend=backend)
        assert_matches_reference(to_numpy(torch, out), to_numpy(torch, lse), golden, same,
                                 "simt")
    out = torch.full(p.out_shape, float("nan"), dtype=torch.bfloat16, device=q.device)
    with pytest.raises(ValueError, match="16-byte aligned"):
        nm.mla_decode(q, cache, p.scale, mask, score_mod, out=out, backend="mma")
    assert torch.isnan(out).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_gpu_numba_device_arrays(dtype, rng):
    """Numba device arrays in: a Numba device array of q's dtype out (or the caller's
    ``out``), lse a float32 device array."""
    from numba import cuda

    dt = DTYPES[dtype]
    p = make_problem(rng, 3, 1, 16, lengths_with_longest(rng, 3, 1, 299), dt, "contiguous")
    mask, score_mod = nm.ChunkedCausalMask(64), nm.AlibiScoreMod(16)
    golden, same = references(p, mask, score_mod)
    q = cuda.to_device(p.q)
    cache = nm.ContiguousKVCache(cuda.to_device(p.cache.kv), cuda.to_device(p.lengths))
    out, lse = nm.mla_decode(q, cache, p.scale, mask, score_mod, return_lse=True, backend="simt")
    assert cuda.is_cuda_array(out) and cuda.is_cuda_array(lse)
    assert hasattr(out, "copy_to_host") and hasattr(lse, "copy_to_host")
    assert out.shape == p.out_shape and lse.shape == p.lse_shape
    host_out, host_lse = out.copy_to_host(), lse.copy_to_host()
    # The values first (seen as q's dtype), then the dtype itself.
    assert_matches_reference(host_out.view(dt), host_lse, golden, same)
    assert host_out.dtype == dt, f"out: expected a {dt} device array, got dtype {host_out.dtype}"
    assert host_lse.dtype == np.float32

    out_d = cuda.to_device(np.full(p.out_shape, np.nan, dt))
    got = nm.mla_decode(q, cache, p.scale, mask, score_mod, out=out_d, backend="simt")
    assert got is out_d
    np.testing.assert_array_equal(out_d.copy_to_host(), host_out.view(dt))
