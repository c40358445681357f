"""The plain call is the fast call (plans.py): a plain ``mla_decode`` on device arrays reuses
the plan of an earlier call of the same layouts, and must behave exactly as a fresh call.

- results bit-identical to a call on host arrays (which never reuses a plan) and to a prepared
  step; a new output array every call;
- another shape, dtype, mask, cache kind or lengths never reuses a stale plan;
- q, cache contents and lengths changed in place between calls are honoured;
- lengths and block-table entries changed in device memory after the cache was checked never
  make a kernel read outside its arrays (the simulator raises on an out-of-bounds index; on
  the GPU compute-sanitizer's memcheck runs the same cases: scripts/sanitize.py);
- the plan cache's bound holds; threads calling at once (GPU);
- without a GPU, ``import numba_mla`` selects the simulator by itself; the disk cache's key is
  the same in every process.
"""
import os
import subprocess
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numba_mla as nm
from helpers import BF16, make_bias, make_problem
from numba_mla import _compat, factory, kernel_cache, plans
from numba_mla.kernels import simple

KERNEL = pytest.mark.kernel


def to_device(x):
    """A Numba device array (the simulator's without a GPU); bfloat16 travels as int16 bits
    (Numba's copy cannot take ml_dtypes' bfloat16) and is seen as bfloat16 again."""
    from numba import cuda

    x = np.ascontiguousarray(x)
    if x.dtype == BF16:
        return cuda.to_device(x.view(np.int16)).view(BF16)
    return cuda.to_device(x)


def on_device(p):
    """Problem p's q and cache as Numba device arrays."""
    c = p.cache
    if c.kind == "contiguous":
        cache = nm.ContiguousKVCache(to_device(c.storage), to_device(c.lengths_host))
    else:
        cache = nm.PagedKVCache(to_device(c.storage), to_device(c.block_table_host),
                                to_device(c.lengths_host))
    return to_device(p.q), cache


def host(x):
    return x.copy_to_host() if hasattr(x, "copy_to_host") else np.asarray(x)


@KERNEL
@pytest.mark.parametrize("backend", ["simple", "mma", pytest.param("simt", marks=pytest.mark.gpu)])
def test_plain_call_reuses_its_plan(backend, rng):
    """Two plain calls: one plan kept, two output arrays, both results bit-identical to the
    host-array call and to a prepared step. (The plan cache is the same for every backend;
    the FMA kernel, 15 s a call in the simulator, runs it on the GPU only.)"""
    plans.clear()
    p = make_problem(rng, 2, 1, 1, [19, 7], BF16, "paged", 8)
    q, cache = on_device(p)
    first = nm.mla_decode(q, cache, p.scale, backend=backend)
    second = nm.mla_decode(q, cache, p.scale, backend=backend)
    assert plans.size() == 1
    assert first is not second
    expected = p.run(nm, backend=backend)
    for got in (first, second):
        np.testing.assert_array_equal(host(got), expected)
    step = nm.prepare(q, cache, p.scale, backend=backend)  # prepare() in the simulator too
    np.testing.assert_array_equal(host(step()), expected)


def test_plan_found_when_blocks_share_a_multiprocessor(rng, monkeypatch):
    """The warp tensor-core kernel's schedule counts two blocks a multiprocessor where shared
    memory allows (heuristics.resident_blocks; 1 in the simulator, made 2 here): a plain call's
    plan key is computed from the same count, so repeated calls find their plan instead of
    building a new one each time. (The kernels are not run: plans.run is replaced.)"""
    from numba_mla import heuristics, launch

    monkeypatch.setattr(heuristics, "resident_blocks", lambda smem, bound, **kw: 2)
    monkeypatch.setattr(plans, "run", lambda *args: None)
    built = []
    make = launch.Plan
    monkeypatch.setattr(launch, "Plan", lambda call: built.append(call) or make(call))
    plans.clear()
    p = make_problem(rng, 3, 1, 16, [3000, 200, 900], BF16, "paged", 16)
    q, cache = on_device(p)
    for _ in range(3):
        nm.mla_decode(q, cache, p.scale, backend="mma_sync")
    assert len(built) == 1 and plans.size() == 1
    plans.clear()


