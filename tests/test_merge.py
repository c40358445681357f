"""The split-K merge identity: attention over all keys equals the log-sum-exp merge
(``reference.merge_partitions``) of attention over disjoint key chunks, what the combine
kernel relies on. Chunks with no kept key and rows with none at all are included."""
import numpy as np
import pytest

import numba_mla as nm
from helpers import MASK_CASES, SCORE_MODS, assert_close, make_problem, random_lengths
from numba_mla.mods import as_mask, as_score_mod
from numba_mla.reference import attend, merge_partitions

RTOL, ATOL = 1e-11, 1e-13


def restrict(mask, k0, k1):
    """``mask`` keeping only absolute key positions in [k0, k1)."""
    if mask.boolean:
        return mask & (lambda b, h, q_pos, k: (k0 <= k) & (k < k1))
    bias = np.array(mask.array)
    bias[..., :k0] = -np.inf
    bias[..., k1:] = -np.inf
    return nm.MaterializedMask(bias)


def random_cuts(rng, L, parts):
    """``parts`` chunks [c_j, c_j+1) covering [0, L); repeated cuts make empty chunks."""
    inner = np.sort(rng.integers(0, L + 1, parts - 1))
    return np.concatenate([[0], inner, [L]]).astype(int)


def split_and_merge(p, b, mask, score_mod, cuts):
    """Per-chunk (out, lse) of sequence b via ``attend`` over the chunk's keys, and their merge."""
    L = int(p.lengths[b])
    q, kv = p.q_of(b), p.cache.rows(b, L)
    parts = [attend(q, kv, b, L, p.scale, restrict(mask, k0, k1), score_mod)
             for k0, k1 in zip(cuts[:-1], cuts[1:])]
    outs, lses = np.stack([o for o, _ in parts]), np.stack([s for _, s in parts])
    return outs, lses, merge_partitions(outs, lses)


@pytest.mark.parametrize("parts", [1, 2, 5])
@pytest.mark.parametrize("score_id", ["identity", "alibi", "softcap"])
@pytest.mark.parametrize("case", MASK_CASES, ids=str)
def test_merge_equals_whole(case, score_id, parts, rng):
    B, Sq, H = 3, 3, 2
    p = make_problem(rng, B, Sq, H, random_lengths(rng, B, Sq, 14), np.float32, "paged", 4)
    mask, score_mod = as_mask(case.make(p, rng)), as_score_mod(SCORE_MODS[score_id].make(p))
    for b in range(B):
        L = int(p.lengths[b])
        whole_out, whole_lse = attend(p.q_of(b), p.cache.rows(b, L), b, L, p.scale, mask,
                                      score_mod)
        _, lses, (out, lse) = split_and_merge(p, b, mask, score_mod, random_cuts(rng, L, parts))
        assert lses.shape == (parts, Sq, H)
        assert_close(out, whole_out, RTOL, ATOL, f"merged out, sequence {b}")
        assert_close(lse, whole_lse, RTOL, ATOL, f"merged lse, sequence {b}")


def test_empty_chunks_and_rows(rng):
    """Sliding window of 2, Sq = 3: most chunks keep nothing for some row. Sequence 1 has no
    keys; in sequence 2 a bias drops every key of head 1."""
    B, Sq, H = 3, 3, 2
    p = make_problem(rng, B, Sq, H, [13, 0, 9], np.float32, "contiguous")
    window = nm.SlidingWindowCausalMask(2)
    cuts = np.array([0, 3, 3, 10, 11, 13])          # chunk [3, 3) holds no key at all
    outs, lses, (out, lse) = split_and_merge(p, 0, window, nm.IdentityScoreMod(), cuts)
    assert np.isneginf(lses).any() and np.isfinite(lses).any()
    assert np.all(outs[np.isneginf(lses)] == 0)
    whole = attend(p.q_of(0), p.cache.rows(0, 13), 0, 13, p.scale, window, nm.IdentityScoreMod())
    assert_close(out, whole[0], RTOL, ATOL, "out")
    assert_close(lse, whole[1], RTOL, ATOL, "lse")

    _, lses, (out, lse) = split_and_merge(p, 1, window, nm.IdentityScoreMod(), np.array([0, 0, 0]))
    assert np.isneginf(lses).all()
    assert np.all(out == 0) and np.isneginf(lse).all()

    bias = rng.standard_normal((B, H, Sq, 13)).astype(np.float32)
    bias[2, 1] = -np.inf
    _, lses, (out, lse) = split_and_merge(p, 2, nm.MaterializedMask(bias), nm.IdentityScoreMod(),
                                          np.array([0, 4, 9]))
    assert np.all(out[:, 1] == 0) and np.isneginf(lse[:, 1]).all()
    assert np.isfinite(lse[:, 0]).all() and not np.isnan(out).any()


