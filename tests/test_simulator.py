"""The simulator's block scheduler (numba_mla/_numba.py, its last sections): the rules of Numba's
own BlockManager, kept; threads that take turns, and an error where a block cannot go on; its
direct calls of the package's device functions; its shared arrays, one a line even when
threads race to make it; and ``warp_once``, the twins' shared work.
Each launch runs in a thread joined with a timeout, so a barrier that never opens fails the
test instead of hanging it."""
import sys
import threading

import numpy as np
import pytest
from numba import cuda, float32, int32

from numba_mla import _numba, ptx
from numba_mla._compat import SIMULATOR
from numba_mla.ptx.accumulators import _acc_row
from numba_mla.ptx.warp import warp_once

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's scheduler: simulator only")

THREADS = 64


def launch(kernel, *args, blocks=2):
    """Run ``kernel[blocks, THREADS](*args)`` and return the exception it raised, if any."""
    raised = []

    def go():
        try:
            kernel[blocks, THREADS](*args)
        except Exception as e:  # noqa: BLE001  (handed to the test)
            raised.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), "the launch did not finish: a barrier never opened"
    return raised[0] if raised else None


def test_installed():
    assert _numba.BLOCK_SCHEDULER


@cuda.jit
def _rotate_twice(out, live):
    """Each thread below ``live`` writes its index, waits, reads its neighbour's, waits, and
    writes it; the others leave before the first barrier, which must open without them."""
    s = cuda.shared.array(THREADS, np.int32)
    t = cuda.threadIdx.x
    if t >= live:
        return
    s[t] = t + 100 * cuda.blockIdx.x
    cuda.syncthreads()
    v = s[(t + 1) % live]
    cuda.syncthreads()
    s[t] = v
    cuda.syncthreads()
    out[cuda.blockIdx.x, t] = s[(t + 1) % live]


@pytest.mark.parametrize("live", [THREADS, 40, 1])
def test_barriers_open_when_every_running_thread_waits(live):
    out = np.full((2, THREADS), -1, np.int32)
    assert launch(_rotate_twice, out, live) is None
    t = np.arange(live)
    for b in range(2):
        np.testing.assert_array_equal(out[b, :live], (t + 2) % live + 100 * b)
        assert (out[b, live:] == -1).all()


@cuda.jit
def _count(out):
    t = cuda.threadIdx.x
    out[cuda.blockIdx.x, t] = cuda.syncthreads_count(t % 3 == 0)
    out[cuda.blockIdx.x, t] += 1000 * cuda.syncthreads_or(t == THREADS - 1)


def test_syncthreads_count_and_or():
    out = np.zeros((2, THREADS), np.int32)
    assert launch(_count, out) is None
    assert (out == len(range(0, THREADS, 3)) + 1000).all()


@cuda.jit
def _fail(out, bad):
    t = cuda.threadIdx.x
    out[t] = 1
    cuda.syncthreads()
    if t == bad:
        out[THREADS + 5] = 2  # out of range: an IndexError in that thread only
    cuda.syncthreads()
    out[t] = 3


def test_a_thread_error_is_raised_with_its_indices():
    error = launch(_fail, np.zeros(THREADS, np.int32), 17, blocks=1)
    assert isinstance(error, IndexError)
    assert "tid=[17, 0, 0]" in str(error) and "ctaid=[0, 0, 0]" in str(error)