@KERNEL
def test_no_stale_plan(rng):
    """Calls that differ in one thing each (heads, dtype, mask, cache kind, lengths) after a
    first one: each result equals a fresh host-array call's. (The readable kernel: a plan
    is built the same way for every backend, and the simulator runs this one fastest.)"""
    plans.clear()
    base = dict(B=1, Sq=1, H=2, lengths=[13], dtype=BF16, kind="paged")
    variants = [{}, dict(H=3), dict(dtype=np.float16), dict(kind="contiguous"),
                dict(lengths=[5]), {}]
    masks = [None, None, None, None, None, nm.SlidingWindowCausalMask(4)]
    for change, mask in zip(variants, masks):
        v = dict(base, **change)
        p = make_problem(rng, v["B"], v["Sq"], v["H"], v["lengths"], v["dtype"], v["kind"], 4)
        q, cache = on_device(p)
        got = nm.mla_decode(q, cache, p.scale, mask=mask, backend="simple")
        np.testing.assert_array_equal(host(got), p.run(nm, mask=mask, backend="simple"),
                                      err_msg=f"after {change or 'the first call'}")
    assert plans.size() == len(variants)


@KERNEL
def test_ragged_host_offsets_copied_once(rng):
    """mla_decode_ragged on device q with host row offsets: the plan copies the offsets to the
    device once and reuses the copy while they stay the same; new offsets (the same plan: same
    longest run and schedule) get a new copy; every result is the reference's."""
    plans.clear()
    p = make_problem(rng, 2, 2, 1, [9, 6], np.float32, "contiguous", ragged=True,
                     q_counts=[2, 1])
    q, cache = on_device(p)
    copies = []
    for offsets in (p.q_offsets, p.q_offsets.copy(), np.array([0, 1, 3], np.int32)):
        got = nm.mla_decode_ragged(q, offsets, cache, p.scale, backend="simt")
        expected = nm.mla_decode_ragged(p.q, offsets, p.cache, p.scale, backend="reference")
        np.testing.assert_allclose(host(got), expected, rtol=2e-5, atol=2e-6)
        (plan,) = plans._plans.values()
        copies.append(plan._offsets[1])
    assert copies[0] is copies[1] and copies[2] is not copies[0]


@KERNEL
def test_flare_reuses_the_plain_calls_plan(rng, monkeypatch):
    """flare_mla_decoding(output, q, cache, ...) is mla_decode(q, cache, ..., out=output) in
    MAX's words: a second call on the same cache object takes the plain call's fast path
    (no check_decode), writes the same bits, and still refuses a q_max_seq_len below Sq."""
    from numba_mla import api

    plans.clear()
    p = make_problem(rng, 2, 2, 1, [6, 9], np.float32, "paged", 4)
    q, cache = on_device(p)
    outputs = [to_device(np.full(p.out_shape, np.nan, np.float32)) for _ in range(2)]
    nm.flare_mla_decoding(outputs[0], q, cache, None, None, None, p.scale, backend="simt")
    expected = p.run(nm, backend="reference")

    def refuse(*args, **kwargs):
        raise AssertionError("check_decode ran on a kept plan's call")

    monkeypatch.setattr(api, "check_decode", refuse)
    nm.flare_mla_decoding(outputs[1], q, cache, None, None, None, p.scale, backend="simt",
                          q_max_seq_len=2)
    np.testing.assert_array_equal(host(outputs[1]), host(outputs[0]))
    np.testing.assert_allclose(host(outputs[0]), expected, rtol=2e-5, atol=2e-6)
    with pytest.raises(ValueError, match="q_max_seq_len"):
        nm.flare_mla_decoding(outputs[1], q, cache, None, None, None, p.scale, backend="simt",
                              q_max_seq_len=1)


