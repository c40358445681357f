"""The balanced split-K schedule (heuristics.balanced_split, kernels/common.partition_tiles).

Every partition of a launch walks the same number of key tiles (a chunk), so a sequence of n
tiles uses the first ceil(n / chunk) partitions and the rest find theirs empty (they write
LSE -inf and leave; the combine reads only partitions that kept a key).

- host properties (pure Python): the device function and its host form agree; every tile of
  every sequence is walked exactly once; sequences longer than a chunk are cut, empty ones use
  no partition; equal lengths get the split ``num_partitions`` gives; B = 1 with L = 65536;
  one sequence longer than all the others together; masks whose key range skips tiles; the
  plan key's signature;
- kernels in the simulator (``simt``, ``mma``, ``simple``): spread lengths with an empty
  sequence under a device size that makes the chunk differ from the even split, against the
  float64 reference three ways, and the partitions with keys exactly those the schedule gives
  tiles; bit-identical results whatever plans were kept before; lengths raised in device
  memory after the chunk was chosen still have every key walked;
- GPU (``-m gpu``): the varlen bench shapes' schedule against the reference.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numba_mla as nm
from helpers import BF16, assert_three_way, fp32_floor, make_problem, references
from numba_mla import heuristics, plans
from numba_mla.kernels import common, simple

H200_SMS = 132


def walked(tiles, P, chunk):
    """Per sequence, the list of (partition, t0, t1) runs with tiles."""
    runs = []
    for n in tiles:
        mine = [(p,) + heuristics.partition_range(int(n), p, P, chunk) for p in range(P)]
        runs.append([r for r in mine if r[2] > r[1]])
    return runs


def assert_exact_cover(tiles, P, chunk):
    """Every tile of every sequence in exactly one partition, runs in partition order."""
    for n, runs in zip(tiles, walked(tiles, P, chunk)):
        covered = [t for _, t0, t1 in runs for t in range(t0, t1)]
        assert covered == list(range(int(n))), (n, P, chunk, runs)


# ---------------------------------------------------------------------------------------------
# Host properties
# ---------------------------------------------------------------------------------------------
@pytest.mark.simulator
def test_device_function_matches_host_form():
    """common.partition_tiles (run as Python by the simulator) gives the host form's runs,
    and those cover every tile once: chunks, the even split (chunk 0), and chunks too small
    for the grid (lengths grown on the device after the chunk was chosen)."""
    for ntiles in (0, 1, 2, 5, 17, 64):
        for P in (1, 2, 3, 7, 16):
            for chunk in (0, 1, 2, 3, 5, 40):
                for p in range(P):
                    assert (tuple(common.partition_tiles(ntiles, p, P, chunk))
                            == heuristics.partition_range(ntiles, p, P, chunk))
                assert_exact_cover([ntiles], P, chunk)


@pytest.mark.parametrize("keys,groups,sms", [
    ([3000, 40, 0, 1300, 64, 65], 1, 16),          # spread, an empty sequence, a tile edge
    ([0, 0, 0], 2, 132),                           # nothing at all
    ([65536], 2, H200_SMS),                        # B = 1, L = 65536
    ([60000] + [500] * 40, 2, H200_SMS),           # one longer than the rest together
    (list(range(2048, 6145, 64)), 2, H200_SMS),    # 64 x [L/2, 3L/2], L = 4096
    ([1] * 300, 1, H200_SMS),                      # one tile each
], ids=["spread", "all-empty", "B1-65536", "one-long", "uniform-spread", "one-tile"])
def test_schedule_covers_every_key_once(keys, groups, sms):
    """The chosen (chunk, P): every tile of every sequence walked once; a sequence uses
    ceil(tiles / chunk) partitions (cut where it has more tiles than a chunk, none when it
    has no key); no more than max_parts partitions; one partition only when no sequence has
    more than one chunk's worth."""
    block_n = 64
    chunk, P = heuristics.balanced_split(keys, block_n, groups, sms)
    tiles = -(-np.asarray(keys) // block_n)
    assert 1 <= P <= 256
    assert_exact_cover(tiles, P, chunk)
    if P > 1:
        assert chunk >= 1 and P == -(-int(tiles.max()) // chunk)
        for n, runs in zip(tiles, walked(tiles, P, chunk)):
            assert [p for p, _, _ in runs] == list(range(-(-int(n) // chunk)))
            assert all(t1 - t0 <= chunk for _, t0, t1 in runs)


def test_schedule_examples():
    """Equal lengths: the split num_partitions chooses (its cost model, same inputs). B = 1,
    L = 65536 on 132 multiprocessors: 64 partitions of 16 tiles (128 blocks, one wave).
    One sequence longer than all the others together: it is cut in many partitions and the
    short ones take one each. Spread lengths: more partitions than the longest alone asks for,
    each short sequence fewer than P."""
    for B, G, L in [(64, 1, 4096), (64, 2, 4096), (128, 2, 1024), (16, 2, 32768), (1, 2, 65536),
                    (3, 1, 5000), (200, 1, 1000)]:
        chunk, P = heuristics.balanced_split([L] * B, 64, G, H200_SMS)
        assert P == heuristics.num_partitions(B, G, L, 64, H200_SMS), (B, G, L)
    assert heuristics.balanced_split([65536], 64, 2, H200_SMS) == (16, 64)

    keys = [60000] + [500] * 40
    chunk, P = heuristics.balanced_split(keys, 64, 2, H200_SMS)
    assert P >= 8 and chunk >= 8  # the long one cut; each short one (8 tiles) in one chunk
    tiles = -(-np.asarray(keys) // 64)
    runs = walked(tiles, P, chunk)
    assert len(runs[0]) == P and all(len(r) == 1 for r in runs[1:])

    keys = list(range(2048, 6145, 64))  # 65 sequences in [L/2, 3L/2], 16 query rows each
    chunk, P = heuristics.balanced_split(keys, 64, 1, H200_SMS, rows=16)
    assert P > heuristics.num_partitions(len(keys), 1, max(keys), 64, H200_SMS, rows=16)
    assert len(walked([2048 // 64], P, chunk)[0]) < P
    # 128 query rows (two full row groups) a sequence: a split block's partial output costs
    # four times as much, and one partition wins (measured on the H200 at a2e8613, 64 x 128
    # heads at spread 0.5: 243 us in four partitions, ~220 us expected in one)
    assert heuristics.balanced_split(keys, 64, 2, H200_SMS, rows=128)[1] == 1


def test_masks_count_kept_keys():
    """Key counts come from each sequence's key range under the mask (the tiles the kernels
    walk): a window of 256 counts 256 keys a sequence, so the window over long sequences is
    scheduled as short ones; a causal mask with several queries counts up to the last one's
    position; the vectorised count of an unbounded mask equals the per-sequence loop's; a
    shard (position map) counts its own keys."""
    lengths, counts = np.array([65536, 100, 0, 7000]), np.array([1, 1, 0, 4])
    window = heuristics.key_counts(nm.SlidingWindowCausalMask(256), lengths, counts)
    assert window.tolist() == [256, 100, 0, 259]
    assert heuristics.key_counts(nm.CausalMask(), lengths, counts).tolist() == [65536, 100, 0,
                                                                                7000]
    null = heuristics.key_counts(nm.NullMask(), lengths, counts)
    anded = heuristics.key_counts(nm.NullMask() & nm.NullMask(), lengths, counts)  # a loop
    assert null.tolist() == anded.tolist() == [65536, 100, 0, 7000]
    # A shard of every 4th key (decode context parallelism): its local keys are counted.
    from numba_mla.positions import PositionMap

    shard = PositionMap.interleaved(1, 4)
    assert heuristics.key_counts(nm.NullMask(), lengths, counts, shard).tolist() == [
        16384, 25, 0, 1750]
    assert heuristics.key_counts(nm.SlidingWindowCausalMask(256), lengths, counts,
                                 shard).tolist() == [64, 25, 0, 65]
    chunk, P = heuristics.balanced_split(window, 64, 2, H200_SMS)
    assert P == heuristics.balanced_split([256, 100, 0, 259], 64, 2, H200_SMS)[1]
    assert P < heuristics.balanced_split([65536, 100, 0, 7000], 64, 2, H200_SMS)[1]


# ---------------------------------------------------------------------------------------------
# Kernels (simulator)
# ---------------------------------------------------------------------------------------------
CASES = [  # backend, dtype, lengths, simulated multiprocessors, (chunk, P) expected
    ("simt", np.float32, [140, 20, 0, 90], 4, (3, 2)),   # 32-key tiles: 5 | 1 | 0 | 3
    ("mma", BF16, [300, 40, 0, 130], 8, (2, 3)),         # 64-key tiles: 5 | 1 | 0 | 3
    ("simple", np.float32, [60, 13, 0, 30], 4, (4, 2)),  # 8-key tiles: 8 | 2 | 0 | 4
    # 13 | 2 | 0 | 5 tiles in 13 partitions: two combine steps, the second empty for two rows
    ("simple", np.float32, [100, 9, 0, 40], 48, (1, 13)),
]


@pytest.mark.kernel
@pytest.mark.parametrize("backend,dtype,lengths,sms,want", CASES,
                         ids=["simt-chunk3", "mma-chunk2", "simple-chunk4", "simple-chunk1"])
def test_balanced_schedule_kernels(backend, dtype, lengths, sms, want, rng, monkeypatch):
    """Spread lengths (one sequence empty) under a device whose size makes the chunk differ
    from the even split of the longest sequence (a sequence of 3 tiles walks [0, 3) and leaves
    its second partition empty, not [0, 2) and [2, 3)): out and lse against the reference
    three ways, out pre-filled with NaN (every row written), NaN in every unused cache slot."""
    from numba_mla import checks, launch

    monkeypatch.setattr(heuristics, "sm_count", lambda: sms)  # (on a GPU too)
    p = make_problem(rng, len(lengths), 1, 2, lengths, dtype, "paged", 16)
    out = np.full(p.out_shape, np.nan, p.dtype)
    call = checks.check_decode(p.q, p.cache, p.scale, None, None, None, True, out, backend)
    plan = launch.Plan(call)
    chunk, P = want
    assert (plan.spec.chunk, plan.num_partitions) == want
    plan.launch()
    got, lse = plan.result()
    assert got is out
    golden, same = references(p)
    assert_three_way(out, same[0], golden[0], floor=fp32_floor(golden[0], backend), what="out")
    assert_three_way(lse, same[1], golden[1], floor=fp32_floor(golden[1], backend), what="lse")
    # The partitions that kept a key are the ones the schedule gives tiles, no other.
    part_lse = plan.launches[1].args[1].copy_to_host()  # the combine's [T, H, P] input
    for b, length in enumerate(lengths):
        tiles = -(-length // plan.spec.block_n)
        for p_ in range(P):
            t0, t1 = heuristics.partition_range(tiles, p_, P, chunk)
            assert np.isfinite(part_lse[b, :, p_]).all() == (t1 > t0), (b, p_)
            assert np.isneginf(part_lse[b, :, p_]).all() == (t1 == t0), (b, p_)


@pytest.mark.kernel
def test_same_inputs_same_bits(rng, monkeypatch):
    """Determinism: the same call twice gives bit-identical results, and a call gives the same
    bits whether or not a plan was kept for other lengths of the same longest sequence (whose
    schedule differs: a plan key of the longest alone would have run this call on it)."""
    from numba import cuda

    monkeypatch.setattr(heuristics, "sm_count", lambda: 4)  # (on a GPU too)
    first_lengths, lengths = [64, 60, 9], [64, 20, 9]
    assert (heuristics.balanced_split(first_lengths, simple.BLOCK_N, 1, rows=1)
            != heuristics.balanced_split(lengths, simple.BLOCK_N, 1, rows=1))  # (H = Sq = 1)
    plans.clear()
    p = make_problem(rng, 3, 1, 1, first_lengths, np.float32, "contiguous")
    q = cuda.to_device(p.q)
    storage = cuda.to_device(p.cache.storage)

    def call(lengths):
        cache = nm.ContiguousKVCache(storage, cuda.to_device(np.array(lengths, np.int32)))
        return nm.mla_decode(q, cache, p.scale, backend="simple").copy_to_host()

    call(first_lengths)
    after = call(lengths)
    again = call(lengths)
    assert plans.size() == 2
    np.testing.assert_array_equal(after, again)
    plans.clear()
    np.testing.assert_array_equal(after, call(lengths))


@pytest.mark.kernel
def test_lengths_grown_on_the_device_are_covered(rng, monkeypatch):
    """The chunk is chosen from the lengths the cache was checked with; a decode loop may raise
    them in device memory afterwards. A sequence that then holds more than P x chunk tiles is
    split evenly over the P partitions instead (partition_tiles), so no key is left out."""
    from numba import cuda

    monkeypatch.setattr(heuristics, "sm_count", lambda: 4)  # (on a GPU too)
    checked, real = [64, 20, 9], [64, 90, 9]  # 8 | 3 | 2 tiles of 8 keys, then 8 | 12 | 2
    chunk, P = heuristics.balanced_split(checked, simple.BLOCK_N, 1, rows=1)  # (H = Sq = 1)
    assert (chunk, P) == (4, 2) and -(-90 // simple.BLOCK_N) > chunk * P
    p = make_problem(rng, 3, 1, 1, real, np.float32, "contiguous")
    lengths = cuda.to_device(np.array(checked, np.int32))
    cache = nm.ContiguousKVCache(cuda.to_device(p.cache.storage), lengths)
    lengths.copy_to_device(np.array(real, np.int32))
    out, lse = nm.mla_decode(cuda.to_device(p.q), cache, p.scale, backend="simple",
                             return_lse=True)
    golden, same = references(p)
    assert_three_way(out.copy_to_host(), same[0], golden[0], floor=fp32_floor(golden[0], "simple"),
                     what="out")
    assert_three_way(lse.copy_to_host(), same[1], golden[1],
                     floor=fp32_floor(golden[1], "simple"), what="lse")


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("B,H,L", [(64, 16, 4096), (64, 128, 4096), (16, 128, 8192)])
@pytest.mark.parametrize("backend", ["simt", "mma"])
def test_varlen_shapes_on_gpu(B, H, L, backend, rng):
    """The varlen bench's shapes, lengths uniform in [L/2, 3L/2] with an empty sequence, under
    the device's own schedule: against the reference three ways, and bit-identical twice."""
    lengths = rng.integers(L // 2, 3 * L // 2 + 1, B)
    lengths[B // 2] = 0
    p = make_problem(rng, B, 1, H, lengths, BF16, "paged", 64)
    golden, same = references(p)
    out, lse = p.run(nm, return_lse=True, backend=backend)
    assert_three_way(out, same[0], golden[0], floor=fp32_floor(golden[0], backend), what="out")
    assert_three_way(lse, same[1], golden[1], floor=fp32_floor(golden[1], backend), what="lse")
    again, _ = p.run(nm, return_lse=True, backend=backend)
    np.testing.assert_array_equal(again, out)


@settings(max_examples=400, deadline=None)
@given(keys=st.lists(st.integers(0, 128 * 64), min_size=1, max_size=heuristics.SMALL_BATCH),
       block_n=st.sampled_from([8, 16, 32, 64]), groups=st.integers(0, 9),
       sms=st.sampled_from([1, 16, 108, 132, 264]), max_parts=st.sampled_from([1, 7, 256]),
       rows=st.one_of(st.none(), st.integers(1, 1024)))
def test_small_batches_schedule_as_the_vectorised_form(keys, block_n, groups, sms, max_parts,
                                                       rows):
    """A few short sequences take balanced_split's plain-Python form; it gives the NumPy
    form's schedule exactly (the same candidates, order and floating-point operations)."""
    small = heuristics.balanced_split(keys, block_n, groups, sms, max_parts, rows)
    assert small == heuristics._balanced_split_small(keys, block_n, groups, sms, max_parts,
                                                     rows)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(heuristics, "SMALL_BATCH", 0)  # every batch through NumPy
        assert heuristics.balanced_split(np.array(keys), block_n, groups, sms, max_parts,
                                         rows) == small


# ---------------------------------------------------------------------------------------------
# The listed schedule (heuristics.listed_split, list_blocks; the kernel: test_split_paths.py)
# ---------------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.integers(0, 200 * 64), min_size=1, max_size=300),
       groups=st.integers(1, 3), sms=st.sampled_from([16, 132]),
       rows=st.one_of(st.none(), st.integers(1, 192)))
def test_listed_schedule_properties(keys, groups, sms, rows):
    """Whatever the lengths: None for one sequence or equal lengths; else at least two
    pieces for some sequence
    (one partition would be the balanced schedule's direct kernel), at most
    LISTED_MAX_PIECES; its blocks every (sequence, row group, piece < P) once, launched in
    non-increasing modelled cost; the pieces of each sequence cover its tiles exactly once
    (partition_tiles with chunk 0); the same schedule twice."""
    block_n = 64
    pieces = heuristics.listed_split(keys, block_n, groups, sms=sms, rows=rows)
    tiles = -(-np.asarray(keys) // block_n)
    if len(keys) < 2 or tiles.min() == tiles.max():
        assert pieces is None
    if pieces is None:
        return
    again = heuristics.listed_split(keys, block_n, groups, sms=sms, rows=rows)
    np.testing.assert_array_equal(pieces, again)
    P = int(pieces.max())
    assert pieces.shape == (len(keys),) and pieces.min() >= 1
    assert 2 <= P <= heuristics.LISTED_MAX_PIECES
    work = heuristics.list_blocks(pieces, tiles, groups)
    assert work.dtype == np.int32 and work.shape == (len(keys) * groups * P, 4)
    assert sorted(map(tuple, work[:, :3].tolist())) == [
        (b, g, p) for b in range(len(keys)) for g in range(groups) for p in range(P)]
    np.testing.assert_array_equal(work[:, 3], pieces[work[:, 0]])
    cost = np.where(work[:, 2] < work[:, 3],
                    -(-tiles[work[:, 0]] // work[:, 3]) + heuristics.BLOCK_OVERHEAD_TILES,
                    heuristics.EMPTY_BLOCK_TILES)
    assert np.all(np.diff(cost) <= 0)
    for n, k in zip(tiles.tolist(), pieces.tolist()):
        assert_exact_cover([n], k, 0)


def varlen_listed(B, H, L, spread):
    """The listed schedule's pieces (or None) for the varlen bench's draw of that shape
    (bench.problems.draw_lengths, seed 0) on the H200's 132 multiprocessors."""
    from numba_mla.bench import Config, problems

    lengths = problems.draw_lengths(Config(B, H, L, spread=spread, sweep="varlen"), 0)
    return heuristics.listed_split(lengths, 64, -(-H // 64), H200_SMS, rows=H)


def test_listed_cuts_of_varlen_draws():
    """The blocks the listed schedule launches for the varlen bench's draws (the cuts the
    H100 and H200 runs timed): 16 x 128 x 32768 at spread 0.25 and 0.5 in two waves of 262
    blocks (a one-wave cut of 132 ties in the model; charging the second wave 1-2 tile-times
    to take it measured 1.01-1.05x slower: docs/performance.md), 64 x 16 x 4096 at 0.5 in 255,
    128 x 16 x 8192 in 263 and 64 x 128 x 4096 at 0.5 in 254."""
    def blocks(B, H, L, spread):
        pieces = varlen_listed(B, H, L, spread)
        return None if pieces is None else -(-H // 64) * int(pieces.sum())

    shapes = [(16, 128, 32768, 0.25), (16, 128, 32768, 0.5), (64, 16, 4096, 0.5),
              (128, 16, 8192, 0.25), (128, 16, 8192, 0.5), (64, 128, 4096, 0.5)]
    assert [blocks(*c) for c in shapes] == [262, 262, 255, 263, 263, 254]


@pytest.mark.parametrize("mixed", [True, False])
def test_runs_split_of_varlen_draws(monkeypatch, mixed):
    """Where the model takes the runs schedule by itself (``heuristics.runs_split``: at most
    half a (sequence, row group) pair a multiprocessor, one with ``MIXED_RUNS``, and a
    modelled gain, or whole sequences packed past one pair a multiprocessor): of the varlen
    bench's 18 draws on 132 multiprocessors, 64 x 16 x 4096 at spread 0.5 and 16 x 128 x
    32768 at 0.25 and 0.5, the three that measured faster under it on an H100 (0.95-0.98x
    the time of the schedule they replace), and 128 x 128 x 1024 at 0.25 and 0.5 in whole
    sequences (256 pairs: one partition, out written by the items), at equal lengths too
    (``WHOLE_EQUAL``: 0.98x on an H100); not 64 x 16 x 4096 at 0.25 (1.03x cut), nor the
    other equal lengths (cut: 1.02x at 16 x 128 x 32768). 64 x 128 x 4096 at 0.5
    only in the mixed runs (``MIXED_RUNS``, the default: 0.954x the listed schedule's time on
    an H100), not cut (1.05x)."""
    from numba_mla.bench import configs, problems

    monkeypatch.setattr(heuristics, "MIXED_RUNS", mixed)
    taken = []
    for cfg in configs.varlen_sweep():
        lengths = problems.draw_lengths(cfg, 0)
        groups = -(-cfg.heads // 64)
        split = heuristics.balanced_split(lengths, 64, groups, sms=H200_SMS, rows=cfg.heads)
        pieces = heuristics.listed_split(lengths, 64, groups, H200_SMS, rows=cfg.heads,
                                         balanced=split)
        table = heuristics.runs_split(lengths, 64, groups, sms=H200_SMS, rows=cfg.heads,
                                      balanced=split, pieces=pieces)
        if table is not None:
            taken.append((cfg.batch, cfg.heads, cfg.seqlen, cfg.spread,
                          heuristics.runs_partitions(table)))
            assert int(table[0, 0]) <= H200_SMS  # (one wave)
    assert taken == [(64, 128, 4096, 0.5, 2)] * mixed + [
        (64, 16, 4096, 0.5, 4), (128, 128, 1024, 0.0, 1), (128, 128, 1024, 0.25, 1),
        (128, 128, 1024, 0.5, 1),
        (16, 128, 32768, 0.25, 6), (16, 128, 32768, 0.5, 7)]


def test_listed_blocks_groups_side_by_side(monkeypatch):
    """With ``LISTED_GROUPS_SIDE_BY_SIDE`` the blocks of equal cost come piece by piece, each
    piece's row groups one after the other (the two blocks that read the same tiles start
    together), still largest first; without it, each row group's pieces in turn."""
    pieces, tiles = np.array([3, 2, 3]), np.array([30, 20, 31])  # costs 15, 15, 16 a block
    monkeypatch.setattr(heuristics, "LISTED_GROUPS_SIDE_BY_SIDE", True)
    work = heuristics.list_blocks(pieces, tiles, 2).tolist()
    assert [tuple(r[:3]) for r in work] == (
        [(2, g, p) for p in range(3) for g in range(2)]
        + [(b, g, p) for b in (0, 1) for p in range(pieces[b]) for g in range(2)]
        + [(1, g, 2) for g in range(2)])  # (sequence 1's empty third piece, last)
    monkeypatch.setattr(heuristics, "LISTED_GROUPS_SIDE_BY_SIDE", False)
    work = heuristics.list_blocks(pieces, tiles, 2).tolist()
    assert [tuple(r[:3]) for r in work[:6]] == [(2, g, p) for g in range(2) for p in range(3)]


def test_listed_schedule_examples():
    """The varlen bench's draws (bench.problems.draw_lengths, seed 0) that the H200 measured
    faster under the listed schedule take it on its 132 multiprocessors: 128 x 16 x 8192 at
    spread 0.25 and 0.5, 64 x 16 x 4096 at 0.5 (0.91-0.97 of the balanced schedule's time),
    16 x 128 x 32768 at 0.5 (its balanced grid hands out long pieces side by side) and
    64 x 128 x 4096 at 0.5 (one partition balanced; the model's cut, a target of 42 tiles
    and at most 3 pieces, measured 0.857x its time); 64 x 128 x 4096 at 0.25 does not
    (forced cuts measured 0.98-1.06x), nor do equal lengths, B = 1, or a mask that keeps the
    same 256 keys of every sequence (the kept tiles are the work)."""
    for B, H, L, spread in [(128, 16, 8192, 0.25), (128, 16, 8192, 0.5), (64, 16, 4096, 0.5),
                            (16, 128, 32768, 0.5), (64, 128, 4096, 0.5)]:
        assert varlen_listed(B, H, L, spread) is not None, (B, H, L, spread)
    for B, H, L, spread in [(64, 128, 4096, 0.25), (128, 16, 8192, 0.0), (64, 16, 4096, 0.0)]:
        assert varlen_listed(B, H, L, spread) is None, (B, H, L, spread)
    assert heuristics.listed_split([65536], 64, 2, H200_SMS, rows=128) is None
    window = nm.SlidingWindowCausalMask(256)
    lengths = np.random.default_rng(0).integers(2048, 6145, 64)
    keys = heuristics.key_counts(window, lengths, np.ones(64, np.int64))
    assert heuristics.listed_split(keys, 64, 1, H200_SMS, rows=16) is None


@settings(max_examples=200, deadline=None)
@given(tiles=st.lists(st.integers(1, 800), min_size=2, max_size=200),
       groups=st.integers(1, 3), sms=st.sampled_from([16, 132]))
def test_wave_targets_are_the_smallest_that_fit(tiles, groups, sms):
    """Each target _wave_targets returns for w waves is the smallest in [lo, hi] whose blocks
    (groups x sum ceil(tiles / T)) fit in w x sms, and it returns one for every w where hi's
    blocks fit."""
    tiles = np.asarray(tiles, np.int64)
    lo, hi = -(-int(tiles.max()) // heuristics.LISTED_MAX_PIECES), int(tiles.max())

    def blocks(T):
        return groups * int((-(-tiles // T)).sum())

    found = heuristics._wave_targets(tiles, groups, sms, lo, hi).tolist()
    fits = [w for w in range(1, heuristics.LISTED_WAVES + 1) if blocks(hi) <= w * sms]
    assert len(found) == len(fits)
    for T, w in zip(found, fits):
        assert lo <= T <= hi and blocks(T) <= w * sms
        assert T == lo or blocks(T - 1) > w * sms


def test_listed_schedule_fills_waves():
    """128 x 16 x 8192 at spread 0.5 (the varlen bench's draw): the listed schedule cuts at
    the target that fills two waves of the H200's 132 multiprocessors (83 tiles, 263 blocks),
    which the targets ceil(longest / k) miss (the nearest, 96 and 64 tiles, give 226 blocks
    with longer pieces and 324 blocks in three waves)."""
    from numba_mla.bench import Config, problems

    lengths = problems.draw_lengths(Config(128, 16, 8192, spread=0.5, sweep="varlen"), 0)
    tiles = -(-np.asarray(lengths) // 64)
    pieces = heuristics.listed_split(lengths, 64, 1, H200_SMS, rows=16)
    np.testing.assert_array_equal(pieces, np.maximum(1, -(-tiles // 83)))
    assert int(pieces.sum()) <= 2 * H200_SMS < int(np.maximum(1, -(-tiles // 82)).sum())


# ---------------------------------------------------------------------------------------------
# The runs schedule (heuristics.run_schedule; the kernel: test_split_paths.py)
# ---------------------------------------------------------------------------------------------
def runs_of(table):
    """The blocks of a runs table: a list of their item rows ``(b, g, slot, t0, t1)``."""
    n = int(table[0, 0])
    return [table[int(first):int(first) + int(count)].tolist() for first, count, *_ in table[:n]]


@settings(max_examples=300, deadline=None)
@given(tiles=st.lists(st.integers(0, 300), min_size=1, max_size=200),
       groups=st.integers(1, 3), sms=st.sampled_from([4, 16, 132]))
def test_runs_schedule_properties(tiles, groups, sms):
    """Whatever the lengths: headers that cover the item rows once, in order; at most ``sms
    // groups`` runs, each run's items the same for every row group, side by side; every
    sequence's tiles covered exactly once by its pieces, in slot order 0, 1, ... with the last
    piece's end -1 (to whatever the sequence holds when the kernel runs) and only there; an
    empty sequence one item; pieces cut from a sequence at least RUN_MIN_PIECE tiles where
    the run was not its own; the longest run within RUN_ITEM_TILES + 2 RUN_MIN_PIECE of the
    even share of the work (the bisection's cap); the same table twice."""
    tiles = np.asarray(tiles)
    table = heuristics.run_schedule(tiles, groups, sms=sms)
    np.testing.assert_array_equal(table, heuristics.run_schedule(tiles, groups, sms=sms))
    assert table.dtype == np.int32 and table.shape[1] == 5
    n = int(table[0, 0])
    nruns = max(1, sms // groups)
    assert n % groups == 0 and n // groups <= nruns
    assert np.all(table[:n, 2:] == 0)
    assert table[:n, 0].tolist() == (n + np.concatenate([[0], np.cumsum(table[:n, 1])[:-1]])
                                     ).tolist() and int(table[:n, 1].sum()) == len(table) - n
    blocks = runs_of(table)
    pieces = {(b, g): [] for b in range(tiles.size) for g in range(groups)}
    loads = []
    for r in range(n // groups):
        same = [[(b, s, t0, t1) for b, _, s, t0, t1 in blocks[r * groups + g]]
                for g in range(groups)]
        assert all(x == same[0] for x in same)
        for g in range(groups):
            assert all(item[1] == g for item in blocks[r * groups + g])
        load = 0
        for b, s, t0, t1 in same[0]:
            end = tiles[b] if t1 < 0 else t1
            load += end - t0 + heuristics.RUN_ITEM_TILES
            if len(same[0]) > 1 and 0 < tiles[b]:  # (a cut made inside a shared run)
                assert end - t0 >= min(heuristics.RUN_MIN_PIECE, tiles[b]) or (
                    end - t0 == tiles[b])
            for g in range(groups):
                pieces[(b, g)].append((s, t0, t1))
        loads.append(load)
    for (b, g), its in pieces.items():
        assert [s for s, _, _ in its] == list(range(len(its)))
        assert [t1 for _, _, t1 in its].count(-1) == 1 and its[-1][2] == -1
        ends = [t1 for _, _, t1 in its[:-1]] + [int(tiles[b])]
        covered = [t for (_, t0, _), e in zip(its, ends) for t in range(t0, e)]
        assert covered == list(range(int(tiles[b]))), (b, its)
        if tiles[b] == 0:
            assert its == [(0, 0, -1)]
    total = int(tiles.sum()) + heuristics.RUN_ITEM_TILES * tiles.size
    assert max(loads) <= -(-total // nruns) + heuristics.RUN_ITEM_TILES + 2 * heuristics.RUN_MIN_PIECE
    assert heuristics.runs_partitions(table) == max(len(v) for v in pieces.values())


@settings(max_examples=60, deadline=None)
@given(tiles=st.lists(st.integers(0, 300), min_size=1, max_size=200),
       groups=st.integers(1, 3), sms=st.sampled_from([4, 16, 132]))
def test_mixed_runs_properties(tiles, groups, sms):
    """heuristics.mixed_runs (MIXED_RUNS), whatever the lengths: headers that cover the item
    rows once; at most ``sms // groups`` runs, each run's items the same for every row group,
    side by side; every sequence's tiles covered exactly once by its pieces, slots 0, 1, ...
    in the order of their tiles, the last piece's end -1 and only there; a cut piece at least
    RUN_MIN_PIECE tiles; an empty sequence one item; the same table twice."""
    tiles = np.asarray(tiles)
    table = heuristics.mixed_runs(tiles, groups, sms=sms)
    np.testing.assert_array_equal(table, heuristics.mixed_runs(tiles, groups, sms=sms))
    assert table.dtype == np.int32 and table.shape[1] == 5
    n = int(table[0, 0])
    assert n % groups == 0 and n // groups <= max(1, sms // groups)
    assert table[:n, 0].tolist() == (n + np.concatenate([[0], np.cumsum(table[:n, 1])[:-1]])
                                     ).tolist() and int(table[:n, 1].sum()) == len(table) - n
    blocks = runs_of(table)
    pieces = {(b, g): [] for b in range(tiles.size) for g in range(groups)}
    for r in range(n // groups):
        same = [[(b, s, t0, t1) for b, _, s, t0, t1 in blocks[r * groups + g]]
                for g in range(groups)]
        assert same[0] and all(x == same[0] for x in same)
        for g in range(groups):
            assert all(item[1] == g for item in blocks[r * groups + g])
            for b, s, t0, t1 in same[g]:
                pieces[(b, g)].append((s, t0, t1))
    for (b, g), its in pieces.items():
        its.sort()
        assert [s for s, _, _ in its] == list(range(len(its)))
        assert [t1 for _, _, t1 in its].count(-1) == 1 and its[-1][2] == -1
        ends = [t1 for _, _, t1 in its[:-1]] + [int(tiles[b])]
        covered = [t for (_, t0, _), e in zip(its, ends) for t in range(t0, e)]
        assert covered == list(range(int(tiles[b]))), (b, its)
        if len(its) > 1:
            assert min(e - t0 for (_, t0, _), e in zip(its, ends)) >= heuristics.RUN_MIN_PIECE
        if tiles[b] == 0:
            assert its == [(0, 0, -1)]


def test_mixed_runs_cut_only_what_does_not_fit(monkeypatch):
    """Four sequences of 10 tiles and one of 30 on four runs: the 30 is cut across runs, the
    10s stay whole (each its run's only piece of its sequence); and with MIXED_RUNS the model
    takes such runs for the varlen sweep's 64 x 128 x 4096 at spread 0.5 (128 pairs on 132
    multiprocessors, past the cut runs' bound), cutting fewer than half its sequences, where
    without it it takes none there."""
    from numba_mla.bench import configs, problems

    table = heuristics.mixed_runs(np.array([10, 10, 30, 10, 10]), 1, sms=4)
    counts = np.bincount(table[int(table[0, 0]):, 0], minlength=5)
    assert counts[2] > 1 and (counts[[0, 1, 3, 4]] == 1).all()
    cfg = configs.Config(64, 128, 4096, spread=0.5, sweep="varlen")
    lengths = problems.draw_lengths(cfg, 0)
    split = heuristics.balanced_split(lengths, 64, 2, sms=H200_SMS, rows=128)
    pieces = heuristics.listed_split(lengths, 64, 2, H200_SMS, rows=128, balanced=split)
    args = (lengths, 64, 2)
    kwargs = dict(sms=H200_SMS, rows=128, balanced=split, pieces=pieces)
    monkeypatch.setattr(heuristics, "MIXED_RUNS", False)
    assert heuristics.runs_split(*args, **kwargs) is None
    monkeypatch.setattr(heuristics, "MIXED_RUNS", True)
    table = heuristics.runs_split(*args, **kwargs)
    assert table is not None and heuristics.runs_partitions(table) > 1
    items = table[int(table[0, 0]):]
    cut = np.bincount(items[items[:, 1] == 0, 0], minlength=64) > 1
    assert 0 < cut.sum() < 32
    assert heuristics.runs_whole_items(table)


def test_runs_whole_items():
    """heuristics.runs_whole_items, which keeps the mixed form (MIXED_RUNS) to runs tables
    with a whole sequence's item (slot 0 to its last tile): none where every sequence is cut,
    one where a sequence's only piece sits beside another's pieces (any row group)."""
    cut = [[(0, 0, 0, 2), (1, 0, 0, 3)], [(0, 1, 2, -1), (1, 1, 3, -1)]]
    some = [[(0, 0, 0, 2), (1, 0, 0, -1)], [(0, 1, 2, -1)]]
    for groups in (1, 2):
        assert not heuristics.runs_whole_items(heuristics.runs_table(cut, groups))
        assert heuristics.runs_whole_items(heuristics.runs_table(some, groups))
    assert not heuristics.runs_whole_items(heuristics.run_schedule(np.array([40, 40]), 1,
                                                                   sms=4))


@settings(max_examples=300, deadline=None)
@given(tiles=st.lists(st.integers(0, 300), min_size=1, max_size=300),
       groups=st.integers(1, 3), sms=st.sampled_from([4, 16, 132]))
def test_whole_runs_properties(tiles, groups, sms):
    """``heuristics.whole_runs``: every sequence once for every row group, whole (slot 0,
    from tile 0 to its end, -1), so one partition; at most ``sms // groups`` runs and no
    more than there are sequences, none empty, each run's items the same for every row
    group, side by side, longest first; the longest run within one item of the even share
    (the longest-processing-time rule's bound); the same table twice."""
    tiles = np.asarray(tiles)
    table = heuristics.whole_runs(tiles, groups, sms=sms)
    np.testing.assert_array_equal(table, heuristics.whole_runs(tiles, groups, sms=sms))
    n = int(table[0, 0])
    nruns = max(1, min(sms // groups, tiles.size))
    assert table.dtype == np.int32 and n == nruns * groups
    assert heuristics.runs_partitions(table) == 1
    blocks = runs_of(table)
    seen = []
    item = heuristics.WHOLE_ITEM_TILES
    loads = []
    for r in range(nruns):
        same = [[(b, s, t0, t1) for b, _, s, t0, t1 in blocks[r * groups + g]]
                for g in range(groups)]
        assert same[0] and all(x == same[0] for x in same)
        assert all(it[1] == g for g in range(groups) for it in blocks[r * groups + g])
        assert all((s, t0, t1) == (0, 0, -1) for _, s, t0, t1 in same[0])
        own = [int(tiles[b]) for b, *_ in same[0]]
        assert own == sorted(own, reverse=True)
        loads.append(sum(own) + item * len(own))
        seen += [b for b, *_ in same[0]]
    assert sorted(seen) == list(range(tiles.size))
    total = int(tiles.sum()) + item * tiles.size
    assert max(loads) <= total / nruns + int(tiles.max()) + item


def test_whole_runs_level_the_loads(monkeypatch):
    """An example: sequences of 2, 3, 20, 19, 1 and 18 tiles on two multiprocessors. The
    rule packs 20, 3, 2, 1 and 19, 18 (loads 42 and 45 with 4 a item: 46 tile-times with the
    block's own start), where the one-partition grid's blocks in launch order leave 19 and 18
    to one multiprocessor (55); so the model takes the packed runs there, past one pair a
    multiprocessor, and not with more multiprocessors than pairs (where, with ``MIXED_RUNS``,
    the mixed runs are weighed instead: off here)."""
    monkeypatch.setattr(heuristics, "MIXED_RUNS", False)
    tiles = np.array([2, 3, 20, 19, 1, 18])
    table = heuristics.whole_runs(tiles, 1, sms=2)
    assert [[it[0] for it in run] for run in runs_of(table)] == [[2, 1, 0, 4], [3, 5]]
    assert heuristics._whole_cost(table, tiles) == 19 + 18 + 2 * 4 + 5 - 4
    assert heuristics._balanced_cost(tiles, 0, 1, 1, 2, 0.0) == 55
    keys = tiles * 64
    got = heuristics.runs_split(keys, 64, 1, sms=2, rows=16)
    assert got is not None and heuristics.runs_partitions(got) == 1
    np.testing.assert_array_equal(got, table)
    assert heuristics.runs_split(keys, 64, 1, sms=8, rows=16) is None  # (6 pairs on 8)


def test_whole_runs_at_equal_lengths(monkeypatch):
    """Equal lengths take the whole runs (``heuristics.WHOLE_EQUAL``, on) past one (sequence,
    row group) pair a multiprocessor only: 10 sequences of 8 tiles in two row groups on 8
    multiprocessors are 4 runs of two or three sequences, 8 blocks, one partition; on 32
    multiprocessors (20 pairs) none. With the flag off, none."""
    keys = np.full(10, 8 * 64)
    monkeypatch.setattr(heuristics, "WHOLE_EQUAL", False)
    assert heuristics.runs_split(keys, 64, 2, sms=8, rows=128) is None
    monkeypatch.setattr(heuristics, "WHOLE_EQUAL", True)
    table = heuristics.runs_split(keys, 64, 2, sms=8, rows=128)
    assert int(table[0, 0]) == 8 and heuristics.runs_partitions(table) == 1
    assert sorted(len(r) for r in runs_of(table)) == [2, 2, 2, 2, 3, 3, 3, 3]
    np.testing.assert_array_equal(table, heuristics.whole_runs(np.full(10, 8), 2, sms=8))
    assert heuristics.runs_split(keys, 64, 2, sms=32, rows=128) is None


def test_runs_schedule_cuts_across_sequences():
    """Examples: one long sequence alone is cut into even pieces, one a run, each run a block
    a row group (B = 1, L = 65536 on 132 multiprocessors: two row groups, 64 runs of 16
    tiles: the cap is whole tile-times, and 66 runs would need pieces of 15 and 16); one
    sequence longer than the rest together is cut across runs while the short ones share
    theirs (each in one run, or cut once where a run fills); equal lengths that fit whole in
    a run stay whole."""
    table = heuristics.run_schedule([1024], 2, sms=132)
    blocks = runs_of(table)
    assert len(blocks) == 128 and all(len(items) == 1 for items in blocks)
    sizes = [(t1 if t1 >= 0 else 1024) - t0 for items in blocks for _, _, _, t0, t1 in items]
    assert set(sizes) == {16} and sum(sizes) == 2 * 1024
    tiles = [400] + [10] * 20
    blocks = runs_of(heuristics.run_schedule(tiles, 1, sms=8))
    assert len(blocks) <= 8
    assert sum(1 for items in blocks for it in items if it[0] == 0) >= 4  # (cut in 4 or more)
    assert all(len([it for items in blocks for it in items if it[0] == b]) <= 2
               for b in range(1, 21))
    assert max(len(items) for items in blocks) >= 3  # (runs that cross sequences)
    blocks = runs_of(heuristics.run_schedule([64] * 8, 1, sms=8))
    assert [[it[0] for it in items] for items in blocks] == [[b] for b in range(8)]
    assert heuristics.run_schedule([], 2, sms=8).shape == (0, 5)  # (no sequence: no block)


def test_greedy_makespan_follows_the_rule():
    """_greedy_makespan against the longest-processing-time rule taken block by block (a heap
    of loads): within 3% on random lists (its rounds approximate the rule), exact for whole
    rounds of equal blocks and for fewer blocks than multiprocessors."""
    import heapq

    rng = np.random.default_rng(1)
    for _ in range(100):
        sms = int(rng.choice([16, 132]))
        sizes = rng.integers(1, 100, int(rng.integers(1, 600))).astype(float)
        loads = [0.0] * sms
        for s in sorted(sizes, reverse=True):
            heapq.heapreplace(loads, loads[0] + s)
        exact = max(loads)
        assert abs(heuristics._greedy_makespan(sizes, sms) - exact) <= 0.03 * exact
    assert heuristics._greedy_makespan([7.0] * 264, 132) == 14.0
    assert heuristics._greedy_makespan([3.0, 9.0, 5.0], 132) == 9.0


def test_in_order_makespan_is_list_scheduling():
    """_in_order_makespan hands blocks out in launch order to the multiprocessor that frees
    first: two short blocks then a long one on two multiprocessors take 2 + 4, where largest
    first takes 4; and it equals a block-by-block simulation of the rule on random lists."""
    assert heuristics._in_order_makespan([2.0, 2.0, 4.0], 2) == 6.0
    assert heuristics._greedy_makespan([2.0, 2.0, 4.0], 2) == 4.0
    rng = np.random.default_rng(2)
    for _ in range(50):
        sms = int(rng.integers(1, 20))
        sizes = rng.integers(1, 50, int(rng.integers(1, 100))).tolist()
        free = [0] * sms
        for size in sizes:
            k = min(range(sms), key=lambda i: free[i])
            free[k] += size
        assert heuristics._in_order_makespan(sizes, sms) == max(free)


def test_balanced_blocks_are_in_launch_order():
    """_balanced_blocks lists the blocks as the (P, G, B) grid launches them: a sequence's
    partitions side by side, for each row group, sequence after sequence."""
    tiles = np.array([5, 1])
    cost = heuristics._balanced_blocks(tiles, 3, 2, 2)
    over, empty = heuristics.BLOCK_OVERHEAD_TILES, heuristics.EMPTY_BLOCK_TILES
    np.testing.assert_array_equal(cost, [3 + over, 2 + over] * 2 + [1 + over, empty] * 2)