def random_partials(rng, P, shape, empty_frac=0.3):
    """P normalised partial results: out [P, *shape, 512], lse [P, *shape] (some -inf, with
    out 0 there, as attend gives)."""
    outs = rng.standard_normal((P, *shape, 512))
    lses = rng.standard_normal((P, *shape)) * 5
    empty = rng.random((P, *shape)) < empty_frac
    lses[empty] = -np.inf
    outs[empty] = 0
    return outs, lses


def test_merge_is_order_free_nestable_and_ignores_empty_parts(rng):
    outs, lses = random_partials(rng, 6, (4, 3))
    out, lse = merge_partitions(outs, lses)
    perm = rng.permutation(6)
    assert_close(merge_partitions(outs[perm], lses[perm])[0], out, RTOL, ATOL, "permuted out")
    # A tree of merges (what a two-level combine does) equals the flat merge.
    left, right = merge_partitions(outs[:2], lses[:2]), merge_partitions(outs[2:], lses[2:])
    tree = merge_partitions(np.stack([left[0], right[0]]), np.stack([left[1], right[1]]))
    assert_close(tree[0], out, RTOL, ATOL, "tree out")
    assert_close(tree[1], lse, RTOL, ATOL, "tree lse")
    # One more partition with no kept key changes nothing.
    extra_out = np.concatenate([outs, np.zeros((1, 4, 3, 512))])
    extra_lse = np.concatenate([lses, np.full((1, 4, 3), -np.inf)])
    more = merge_partitions(extra_out, extra_lse)
    np.testing.assert_array_equal(more[0], out)
    np.testing.assert_array_equal(more[1], lse)
    # Explicit formula: lse = log sum exp(lse_p), out = sum exp(lse_p - lse) out_p.
    with np.errstate(divide="ignore"):
        want_lse = np.log(np.exp(lses).sum(axis=0))
    w = np.exp(lses - np.where(np.isneginf(want_lse), 0, want_lse))
    want_out = np.einsum("p...,p...d->...d", w, outs)
    assert_close(lse, want_lse, RTOL, ATOL, "lse")
    assert_close(out, want_out, RTOL, ATOL, "out")


def test_merge_of_large_and_empty_lses():
    """Large lse values must not overflow; all-empty rows give out 0 and lse -inf without any
    floating-point warning."""
    outs = np.stack([np.full((2, 512), 1.0), np.full((2, 512), 3.0), np.zeros((2, 512))])
    lses = np.array([[1000.0, -np.inf], [1000.0 + np.log(3.0), -np.inf], [-np.inf, -np.inf]])
    with np.errstate(all="raise"):
        out, lse = merge_partitions(outs, lses)
    np.testing.assert_allclose(out[0], 0.25 * 1.0 + 0.75 * 3.0, rtol=1e-13)
    np.testing.assert_allclose(lse[0], 1000.0 + np.log(4.0), rtol=1e-15)
    assert np.all(out[1] == 0) and np.isneginf(lse[1])


@pytest.mark.parametrize("groups", [1, 2, 3, 4])
@pytest.mark.parametrize("parts", [1, 5, 13])
def test_combine_kernel_matches_merge(groups, parts, rng, monkeypatch):
    """The general combine kernel itself (fp32 output), for every number of partition groups a
    block may have and partition counts that are not a multiple of a step: empty partitions
    whose output is NaN garbage, a row with no kept key, a NaN row, large and spread LSEs;
    every element is written (out starts as NaN)."""
    check_combine(rng, parts, groups, 0, monkeypatch)


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 6, 8])
def test_one_step_combine_matches_merge(parts, rng, monkeypatch):
    """The one-step kernel (at most 8 partitions: combine.variant picks it and its slots) on
    the same rows as the general one, slots past the last partition included."""
    from numba_mla.kernels import combine

    few, groups = combine.variant(6, parts, 132)
    assert groups == 1 and few >= parts and few in (2, 4, 8)
    check_combine(rng, parts, groups, few, monkeypatch)


def test_combine_variant_choice():
    """Up to 8 partitions take the one-step kernel with the fewest slots that hold them; more
    take the general one with split's groups."""
    from numba_mla.kernels import combine

    assert [combine.variant(64, p, 132)[0] for p in (1, 2, 3, 4, 5, 8)] == [2, 2, 4, 4, 8, 8]
    assert combine.variant(128, 9, 132) == (0, 1)
    assert combine.variant(128, 64, 132) == (0, combine.MAX_SPLIT)