@KERNEL
def test_in_place_changes_are_honoured(rng):
    """q, the cache's rows and its lengths rewritten in device memory between two calls: the
    second call sees them (lengths in place are the decode loop's fast idiom). (The readable
    kernel: what a plan keeps is the same for every backend.)"""
    plans.clear()
    p = make_problem(rng, 2, 1, 2, [11, 6], BF16, "paged", 4, capacity=16)
    q, cache = on_device(p)
    nm.mla_decode(q, cache, p.scale, backend="simple")
    p2 = make_problem(rng, 2, 1, 2, [12, 8], BF16, "paged", 4, capacity=16)  # same pages
    # the second problem's data written into the first one's arrays
    q.view(np.int16).copy_to_device(np.ascontiguousarray(p2.q).view(np.int16))
    cache.storage.view(np.int16).copy_to_device(
        np.ascontiguousarray(p2.cache.storage).view(np.int16))
    cache.block_table.copy_to_device(p2.cache.block_table_host)
    cache.lengths.copy_to_device(p2.cache.lengths_host)
    got = nm.mla_decode(q, cache, p.scale, backend="simple")
    assert plans.size() == 1
    np.testing.assert_array_equal(host(got), p2.run(nm, backend="simple"))


@KERNEL
@pytest.mark.parametrize("backend,bias", [("simt", False), ("mma", False), ("mma_sync", False),
                                          ("simple", True)])
def test_values_changed_on_the_device_stay_in_bounds(backend, bias, rng):
    """After the cache was checked, sequence 0's length is raised past the capacity (and the
    bias's columns) and its block-table entries point outside the pages (huge, negative): the
    call reads no memory outside the arrays (the simulator would raise IndexError) and
    sequence 1 is unharmed."""
    p = make_problem(rng, 2, 1, 2, [9, 12], BF16, "paged", 4, capacity=16)
    mask = nm.MaterializedMask(make_bias(rng, p, per_head=False, filler=0.0)) if bias else None
    q, cache = on_device(p)
    dev_mask = nm.MaterializedMask(to_device(mask.array)) if bias else None
    bt = p.cache.block_table_host.copy()
    bt[0, :] = [2**30, -5, 7**9, -(2**31)]
    cache.block_table.copy_to_device(bt)
    cache.lengths.copy_to_device(np.array([40, 12], np.int32))  # capacity 16, bias 14 wide
    got = host(nm.mla_decode(q, cache, p.scale, mask=dev_mask, backend=backend))
    expected = p.run(nm, mask=mask, backend=backend)
    np.testing.assert_array_equal(got[1], expected[1])


@KERNEL
@pytest.mark.parametrize("backend", ["simt", "simple", "mma_sync", "mma"])
def test_ragged_device_offsets_are_not_read(backend, rng, monkeypatch):
    """mla_decode_ragged with int32 row offsets in device memory never copies them to the
    host (that would wait for the GPU): the call is planned for up to 8 rows a sequence and
    the kernels read the offsets themselves. Results are the reference's; with
    flare_mla_decoding's q_max_seq_len the plan is sized by it."""
    from numba_mla import caches

    p = make_problem(rng, 3, 3, 2, [7, 5, 9], BF16, "paged", 4, ragged=True,
                     q_counts=[2, 0, 3])
    q, cache = on_device(p)
    offsets = to_device(p.q_offsets)
    read = caches.to_host

    def to_host(x):
        assert x is not offsets, "the device row offsets were copied to the host"
        return read(x)

    monkeypatch.setattr(caches, "to_host", to_host)
    expected = nm.mla_decode_ragged(p.q, p.q_offsets, p.cache, p.scale, backend="reference")
    got = nm.mla_decode_ragged(q, offsets, cache, p.scale, backend=backend)
    np.testing.assert_allclose(host(got).astype(np.float32), expected.astype(np.float32),
                               rtol=2e-2, atol=2e-2)
    output = np.full(p.out_shape, np.nan, BF16)
    out_dev = to_device(output)
    nm.flare_mla_decoding(out_dev, q, cache, None, None, offsets, p.scale, backend=backend,
                          q_max_seq_len=3)
    np.testing.assert_array_equal(host(out_dev), host(got))


