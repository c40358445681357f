"""The simulator's block scheduler (numba_mla/_numba.py, last section): the rules of Numba's own
BlockManager, kept. Each launch runs in a thread joined with a timeout, so a barrier that
never opens fails the test instead of hanging it."""
import threading

import numpy as np
import pytest
from numba import cuda

from numba_mla import _numba
from numba_mla._compat import SIMULATOR

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