def check_combine(rng, parts, groups, few, monkeypatch):
    """The combine kernel (``few``: which one, combine.variant) on T x H = 2 x 3 rows of
    ``parts`` partitions, against merge_partitions. In the simulator every output load is
    checked as it is made: never a slot past the last partition, and for the general kernel
    never an empty one (LSE -inf: its output was never written). The one-step kernel loads
    every slot beside its LSE, so an empty partition's output is NaN here: used, it would
    show."""
    from numba import cuda

    from numba_mla import _compat, factory, ptx

    T, H = 2, 3
    outs, lses = random_partials(rng, parts, (T, H))
    lses = lses * 30.0 + 500.0  # spread (weights far from 1) and large (no overflow)
    lses[:, 1, :2] = 500.0 + rng.random((parts, 2))  # weights alike: every partition counts
    lses[rng.random(lses.shape) < 0.3] = -np.inf
    outs[np.isneginf(lses)] = np.nan  # an empty partition's output is never read
    lses[:, 0, 1] = -np.inf  # a row with no kept key
    lses[parts // 2, 1, 2] = np.nan  # a row with a NaN score
    outs, lses = outs.astype(np.float32), lses.astype(np.float32)  # what the kernel reads
    if _compat.SIMULATOR:
        load = ptx.ld_global_x4

        def checked_load(arr, t, h, p, d):
            assert int(p) < parts, f"a load of slot {int(p)} past the {parts} partitions"
            assert few or not np.isneginf(lses[int(p), int(t), int(h)]), \
                "an empty partition's load"
            return load(arr, t, h, p, d)

        monkeypatch.setattr(ptx, "ld_global_x4", checked_load)
    want_out, want_lse = merge_partitions(np.nan_to_num(outs), lses)
    part_out = cuda.to_device(np.ascontiguousarray(outs.transpose(1, 2, 0, 3)))
    part_lse = cuda.to_device(np.ascontiguousarray(lses.transpose(1, 2, 0)))
    out = cuda.to_device(np.full((T, H, 512), np.nan, np.float32))
    lse = cuda.to_device(np.full((T, H), np.nan, np.float32))
    factory.combine_kernel("f32", few=few)[(T, H), (128, groups)](part_out, part_lse, out, lse)
    got_out, got_lse = out.copy_to_host(), lse.copy_to_host()
    assert np.all(np.isnan(got_out[1, 2])) and np.isnan(got_lse[1, 2])
    assert np.all(got_out[0, 1] == 0) and np.isneginf(got_lse[0, 1])
    keep = ~np.isnan(want_lse)
    assert not np.isnan(got_out[keep]).any()
    assert_close(got_out[keep], want_out[keep], 1e-5, 1e-6, "out")
    assert_close(got_lse[keep], want_lse[keep], 1e-6, 1e-6, "lse")


@pytest.mark.parametrize("parts,few", [(2, 2), (3, 4), (13, 0)])
def test_combine_skips_rows_written_out(parts, few, rng):
    """The ``skips`` variants (the mixed runs: kernels/seesaw.py writes a whole sequence's rows
    out itself and puts combine.WRITTEN in partition 0's LSE, the other partitions empty):
    such a row's out and lse are left as they were, and the other rows merged as without it."""
    from numba import cuda

    from numba_mla import factory
    from numba_mla.kernels import combine

    T, H = 2, 3
    outs, lses = random_partials(rng, parts, (T, H))
    lses = (lses * 3.0).astype(np.float32)
    lses[0, 1, 2] = combine.WRITTEN  # row (1, 2): written out by its block
    lses[1:, 1, 2] = -np.inf
    outs = outs.astype(np.float32)
    outs[:, 1, 2] = np.nan  # (never written: never to be read)
    want_out, want_lse = merge_partitions(outs, lses)
    part_out = cuda.to_device(np.ascontiguousarray(outs.transpose(1, 2, 0, 3)))
    part_lse = cuda.to_device(np.ascontiguousarray(lses.transpose(1, 2, 0)))
    out = cuda.to_device(np.full((T, H, 512), 7.0, np.float32))
    lse = cuda.to_device(np.full((T, H), 5.0, np.float32))
    groups = combine.variant(T * H, parts, 132)[1]
    factory.combine_kernel("f32", few=few, skips=True)[(T, H), (128, groups)](
        part_out, part_lse, out, lse)
    got_out, got_lse = out.copy_to_host(), lse.copy_to_host()
    assert np.all(got_out[1, 2] == 7.0) and got_lse[1, 2] == 5.0
    keep = np.ones((T, H), bool)
    keep[1, 2] = False
    assert_close(got_out[keep], want_out[keep], 1e-5, 1e-6, "out")
    assert_close(got_lse[keep], want_lse[keep], 1e-6, 1e-6, "lse")