@KERNEL
def test_ragged_device_offsets_take_the_fast_path(rng, monkeypatch):
    """A second mla_decode_ragged with device row offsets on the same cache object runs the
    kept plan (no check_ragged) and writes the same bits; offsets rewritten in place between
    calls are honoured (they are read by the kernels, not the key); host offsets are read and
    checked on every call."""
    from numba_mla import api

    plans.clear()
    p = make_problem(rng, 3, 2, 2, [7, 5, 9], np.float32, "paged", 4, ragged=True,
                     q_counts=[2, 1, 3])
    q, cache = on_device(p)
    offsets = to_device(p.q_offsets)
    first = host(nm.mla_decode_ragged(q, offsets, cache, p.scale, backend="simple"))
    moved = np.array([0, 3, 4, 6], np.int32)  # the same six rows, runs of 3, 1 and 2
    expected = nm.mla_decode_ragged(p.q, moved, p.cache, p.scale, backend="reference")
    checked = api.check_ragged

    def refuse(*args, **kwargs):
        raise AssertionError("check_ragged ran on a kept plan's call")

    monkeypatch.setattr(api, "check_ragged", refuse)
    np.testing.assert_array_equal(
        host(nm.mla_decode_ragged(q, offsets, cache, p.scale, backend="simple")), first)
    offsets.copy_to_device(moved)
    got = host(nm.mla_decode_ragged(q, offsets, cache, p.scale, backend="simple"))
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)
    with pytest.raises(AssertionError, match="check_ragged ran"):  # host offsets: checked
        nm.mla_decode_ragged(q, moved, cache, p.scale, backend="simple")
    monkeypatch.setattr(api, "check_ragged", checked)
    with pytest.raises(ValueError, match="q_row_offsets"):
        nm.mla_decode_ragged(q, np.array([0, 3, 2, 6], np.int32), cache, p.scale,
                             backend="simple")


@KERNEL
@pytest.mark.parametrize("backend", ["simt", "simple", "mma_sync", "mma"])
def test_device_offsets_out_of_range_stay_in_bounds(backend, rng):
    """Row offsets in device memory that the host checks would refuse (negative, decreasing,
    past T, 9+ rows a sequence) are not read on the host; a first kernel clamps them into
    q's rows (kernels/offsets.py): no read or write outside q, out or the workspace (the
    simulator raises IndexError on any). (What the rows hold is then undefined: a clamped
    run may overlap another's.)"""
    p = make_problem(rng, 2, 3, 2, [7, 5], BF16, "paged", 4, ragged=True, q_counts=[3, 3])
    q, cache = on_device(p)
    bad = np.array([-7, 40, 45], np.int32)  # negative, past T (6)
    got = host(nm.mla_decode_ragged(q, to_device(bad), cache, p.scale, backend=backend))
    assert got.shape == (6, 2, 512)  # (9+ rows a sequence: test_clamped_offsets_are_valid)


@KERNEL
@settings(max_examples=25, deadline=None)
@given(offsets=st.lists(st.integers(-2**31, 2**31 - 9), min_size=1, max_size=300),
       total=st.integers(0, 40))
def test_clamped_offsets_are_valid(offsets, total):
    """kernels/offsets.clamp_offsets, run as a kernel (several chunks of 128 offsets when
    B > 127): whatever the offsets, the copy is non-decreasing from >= 0 to <= T with at most
    MAX_SQ rows a run; offsets a check accepts come out unchanged."""
    from numba import cuda

    from numba_mla.kernels import offsets as offsets_kernel

    src = np.array(offsets, np.int32)
    dst = cuda.device_array(len(src), np.int32)
    offsets_kernel.clamp_offsets[1, offsets_kernel.NTHREADS](cuda.to_device(src), dst, total)
    got = dst.copy_to_host()
    steps = np.diff(got)
    assert 0 <= got[0] and got[-1] <= total and steps.min(initial=0) >= 0
    assert steps.max(initial=0) <= 8
    if src[0] == 0 and np.all(np.diff(src) >= 0) and np.all(np.diff(src) <= 8) and \
            src[-1] <= total:
        np.testing.assert_array_equal(got, src)