@cuda.jit
def _four_arrays(out):
    """Four shared arrays, each written by every thread and read by its neighbour: a thread
    that made an array of its own reads what nobody wrote there."""
    a = cuda.shared.array(128, float32)
    b = cuda.shared.array(128, np.float32)
    c = cuda.shared.array((2, 64), int32)
    d = cuda.shared.array(128, float32)
    t = cuda.threadIdx.x
    a[t], b[t], c[t // 64, t % 64], d[t] = t, 2 * t, 3 * t, 4 * t
    cuda.syncthreads()
    n = (t + 1) % 128
    out[cuda.blockIdx.x, t] = a[n] + b[n] + c[n // 64, n % 64] + d[n]


def test_shared_arrays_are_made_once_when_threads_race():
    """The guard (_numba._guard_shared_arrays) under a switch interval of a microsecond, which
    makes the interpreter change threads between Numba's own look-up and store: without the
    guard, about one launch in twenty of one array went wrong here."""
    assert _numba.SHARED_ARRAYS_GUARDED
    want = 10 * ((np.arange(128) + 1) % 128)
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(12):
            out = np.full((2, 128), -1, np.float32)
            _four_arrays[2, 128](out)
            np.testing.assert_array_equal(out, np.stack([want, want]))
    finally:
        sys.setswitchinterval(before)


@cuda.jit
def _rows_of(out):
    """Each thread's accumulator rows from a device function of the package (ptx.acc_row)."""
    t = cuda.threadIdx.x
    for i in range(4):
        out[t, i] = ptx.acc_row(2 * i, t)


def _package_modules_hold_numba_cuda():
    import numba
    return all(vars(m)["cuda"] is numba.cuda for name, m in list(sys.modules.items())
               if m is not None and name.startswith("numba_mla") and "cuda" in vars(m))


def test_package_device_functions_are_called_directly(monkeypatch):
    """Inside a block the package's modules stay swapped to the simulator's fake numba.cuda,
    and its device functions are called without Numba's swap on every call: the swap is
    entered for the launch only, not for each of the 64 x 4 calls; afterwards every module
    of the package names numba.cuda again."""
    from numba.cuda.simulator import kernel as sim

    entered = []
    original = sim.swapped_cuda_module

    def spy(fn, fake):
        entered.append(fn)
        return original(fn, fake)

    monkeypatch.setattr(sim, "swapped_cuda_module", spy)
    out = np.full((THREADS, 4), -1, np.int32)
    assert launch(_rows_of, out, blocks=1) is None
    t, i = np.arange(THREADS)[:, None], np.arange(4)[None, :]
    np.testing.assert_array_equal(out, _acc_row(2 * i, t))  # (the device function's body)
    assert len(entered) == 1  # the launch's own (the kernel's module)
    assert _package_modules_hold_numba_cuda() and not _numba._held


@cuda.jit
def _fails_in_one_thread(out):
    t = cuda.threadIdx.x
    out[t] = ptx.acc_row(0, t)
    cuda.syncthreads()
    if t == 5:
        out[10 ** 6] = 1  # out of bounds: an IndexError in the simulator


def test_package_modules_restored_after_a_failed_block():
    out = np.zeros(THREADS, np.int32)
    error = launch(_fails_in_one_thread, out, blocks=2)
    assert isinstance(error, IndexError) and "tid=[5, 0, 0]" in str(error)
    assert _package_modules_hold_numba_cuda() and not _numba._held


@cuda.jit
def _unguarded_count(out, rounds):
    """Every thread adds 1 to a shared counter ``rounds`` times, unguarded (load, then store):
    threads that run at once lose each other's additions; threads that take turns do not."""
    s = cuda.shared.array(1, int32)
    t = cuda.threadIdx.x
    if t == 0:
        s[0] = 0
    cuda.syncthreads()
    for _ in range(rounds):
        v = s[0]
        out[t] = v  # (something between the load and the store)
        s[0] = v + 1
    cuda.syncthreads()
    out[t] = s[0]


def test_threads_take_turns_between_waits():
    """One thread runs at a time, from one wait to the next, even with the interpreter asked
    to change threads every microsecond: the count comes out exact in every run. (Numba's own
    scheduler, its threads running at once, lost 45-82% of the additions in three runs here:
    ``NUMBA_MLA_SIM_SCHEDULER=0``.)"""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(3):
            out = np.zeros(THREADS, np.int32)
            assert launch(_unguarded_count, out, 200, blocks=1) is None
            assert (out == THREADS * 200).all()
    finally:
        sys.setswitchinterval(before)


@cuda.jit
def _lane_gone(out):
    t = cuda.threadIdx.x
    if t == 37:
        return  # a lane of warp 1 leaves; its warp's shuffle then waits for it for ever
    out[t] = ptx.shfl_xor(float32(t), 1, t)


def test_a_block_that_cannot_go_on_is_an_error():
    """Where every running thread waits and none can go on, the launch raises an error that
    says where they wait (Numba's scheduler hangs)."""
    out = np.zeros(THREADS, np.float32)
    error = launch(_lane_gone, out, blocks=1)
    assert isinstance(error, RuntimeError), error
    assert "cannot go on" in str(error) and "31 at a warp exchange of warp 1" in str(error)
    # the next launch starts afresh
    assert launch(_rotate_twice, np.zeros((2, THREADS), np.int32), THREADS) is None


@cuda.jit
def _arrival_order(out, counter):
    """Each thread takes a ticket on arrival, then again after a barrier (shared counter:
    one thread runs at a time)."""
    t = cuda.threadIdx.x
    out[0, t] = counter[0]
    counter[0] += 1
    cuda.syncthreads()
    out[1, t] = counter[0]
    counter[0] += 1


@pytest.mark.parametrize("order", ["fifo", "low", "high", "warps:3"])
def test_turn_orders(order):
    """``sim_turn_order``: in the default order the threads run as they became ready (thread
    index order, at the start and after a barrier that opens for all), with "low" the lowest
    index that is ready always first, with "high" the highest, with "warps:SEED" the warps
    in the order SEED draws (here warp 1 first), each warp's lanes in index order; the order
    before comes back after. Anything else is refused."""
    out, counter = np.zeros((2, THREADS), np.int64), np.zeros(1, np.int64)
    before = list(_numba._turn_order)
    with _numba.sim_turn_order(order):
        assert launch(_arrival_order, out, counter, blocks=1) is None
    ranks = np.arange(THREADS)
    want = {"high": ranks[::-1], "warps:3": np.roll(ranks, 32)}.get(order, ranks)
    assert (out[0] == want).all()
    # after the barrier: the last thread to arrive opens it and runs on, then the others in
    # the order (which for these is the order they parked in)
    assert out[1, want[-1]] == THREADS
    assert (out[1, want[:-1]] == THREADS + 1 + ranks[:-1]).all()
    assert _numba._turn_order == before
    with pytest.raises(ValueError, match="turn order 'lowest'"):
        with _numba.sim_turn_order("lowest"):
            pass


@cuda.jit
def _arrive_before_wait(data, out):
    """Warp 1 starts an asynchronous read of data[0] (completed at its wait, as a wgmma
    product reads its operands), arrives at named barrier 1 and only then waits for the read:
    the arrival a missing wait makes. Warp 0 waits at the barrier and then overwrites
    data[0]."""
    from numba_mla.ptx._twin import AsyncGroups

    t = cuda.threadIdx.x
    if t >= 32:
        AsyncGroups.issue("wgmma", lambda: out.__setitem__(t, data[0]))
        AsyncGroups.commit("wgmma")
        ptx.bar_arrive(1, THREADS)
        AsyncGroups.wait("wgmma", 0)
    else:
        ptx.bar_sync(1, THREADS)
        if t == 0:
            data[0] = 99


@pytest.mark.parametrize("order", ["fifo", "high", "fifo+late", "low+late", "warps:3+late"])
def test_late_arrivals_show_an_arrival_before_a_wait(order):
    """With "+late" a thread that arrives at a barrier without waiting goes on only once no
    other thread can: the waiters it let go run first, so a kernel that arrives before its
    own asynchronous read is done (here warp 1) gets its operand overwritten (every lane of
    warp 1 reads 99). Without it the arriving warp runs on to its wait first and the race
    does not show (every lane reads 7)."""
    data, out = np.full(1, 7, np.int64), np.zeros(THREADS, np.int64)
    with _numba.sim_turn_order(order):
        assert launch(_arrive_before_wait, data, out, blocks=1) is None
    assert data[0] == 99
    assert (out[32:] == (99 if order.endswith("+late") else 7)).all(), out[32:]
    with pytest.raises(ValueError, match="turn order 'lowest\\+late'"):
        with _numba.sim_turn_order("lowest+late"):
            pass


_calls = []  # the lane counts _sum_once was called with


def _sum_once(values):
    _calls.append(len(values))
    return sum(values)


@cuda.jit
def _warp_sums(out):
    t = cuda.threadIdx.x
    for k in range(3):
        out[k, t] = warp_once(t * (k + 1), _sum_once, t)


@pytest.mark.parametrize("scheduler", ["block", "plain threads"])
def test_warp_once_computes_once_a_warp(scheduler):
    """``warp_once`` (the twins' shared work: an mma's product, an ldmatrix's words) runs its
    function once per warp and exchange, with every lane's value, and gives each lane the
    result: in a simulated block, and from plain Python threads (its fallback)."""
    out = np.zeros((3, THREADS), np.int64)
    _calls.clear()
    if scheduler == "block":
        assert launch(_warp_sums, out, blocks=1) is None
    else:
        def lane(t):
            for k in range(3):
                out[k, t] = warp_once(t * (k + 1), _sum_once, t)

        threads = [threading.Thread(target=lane, args=(t,)) for t in range(THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
    want = np.repeat([[sum(range(w * 32, w * 32 + 32))] for w in range(THREADS // 32)], 32,
                     axis=1).ravel()
    for k in range(3):
        np.testing.assert_array_equal(out[k], want * (k + 1))
    assert _calls == [32] * (3 * THREADS // 32)


_thread_of = {}  # (block, thread index) -> the Python thread that ran it


@cuda.jit
def _note_threads(out):
    t = cuda.threadIdx.x
    _thread_of[cuda.blockIdx.x, t] = threading.current_thread()
    cuda.syncthreads()
    out[cuda.blockIdx.x, t] = t


def test_threads_kept_for_the_next_blocks():
    """A block shape's Python threads are made once and run the next blocks and launches too;
    after a block fails they end, and the next launch makes new ones."""
    _thread_of.clear()
    out = np.zeros((3, THREADS), np.int32)
    assert launch(_note_threads, out, blocks=3) is None
    first = [_thread_of[0, t] for t in range(THREADS)]
    assert len(set(map(id, first))) == THREADS
    assert all(_thread_of[b, t] is first[t] for b in range(3) for t in range(THREADS))
    assert launch(_note_threads, out, blocks=1) is None and _thread_of[0, 7] is first[7]
    assert isinstance(launch(_fail, np.zeros(THREADS, np.int32), 3, blocks=1), IndexError)
    for th in first:
        th.join(timeout=10)
        assert not th.is_alive()
    assert launch(_note_threads, out, blocks=1) is None
    assert _thread_of[0, 7] is not first[7] and (out[0] == np.arange(THREADS)).all()


class _TwoArgs(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a} {b}")


@cuda.jit
def _raises_two_args(out):
    t = cuda.threadIdx.x
    out[t] = t
    cuda.syncthreads()
    if t == 9:
        raise _TwoArgs("two", "args")


def test_an_error_whose_class_takes_other_arguments():
    """An exception that cannot be remade from one message still aborts the block, as a
    RuntimeError with the indices and the original as its cause; the next launch runs."""
    error = launch(_raises_two_args, np.zeros(THREADS, np.int32), blocks=1)
    assert isinstance(error, RuntimeError) and "tid=[9, 0, 0]" in str(error)
    assert isinstance(error.__cause__, _TwoArgs)
    assert launch(_rotate_twice, np.zeros((2, THREADS), np.int32), THREADS) is None


def _fails(values):
    raise ValueError("bad lanes")


@pytest.mark.parametrize("scheduler", ["block", "plain threads"])
def test_an_error_in_warp_once_is_raised_and_the_warp_goes_on(scheduler):
    """An error in ``warp_once``'s function is raised in the lanes; from plain threads (whose
    warp barrier is a threading.Barrier) the warp's next exchange still works."""
    if scheduler == "block":
        @cuda.jit
        def bad(out):
            t = cuda.threadIdx.x
            out[t] = warp_once(t, _fails, t)

        error = launch(bad, np.zeros(THREADS, np.int64), blocks=1)
        assert isinstance(error, ValueError) and "bad lanes" in str(error)
        return
    raised, got = [], {}

    def lane(t):
        try:
            warp_once(t, _fails, t)
        except ValueError:
            raised.append(t)
        got[t] = warp_once(t, sum, t)

    threads = [threading.Thread(target=lane, args=(t,)) for t in range(32)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert sorted(raised) == list(range(32)) and set(got.values()) == {sum(range(32))}


def test_copy_lands_at_its_wait():
    """The bulk tensor copy's twin (ptx.tma_load): from its issue its box reads as IN_FLIGHT
    (NaN as any float type), and nothing is counted off its mbarrier; the first
    test of that mbarrier lands the box and completes the phase. A test of another mbarrier
    lands nothing of it."""
    from numba_mla.ptx import barriers, shared, tma

    load = tma._tma_load_twin(8, 8)  # 8 rows of 8 16-bit values: 8 x 4 words
    smem = np.zeros(80, np.int32)
    src = np.arange(1, 1 + 2 * 8 * 4, dtype=np.int32).reshape(1, 16, 4)
    for bar in (0, 8):
        barriers._mbar_init_twin(smem, bar, 1)
        barriers._mbar_expect_tx_twin(smem, bar, 128)
    load(smem, 16, None, src, 0, 0, 0)  # rows 0-7 to bytes 16.., on the mbarrier at 0
    load(smem, 144, None, src, 0, 8, 8)  # rows 8-15 to bytes 144.., on the one at 8
    assert (smem[4:68] == shared.IN_FLIGHT).all() and smem[0] == smem[2] == 0
    assert barriers._mbar_try_wait_twin(smem, 8, 0)  # (the second copy lands)
    np.testing.assert_array_equal(smem[36:68], src[0, 8:].ravel())
    assert (smem[4:36] == shared.IN_FLIGHT).all() and smem[0] == 0
    assert barriers._mbar_try_wait_twin(smem, 0, 0)
    np.testing.assert_array_equal(smem[4:36], src[0, :8].ravel())
    assert smem[0] == 1 and smem[1] == 0
