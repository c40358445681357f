"""Split-K paths of every kernel backend, in shapes just large enough to reach them (marked
``kernel``: the simulator in CI, the device where there is one).

Each partition kernel cuts a sequence's kept keys into tiles and gives partition p of P the
p-th run of ``ceil(tiles / P)`` consecutive tiles (``partition_runs``); the combine merges
the partitions of a row, up to UNROLL of them in one step (the one-step kernel), more in
``split()`` groups of ``UNROLL`` partitions a step, the groups meeting at the end
(kernels/combine.py, ``variant``). Tile sizes come from the kernel modules
(``Backend.tile_keys``), and each case asserts the geometry it is meant to have before it
runs, so a change of tile size cannot quietly turn it into a case that no longer reaches
its path:

- ``runs_of_tiles``: two partitions of three and two tiles, the last tile partial (paged,
  pages not aligned with tiles). Guards the online softmax across the tiles of a partition
  (a running sum not rescaled when a later tile raises the maximum fails it, FMA kernel) and
  the combine's last partition (a combine that skips it fails it, every backend).
- ``ragged_three_parts``: three partitions of two, two and one tile over ragged q (a
  sequence with no query rows, a short one): the last partition holds only a partial tile.
  Guards the same, on a contiguous cache and 16-bit data.
- ``sixteen_parts``: 16 partitions of one tile each, nine holding keys: two combine groups,
  both with keys. Guards the combine's cross-group merge: group weights exp(m_group - max)
  taken as exp2 fail it, every backend.

Every backend runs every case (``BACKENDS``: add a backend there); each result is checked
three ways against the float64 reference (out and lse), with out pre-filled with NaN (every
element must be written) and NaN in every cache slot no valid key occupies (make_problem).
"""
from dataclasses import dataclass
from typing import Callable, Tuple

import numpy as np
import pytest

import numba_mla as nm
from helpers import DTYPES, assert_three_way, fp32_floor, make_problem, references, spy_factory
from numba_mla import _compat, heuristics
from numba_mla.kernels import combine, mma, mma_sync, simple, simt


# ---------------------------------------------------------------------------------------------
# Backends and their tiles
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Backend:
    """A kernel backend: its ``backend=`` name, the dtypes it takes (DTYPES keys), and its
    keys per tile, ``tile_keys(dtype, rows)`` for ``rows`` query rows a sequence (H x the
    largest query count), read from its kernel module."""

    name: str
    dtypes: Tuple[str, ...]
    tile_keys: Callable[[str, int], int]


def simt_tile_keys(dtype, rows):
    """The FMA kernel's tile: it depends on the rows a block holds (chosen as launch.py does)
    and on whether the storage is 16-bit."""
    packed = DTYPES[dtype].itemsize == 2
    return simt.block_n(heuristics.simt_block_m(rows, packed), packed)


BACKENDS = [
    Backend("simt", ("bf16", "fp16", "fp32"), simt_tile_keys),
    Backend("mma", ("bf16", "fp16"), lambda dtype, rows: mma.BLOCK_N),
    Backend("mma_sync", ("bf16", "fp16"), lambda dtype, rows: mma_sync.BLOCK_N),  # (any rows)
    Backend("simple", ("bf16", "fp16", "fp32"), lambda dtype, rows: simple.BLOCK_N),
]