@KERNEL
def test_new_lengths_keep_the_plan_while_the_schedule_holds(rng, monkeypatch):
    """``with_lengths`` a few tokens on (a decode step): the split-K schedule (chunk, P) is
    the same, so the plan is kept; lengths that call for another schedule get their own plan.
    Every result equals a fresh host-array call's. (The readable kernel: the plans are the
    same for every backend, and it is the fastest in the simulator.)"""
    from numba_mla import heuristics

    monkeypatch.setattr(heuristics, "sm_count", lambda: 16)  # (the same schedules on a GPU)
    steps = (([38, 9], 1), ([39, 10], 1), ([117, 3], 2))
    schedules = [heuristics.balanced_split(lengths, simple.BLOCK_N, 1, rows=1)
                 for lengths, _ in steps]
    assert schedules[0] == schedules[1] != schedules[2], schedules  # (what the test is about)
    plans.clear()
    p = make_problem(rng, 2, 1, 1, [117, 10], np.float32, "paged", 4, capacity=120)
    q, cache = on_device(p)
    for lengths, n_plans in steps:
        lengths = np.array(lengths, np.int32)
        got = nm.mla_decode(q, cache.with_lengths(lengths), p.scale, backend="simple")
        expected = nm.mla_decode(p.q, p.cache.with_lengths(lengths), p.scale, backend="simple")
        np.testing.assert_array_equal(got.copy_to_host(), expected)
        assert np.isfinite(expected).all()
        assert plans.size() == n_plans, lengths


@KERNEL
def test_plan_cache_is_bounded(rng, monkeypatch):
    monkeypatch.setattr(plans, "MAX_PLANS", 2)
    plans.clear()
    for H in (1, 2, 3):
        p = make_problem(rng, 1, 1, H, [3], np.float32, "contiguous")
        q, cache = on_device(p)
        nm.mla_decode(q, cache, p.scale, backend="simt")
        assert plans.size() <= 2
    assert plans.size() == 2


@KERNEL
def test_cache_object_remembers_its_plans(rng, monkeypatch):
    """A cache object remembers the plans of its own calls (plans.kept), at most
    PLANS_PER_CACHE, the oldest dropped; each of them a plan of the shared cache, found again
    for the same call; plans.clear() makes it forget them; results stay right."""
    monkeypatch.setattr(plans, "PLANS_PER_CACHE", 2)
    plans.clear()
    p = make_problem(rng, 1, 1, 1, [5], np.float32, "contiguous")
    _, cache = on_device(p)
    for H in (1, 2, 3, 2):
        q = rng.standard_normal((1, 1, H, 576)).astype(np.float32)
        got = nm.mla_decode(to_device(q), cache, p.scale, backend="simt")
        expected = nm.mla_decode(q, p.cache, p.scale, backend="reference")
        np.testing.assert_allclose(host(got), expected, rtol=2e-5, atol=2e-6)
        assert len(cache._plans) <= 2
    remembered = [ref() for _, ref in cache._plans.values()]
    assert len(remembered) == 2 and all(r in plans._plans.values() for r in remembered)
    assert [key[9][1][2] for key in cache._plans] == [2, 3]  # H = 1, the first kept, dropped
    key = next(iter(cache._plans))
    assert plans.kept(cache, key) is remembered[0]
    del remembered
    plans.clear()
    assert plans.kept(cache, key) is None
    # The plans and the cache object are freed at once (no cycle through the remembered ones)
    alive = weakref.ref(cache)
    del cache
    assert alive() is None


@KERNEL
def test_failed_rebind_leaves_no_mixed_arrays(rng):
    """A call on another cache object that fails while its arrays are being bound (here its
    lengths' device copy) does not leave the plan believing the first cache's arrays are
    bound: the next call on the first cache gives its own result again."""
    plans.clear()
    p1 = make_problem(rng, 1, 1, 1, [5], np.float32, "contiguous")
    p2 = make_problem(rng, 1, 1, 1, [5], np.float32, "contiguous")
    q, c1 = on_device(p1)
    _, c2 = on_device(p2)
    first = host(nm.mla_decode(q, c1, p1.scale, backend="simt"))

    def fail():
        raise RuntimeError("no memory for the lengths")

    c2.device_lengths = fail
    with pytest.raises(RuntimeError, match="no memory"):
        nm.mla_decode(q, c2, p1.scale, backend="simt")
    assert plans.size() == 1  # the same plan, its storage now c2's
    np.testing.assert_array_equal(host(nm.mla_decode(q, c1, p1.scale, backend="simt")), first)


@pytest.mark.gpu
def test_gpu_threads_share_the_plan_cache(rng):
    """Six threads, three configurations, four calls each, at once: every result right."""
    problems = [make_problem(rng, 2, 1, H, [300, 77], BF16, "paged", 64) for H in (16, 16, 8)]
    expected = [p.run(nm) for p in problems]
    start = threading.Barrier(6)

    def work(j):
        p = problems[j % 3]
        q, cache = on_device(p)
        start.wait()
        for _ in range(4):
            np.testing.assert_array_equal(host(nm.mla_decode(q, cache, p.scale)),
                                          expected[j % 3])
        return j

    with ThreadPoolExecutor(6) as ex:
        assert sorted(ex.map(work, range(6))) == list(range(6))


def test_import_selects_the_simulator_without_a_gpu():
    """No NUMBA_ENABLE_CUDASIM and no GPU: importing numba_mla picks the simulator silently,
    and the first kernel launch warns once (SimulatorWarning) that it runs there: the README's
    examples run on a laptop as written."""
    if _compat.gpu_present():
        pytest.skip("a GPU is present")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    code = ("import warnings; warnings.simplefilter('always')\n"
            "import numpy as np, numba_mla as nm, numba\n"
            "print(nm._compat.SIMULATOR, numba.config.ENABLE_CUDASIM, flush=True)\n"
            "import sys; print('imported', file=sys.stderr, flush=True)\n"
            "kv = np.ones((1, 3, 576), np.float32)\n"
            "cache = nm.ContiguousKVCache(kv, np.array([2], np.int32))\n"
            "for _ in range(2):\n"
            "    nm.mla_decode(np.ones((1, 1, 1, 576), np.float32), cache, 0.1, backend='simple')\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "1"]
    before, after = r.stderr.split("imported", 1)
    assert "SimulatorWarning" not in before
    assert after.count("SimulatorWarning: numba_mla: no usable CUDA GPU") == 1


def test_disk_cache_key_is_the_same_in_every_process():
    """The disk cache's key of a configuration (mods, dtype, cache kind, tiles) is the same in
    two processes (Numba's own key pickled the kernel's closure and never hit); kernels of a
    user's function are not cached on disk."""
    key = ("simt", "bf16", 16, 128, False, True) + factory._mods_key(
        nm.SlidingWindowCausalMask(128) & nm.CausalMask(), nm.AlibiScoreMod(128),
        nm.PagedKVCache)
    code = ("import numba_mla as nm; from numba_mla import factory, kernel_cache\n"
            "key = ('simt', 'bf16', 16, 128, False, True) + factory._mods_key("
            "nm.SlidingWindowCausalMask(128) & nm.CausalMask(), nm.AlibiScoreMod(128), "
            "nm.PagedKVCache)\n"
            "print(kernel_cache.digest(key))\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    digests = {subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=300, check=True).stdout.strip()
               for _ in range(2)}
    assert digests == {kernel_cache.digest(key)}
    assert kernel_cache._stable(key)
    user = factory._mods_key(nm.FunctionMask(lambda b, h, q, k: k < 3), nm.IdentityScoreMod(),
                             nm.PagedKVCache)
    assert not kernel_cache._stable(user)