def partition_runs(ntiles, P):
    """[t0, t1) the tiles partition p walks, for p = 0 .. P-1 (the split every partition
    kernel makes: runs of ceil(ntiles / P) tiles, the last ones short or empty)."""
    per_part = -(-ntiles // P)
    return [(min(p * per_part, ntiles), min((p + 1) * per_part, ntiles)) for p in range(P)]


def combine_groups(rows, P):
    """(S, group of each partition): the combine's partition groups for ``rows`` output rows
    (T x H) and P partitions; group g merges partitions g*UNROLL ..., S*UNROLL apart."""
    S = combine.split(rows, P, heuristics.sm_count())
    return S, [(p // combine.UNROLL) % S for p in range(P)]


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SplitCase:
    """The longest sequence has ``tiles`` key tiles, its last one holding ``tail`` keys (fewer
    than any backend's tile), split into ``partitions``. ``dtypes``: the first one the backend
    takes is used. ``guards``: the geometry the case must have (asserted in ``geometry``)."""

    name: str
    dtypes: Tuple[str, ...]
    cache: str                  # "contiguous" or "paged<page size>"
    layout: str                 # "padded" or "ragged"
    sq: int
    heads: int
    tiles: int
    tail: int
    partitions: int
    guards: Tuple[str, ...]

    def dtype(self, backend):
        return next(d for d in self.dtypes if d in backend.dtypes)

    @property
    def page_size(self):
        return int(self.cache[5:]) if self.cache.startswith("paged") else None


CASES = [
    SplitCase("runs_of_tiles", ("fp32", "bf16"), "paged5", "padded", sq=2, heads=2, tiles=5,
              tail=3, partitions=2,
              guards=("several_tiles", "last_partition_keys", "partial_last_tile")),
    SplitCase("ragged_three_parts", ("bf16",), "contiguous", "ragged", sq=2, heads=2, tiles=5,
              tail=5, partitions=3,
              guards=("several_tiles", "last_partition_keys", "partial_last_tile")),
    SplitCase("sixteen_parts", ("fp32", "bf16"), "contiguous", "padded", sq=1, heads=2, tiles=9,
              tail=7, partitions=2 * combine.UNROLL, guards=("cross_group",)),
]


def geometry(case, backend):
    """(longest length, tile) for ``case`` on ``backend``, after asserting the case's guards
    against the tile sizes and the partition and combine splits."""
    dtype = case.dtype(backend)
    tile = backend.tile_keys(dtype, case.sq * case.heads)
    assert 0 < case.tail < tile
    length = (case.tiles - 1) * tile + case.tail
    runs = partition_runs(case.tiles, case.partitions)
    with_keys = [p for p, (t0, t1) in enumerate(runs) if t1 > t0]
    if case.page_size is not None:  # tiles straddle pages, at a different place each tile
        assert tile % case.page_size and case.page_size % tile, (case.page_size, tile)
    for guard in case.guards:
        if guard == "several_tiles":  # every partition with keys but the last walks 2+ tiles
            assert all(t1 - t0 >= 2 for t0, t1 in runs[:with_keys[-1]]), runs
            assert len(with_keys) >= 2, runs
        elif guard == "last_partition_keys":
            assert with_keys[-1] == case.partitions - 1, runs
        elif guard == "partial_last_tile":  # the last tile, in the last partition, is short
            assert length % tile and runs[-1][1] == case.tiles, (length, tile, runs)
        elif guard == "cross_group":  # the combine's groups, two or more of them with keys
            S, group = combine_groups(case.sq * case.heads, case.partitions)
            assert S >= 2 and len({group[p] for p in with_keys}) >= 2, (S, group, runs)
        else:
            raise AssertionError(f"unknown guard {guard!r}")
    return length, tile


def make_case_problem(case, backend, rng):
    """The case's problem: one sequence of the longest length (padded), or three (ragged:
    the longest with ``sq`` query rows, one with none, a short one with one row)."""
    length, _ = geometry(case, backend)
    kind = "paged" if case.page_size else "contiguous"
    dtype = DTYPES[case.dtype(backend)]
    if case.layout == "ragged":
        lengths, counts = [length, 9, 2], [case.sq, 0, 1]
        return make_problem(rng, 3, case.sq, case.heads, lengths, dtype, kind,
                            case.page_size or 16, ragged=True, q_counts=counts)
    return make_problem(rng, 1, case.sq, case.heads, [length], dtype, kind, case.page_size or 16)


@pytest.mark.kernel
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_split_path(backend, case, rng):
    p = make_case_problem(case, backend, rng)
    mask = nm.CausalMask() if case.sq > 1 else nm.NullMask()
    golden, same = references(p, mask)
    out = np.full(p.out_shape, np.nan, p.dtype)
    got, lse = p.run(nm, mask=mask, num_partitions=case.partitions, return_lse=True, out=out,
                     backend=backend.name)
    assert got is out
    assert isinstance(lse, np.ndarray) and lse.shape == p.lse_shape and lse.dtype == np.float32
    assert_three_way(out, same[0], golden[0], floor=fp32_floor(golden[0], backend.name),
                     what="out")
    assert_three_way(lse, same[1], golden[1], floor=fp32_floor(golden[1], backend.name),
                     what="lse")


def test_geometry_guards_can_fail():
    """The guards reject a split that misses its path: a last partition left empty, partitions
    of one tile, 16 partitions whose keys all sit in the combine's first group."""
    wide = Backend("wide", ("bf16",), lambda dtype, rows: 64)
    for base, bad in ((CASES[0], dict(tiles=4, partitions=3)),
                      (CASES[0], dict(tiles=5, partitions=5)),
                      (CASES[2], dict(tiles=combine.UNROLL))):
        with pytest.raises(AssertionError):
            geometry(SplitCase(**{**base.__dict__, **bad}), wide)
    for case in CASES:  # the real cases pass, on every backend
        for backend in BACKENDS:
            geometry(case, backend)


# ---------------------------------------------------------------------------------------------
# The listed schedule (the tensor-core kernel with TMA tiles: kernels/seesaw.py)
# ---------------------------------------------------------------------------------------------
@pytest.mark.kernel
@pytest.mark.parametrize("layout", ["padded", "ragged"])
def test_listed_schedule(layout, rng, monkeypatch):
    """The seesaw kernel run from the listed schedule's table (heuristics.list_blocks), the
    pieces forced: a sequence of three tiles cut in three (the last one partial), one of one
    tile whole beside two partitions left empty, an empty sequence, one of two tiles (the last
    partial) cut in two. Padded: one token of 2 heads (one row group; 12 blocks, what the
    simulator affords); ragged: 2 + 1 + 0 + 2 tokens of 33 heads (two row groups, 24 blocks).
    Checked three ways against the references, out pre-filled with NaN; on a GPU a second
    run gives the same bits, and the combine went as the partition kernel's programmatic
    dependent (the driver took the launch attribute: launch._Launch falls back without it)."""
    tile = mma.BLOCK_N
    lengths, pieces = [2 * tile + 9, tile, 0, 2 * tile - 5], np.array([3, 1, 1, 2], np.int32)
    monkeypatch.setattr(heuristics, "listed_split", lambda *args, **kwargs: pieces)
    # (the mixed runs, weighed up to one pair a multiprocessor, would take the ragged case)
    monkeypatch.setattr(heuristics, "MIXED_RUNS", False)
    plans = run_forced_schedule(rng, monkeypatch, layout, lengths)
    spec = plans[0].spec
    assert spec.backend == "seesaw" and spec.work is not None and spec.num_partitions == 3
    groups = 2 if layout == "ragged" else 1
    assert len(spec.work) == 4 * groups * 3  # every (sequence, row group, piece) of P = 3
    if not _compat.SIMULATOR:
        merge = plans[0].launches[-1]
        assert merge.dispatcher.py_func.__name__ == "combine_kernel"
        assert merge._config is not None


def record_plans(monkeypatch):
    """A list that gets every plan ``launch.Plan`` makes from now on (the test's)."""
    from numba_mla import launch

    plans = []
    plan_of = launch.Plan

    def recording_plan(call, *args, **kwargs):
        plans.append(plan_of(call, *args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(launch, "Plan", recording_plan)
    return plans


def run_forced_schedule(rng, monkeypatch, layout, lengths):
    """A schedule test's problem under "mma" ("padded": one token of 2 heads, no mask;
    "padded64": of seesaw.LAG_HEADS heads, where the seesaw kernel's softmax path differs;
    "ragged": 2 + 1 + 0 + 2 tokens of 33 heads, causal), checked three ways against the
    references with out pre-filled with NaN, and on a GPU run twice for the same bits;
    returns the plans made."""
    if layout == "ragged":
        p = make_problem(rng, 4, 2, 33, lengths, DTYPES["bf16"], "paged", mma.BLOCK_N,
                         ragged=True, q_counts=[2, 1, 0, 2])
        mask = nm.CausalMask()
    else:
        from numba_mla.kernels import seesaw

        heads = seesaw.LAG_HEADS if layout == "padded64" else 2
        p = make_problem(rng, 4, 1, heads, lengths, DTYPES["bf16"], "paged", mma.BLOCK_N)
        mask = nm.NullMask()
    plans = record_plans(monkeypatch)
    golden, same = references(p, mask)
    outs = []
    for _ in range(1 if _compat.SIMULATOR else 2):
        out = np.full(p.out_shape, np.nan, p.dtype)
        got, lse = p.run(nm, mask=mask, return_lse=True, out=out, backend="mma")
        outs.append((out, lse))
    assert_three_way(outs[0][0], same[0], golden[0], floor=fp32_floor(golden[0], "mma"),
                     what="out")
    assert_three_way(outs[0][1], same[1], golden[1], floor=fp32_floor(golden[1], "mma"),
                     what="lse")
    for a, b in zip(outs[0], outs[-1]):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    return plans


# ---------------------------------------------------------------------------------------------
# The runs schedule (the seesaw kernel's ``runs`` form: kernels/seesaw.py)
# ---------------------------------------------------------------------------------------------
#: test_runs_schedule's forced runs, each a block's items (b, slot, t0, t1), over sequences of
#: 3, 1, 0 and 2 tiles: "mixed" cuts and crosses sequences, "whole" cuts none
RUNS_OF_TEST = {"mixed": [[(0, 0, 0, 2), (1, 0, 0, 1)],
                          [(0, 1, 2, -1), (2, 0, 0, -1), (3, 0, 0, 1)],
                          [(3, 1, 1, -1), (1, 1, 1, -1)]],
                "whole": [[(2, 0, 0, -1), (0, 0, 0, -1)],
                          [(1, 0, 0, -1), (3, 0, 0, -1)]],
                # heuristics.whole_runs of those sequences in two runs: longest first, the
                # empty sequence after a tiled one (test_runs_table_of_whole_runs)
                "packed": [[(0, 0, 0, -1), (2, 0, 0, -1)],
                           [(3, 0, 0, -1), (1, 0, 0, -1)]],
                # cut and whole sequences in one table (heuristics.MIXED_RUNS): the first
                # sequence cut across blocks 0 and 1, the second and last whole (written out
                # by their items), the empty one whole (merged as empty)
                "some whole": [[(0, 0, 0, 2), (1, 0, 0, -1)],
                               [(0, 1, 2, -1), (2, 0, 0, -1)],
                               [(3, 0, 0, -1)]]}


#: test_runs_schedule's (form, order, blocks)
RUNS_FORMS = [
    ("ahead", "fifo", "mixed"), ("ahead", "low", "mixed"), ("staged", "fifo", "mixed"),
    ("ahead", "fifo", "whole"), ("staged", "fifo", "whole"), ("q_early", "fifo", "mixed"),
    ("q_early", "low", "mixed"), ("q_early", "fifo", "whole"), ("q_early", "fifo", "packed"),
    ("q_early", "low", "packed"), ("q_early", "fifo", "some whole"),
    ("q_early", "low", "some whole")]


@pytest.mark.kernel
@pytest.mark.parametrize("layout,form,order,blocks", [
    # (the forms that are off, "ahead" and "staged", on ragged q: slow, the GPU run's; 14-25 s
    # each in the simulator, where their padded cases cover them)
    pytest.param(layout, *f, marks=[pytest.mark.slow] if layout == "ragged"
                 and f[0] != "q_early" else [])
    for layout in ("padded", "ragged") for f in RUNS_FORMS] + [
    # (the library's form at LAG_HEADS heads: seesaw.ROWS_AHEAD's lookups across items)
    ("padded64", "q_early", "fifo", "mixed"), ("padded64", "q_early", "fifo", "some whole")])
def test_runs_schedule(layout, form, order, blocks, rng, monkeypatch):
    """The seesaw kernel's runs form (selector.SEESAW_RUNS) from a forced table over
    sequences of 3, 1, 0 and 2 tiles (the last partial in the first and last): block 0 walks
    the first sequence's tiles 0-1 (a pair) into partition 0, then the second's one tile,
    planned as a piece of two (a pair without its second tile); block 1 the first sequence's
    last tile into partition 1 (its last piece), the empty sequence (its partitions marked
    empty) and the last sequence's first tile; block 2 that sequence's last tile, then the
    second sequence's second piece, which finds no tile (the sequence shorter than planned:
    its partition marked empty). So items cross sequences inside a block, each warpgroup's
    barrier phases carry from item to item after odd tile counts, and every partition is
    written or marked. Padded: one token of 2 heads; ragged: 2 + 1 + 0 + 2 tokens of 33 heads
    (two row groups, six blocks). ``form``: "ahead" (seesaw.RUNS_AHEAD), each item's output
    from the registers and the next item's copies started under it; "staged", the output
    staged as the grid kernel's; "q_early", staged with the next item's queries copied under
    it (seesaw.RUNS_Q_EARLY). ``blocks`` "whole": every item a whole sequence, so the
    kernel writes out itself (one partition, no combine): block 0 the empty sequence (walked
    for its zeros and -inf where it has rows; its walk issues the next item's copies) then
    the first sequence, block 1 the second then the last; "packed", as heuristics.whole_runs
    packs them (longest first: the empty sequence walked after a tiled one, so the item
    before it issues no early copy, and the one after it does); "some whole", with
    heuristics.MIXED_RUNS: the first sequence cut, the second and last whole, each written
    out by its item (its partition 0's LSE combine.WRITTEN, which the merge skips), the empty
    one merged as an empty row. In the simulator, ``order`` "low"
    runs the lower warps ahead (thread 0 reaches the next item's copies while warpgroup 1
    may still multiply: a copy issued before the barrier that keeps it from doing so fails
    here). Checked three ways against the references, out pre-filled with NaN; on a GPU a
    second run gives the same bits."""
    from numba_mla import _numba, selector
    from numba_mla.kernels import seesaw

    if order != "fifo" and not _compat.SIMULATOR:
        pytest.skip("a turn order of the simulator's")

    monkeypatch.setattr(seesaw, "RUNS_AHEAD", form == "ahead")
    monkeypatch.setattr(seesaw, "RUNS_Q_EARLY", form == "q_early")

    tile = mma.BLOCK_N
    lengths = [2 * tile + 9, tile, 0, 2 * tile - 5]
    whole = blocks in ("whole", "packed")
    mixed = blocks == "some whole"
    runs = RUNS_OF_TEST[blocks]
    groups = 2 if layout == "ragged" else 1
    table = heuristics.runs_table(runs, groups)
    monkeypatch.setattr(selector, "SEESAW_RUNS", True)
    monkeypatch.setattr(heuristics, "MIXED_RUNS", mixed)
    monkeypatch.setattr(heuristics, "run_schedule", lambda *args, **kwargs: table)
    with _numba.sim_turn_order(order):
        plans = run_forced_schedule(rng, monkeypatch, layout, lengths)
    spec = plans[0].spec
    assert spec.backend == "seesaw" and spec.work is table and spec.runs == len(runs) * groups
    assert spec.grid(4) == (len(runs) * groups, 1, 1)
    assert (spec.num_partitions, spec.direct) == ((1, True) if whole else (2, False))
    assert spec.mixed == mixed


@pytest.mark.kernel
@pytest.mark.parametrize("order", ["fifo", "low"])
def test_runs_schedule_score_flags(order, rng, monkeypatch):
    """``test_runs_schedule``'s forced table at 64 heads, whole items written out beside cut
    ones, with the seesaw's four per-tile cuts on (``seesaw.WHOLE_TILES``, ``EXP_FOLD``,
    ``PACK_P``, ``ROWS_LEAD``; for 16-bit rows only ``PACK_P`` by default): the whole tiles'
    scores without bounds, the scale in the exponent and P packed once, from item to item
    (each item's running maxima, factors and packed words start afresh). The table's items are a pair of tiles at most,
    so no refill row is looked up here (``test_seesaw_forms[...-rows_lead]`` has them); the
    build that ran must carry all four."""
    from numba_mla.kernels import seesaw

    for flag in ("WHOLE_TILES", "EXP_FOLD", "PACK_P", "ROWS_LEAD"):
        monkeypatch.setattr(seesaw, flag, True)
    spy_factory(monkeypatch, "seesaw_partition_kernel", lambda args, kwargs: None)
    test_runs_schedule("padded64", "q_early", order, "some whole", rng, monkeypatch)
    built = [(d.whole_tiles, d.exp_fold, d.pack_p, d.rows_lead)
             for d in spy_factory.kernels["seesaw_partition_kernel"]]
    assert built and set(built) == {(True, True, True, True)}


@pytest.mark.kernel
@pytest.mark.parametrize("order", ["fifo", "low"])
def test_runs_schedule_max_early1(order, rng, monkeypatch):
    """``test_runs_schedule``'s forced table at 64 heads, whole items written out beside cut
    ones, with warpgroup 1's tile maxima stored before SCALE0 (``seesaw.MAX_EARLY1``: into
    its row-sum row of ``stat``, which each item's end writes and reads before the next
    item's tiles)."""
    from numba_mla.kernels import seesaw

    monkeypatch.setattr(seesaw, "MAX_EARLY1", True)
    test_runs_schedule("padded64", "q_early", order, "some whole", rng, monkeypatch)


@pytest.mark.kernel
def test_mixed_runs_rebind_both_outs(rng, monkeypatch):
    """A kept plan of the mixed runs (RUNS_OF_TEST["some whole"], heuristics.MIXED_RUNS) run
    again into another device out and lse: both kernels that write them (the runs kernel, for
    the whole sequences, and the merge, for the cut one) are re-pointed (launch.Plan.rebind),
    so the second out holds every row, the same bits as the first."""
    from numba import cuda

    from numba_mla import plans, selector

    def to_device(x):
        x = np.ascontiguousarray(x)
        return (cuda.to_device(x.view(np.int16)).view(x.dtype) if x.dtype.itemsize == 2
                else cuda.to_device(x))

    tile = mma.BLOCK_N
    p = make_problem(rng, 4, 1, 2, [2 * tile + 9, tile, 0, 2 * tile - 5], DTYPES["bf16"],
                     "paged", tile)
    table = heuristics.runs_table(RUNS_OF_TEST["some whole"], 1)
    monkeypatch.setattr(selector, "SEESAW_RUNS", True)
    monkeypatch.setattr(heuristics, "MIXED_RUNS", True)
    monkeypatch.setattr(heuristics, "run_schedule", lambda *args, **kwargs: table)
    plans.clear()
    c = p.cache
    cache = nm.PagedKVCache(to_device(c.storage), to_device(c.block_table_host),
                            to_device(c.lengths_host))
    q = to_device(p.q)
    outs = [to_device(np.full(p.out_shape, np.nan, p.dtype)) for _ in range(2)]
    lses = [nm.mla_decode(q, cache, p.scale, out=out, return_lse=True, backend="mma")[1]
            for out in outs]
    assert plans.size() == 1  # (the second call ran the first call's plan)
    got = [o.copy_to_host() for o in outs]
    golden, same = references(p, nm.NullMask())
    assert_three_way(got[1], same[0], golden[0], floor=fp32_floor(golden[0], "mma"), what="out")
    np.testing.assert_array_equal(got[0].view(np.uint8), got[1].view(np.uint8))
    lse = [np.asarray(x.copy_to_host() if hasattr(x, "copy_to_host") else x) for x in lses]
    assert_three_way(lse[1], same[1], golden[1], floor=fp32_floor(golden[1], "mma"), what="lse")
    np.testing.assert_array_equal(lse[0], lse[1])


@pytest.mark.kernel
@pytest.mark.parametrize("blocks", ["some whole", "packed", "mixed"])
def test_trial_args_are_the_launch_args(blocks, rng, monkeypatch):
    """On a GPU the selector compiles a candidate kernel to see whether it spills
    (launch.Plan._trial_args): with the arguments the launch then passes, in count, dtype and
    dimensions, for the runs forms that write the workspace (the cut runs), out itself (the
    whole runs: ``direct``) and both (the mixed runs: out and lse after the workspace; a
    candidate compiled without them failed on the GPU only, since the simulator compiles
    nothing). Here the plans made for test_runs_schedule's forced tables are asked for theirs."""
    from numba_mla import launch, selector

    monkeypatch.setattr(selector, "SEESAW_RUNS", True)
    monkeypatch.setattr(heuristics, "MIXED_RUNS", blocks == "some whole")
    table = heuristics.runs_table(RUNS_OF_TEST[blocks], 1)
    monkeypatch.setattr(heuristics, "run_schedule", lambda *args, **kwargs: table)
    tile = mma.BLOCK_N
    plans = run_forced_schedule(rng, monkeypatch, "padded", [2 * tile + 9, tile, 0, 2 * tile - 5])
    plan = plans[0]
    (partition,) = [la for la in plan.launches if la.dispatcher is plan.spec.dispatcher]
    inputs = dict(zip(launch.INPUT_ROLES, partition.args))
    trial = plan._trial_args(plan.spec, inputs, inputs["storage"], plan._rows // plan.call.heads)
    assert launch._kinds(trial) == launch._kinds(partition.args)
    assert plan.spec.mixed == (blocks == "some whole")


@pytest.mark.kernel
@pytest.mark.parametrize("form", ["grid", "runs"])
def test_seesaw_follows(form, rng, monkeypatch):
    """seesaw.FOLLOWS (on by default): the seesaw kernel built to wait for the grid before it
    in the stream (``griddepcontrol.wait`` first; a no-op in the simulator) and its launch made
    that grid's programmatic dependent. Its grid form (the selector's schedule) and its runs
    form over test_runs_schedule's "mixed" table match the references with the seesaw kernel's
    launch following; with the flag off the same plan's does not."""
    from numba_mla import selector
    from numba_mla.kernels import seesaw

    def partition_launch(plan):
        (partition,) = [la for la in plan.launches if la.dispatcher is plan.spec.dispatcher]
        return partition

    tile = mma.BLOCK_N
    lengths = [2 * tile + 9, tile, 0, 2 * tile - 5]
    if form == "runs":
        monkeypatch.setattr(selector, "SEESAW_RUNS", True)
        monkeypatch.setattr(heuristics, "MIXED_RUNS", False)
        table = heuristics.runs_table(RUNS_OF_TEST["mixed"], 1)
        monkeypatch.setattr(heuristics, "run_schedule", lambda *args, **kwargs: table)
    else:
        monkeypatch.setattr(selector, "SEESAW_RUNS", False)
    for on in (False, True):
        monkeypatch.setattr(seesaw, "FOLLOWS", on)
        plans = run_forced_schedule(rng, monkeypatch, "padded", lengths)
        plan = plans[0]
        assert plan.spec.backend == "seesaw"
        assert bool(plan.spec.runs) == (form == "runs")
        assert partition_launch(plan).follows is on
        assert getattr(plan.spec.dispatcher, "follows", False) is on


def test_runs_table_of_whole_runs():
    """RUNS_OF_TEST["packed"] is what heuristics.whole_runs makes of those sequences (3, 1, 0
    and 2 tiles) in two runs, for one row group and for two side by side."""
    tiles = np.array([3, 1, 0, 2])
    for groups in (1, 2):
        np.testing.assert_array_equal(heuristics.whole_runs(tiles, groups, sms=2 * groups),
                                      heuristics.runs_table(RUNS_OF_TEST["packed"], groups))


@pytest.mark.kernel
@pytest.mark.parametrize("taken,blocks", [(True, "mixed"), (True, "packed"), (False, "mixed")])
def test_runs_schedule_by_the_model(taken, blocks, rng, monkeypatch):
    """With ``selector.SEESAW_RUNS`` at its default (None) the runs form runs where the cost
    model takes it (``heuristics.runs_split`` returns its table; forced here, over the
    sequences of ``test_runs_schedule``'s "mixed" blocks, or its "packed" ones, as
    heuristics.whole_runs gives them: then the items write out themselves, no merge) and the
    grid kernel where it does not; the plan's schedule key (api._schedule) says which, so a
    plan made for one is not reused for the other. The model is given the other schedules'
    choice to weigh against."""
    from numba_mla import api, selector

    assert selector.SEESAW_RUNS is None
    tile = mma.BLOCK_N
    lengths = [2 * tile + 9, tile, 0, 2 * tile - 5]
    table = heuristics.runs_table(RUNS_OF_TEST[blocks], 1)
    asked = []

    def runs_split(keys, block_n, groups, sms=None, rows=None, balanced=None, pieces=None):
        asked.append((list(keys), block_n, groups, sms, rows, tuple(balanced),
                      None if pieces is None else list(pieces)))
        return table if taken else None

    monkeypatch.setattr(heuristics, "runs_split", runs_split)
    plans = run_forced_schedule(rng, monkeypatch, "padded", lengths)
    spec = plans[0].spec
    # (once a call: run_forced_schedule calls twice on a GPU)
    n = len(asked)
    assert n == (1 if _compat.SIMULATOR else 2)
    assert asked[0][0] == lengths and all(a == asked[0] for a in asked)
    if taken:
        assert spec.backend == "seesaw" and spec.work is table
        assert spec.runs == len(RUNS_OF_TEST[blocks])
        assert (spec.num_partitions, spec.direct) == ((1, True) if blocks == "packed"
                                                      else (2, False))
    else:
        assert spec.runs == 0 and spec.work is None
    # the plan's key, from the plan's geometry, asks the model the same question
    key = api._schedule(lengths, spec.block_n, spec.groups, spec.rows, spec.slots, True)
    assert len(asked) == n + 1 and asked[-1] == asked[0]
    assert (key[0] == "runs") == taken
