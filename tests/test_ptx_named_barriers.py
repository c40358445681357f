"""``ptx.bar_arrive`` with ``ptx.bar_sync``: a producer warpgroup hands rounds of data to a
consumer warpgroup through one shared-memory buffer, "full" and "empty" signalled on two named
barriers, each producer arriving without waiting. Every round must reach the consumers whole
(the simulator's twin, and the hardware's barriers on a GPU)."""
import numpy as np
import pytest

from numba_mla import ptx  # before numba.cuda: applies numba_mla's environment shims
from numba import cuda, int32

ROUNDS = 4
FULL, EMPTY = 1, 2  # barrier ids (0 is the block's)


@cuda.jit
def handoff(src, out):
    # src [ROUNDS, 128]; out [ROUNDS, 128]: consumer t reads slot 127 - t (another warp's write)
    buf = cuda.shared.array(128, int32)
    tid = cuda.threadIdx.x
    for r in range(ROUNDS):
        if tid >= 128:  # the producers (warp-uniform branch, as bar.arrive requires)
            if r > 0:
                ptx.bar_sync(EMPTY, 256)  # the consumers are done with round r - 1
            buf[tid - 128] = src[r, tid - 128] * 3 + r
            ptx.bar_arrive(FULL, 256)  # round r is written; go on
        else:
            ptx.bar_sync(FULL, 256)
            out[r, tid] = buf[127 - tid]
            if r < ROUNDS - 1:
                ptx.bar_arrive(EMPTY, 256)


def run(rng):
    src = rng.integers(-1000, 1000, (ROUNDS, 128)).astype(np.int32)
    out = cuda.to_device(np.full((ROUNDS, 128), -(2**31), np.int32))
    handoff[1, 256](cuda.to_device(src), out)
    want = (src * 3 + np.arange(ROUNDS)[:, None])[:, ::-1]
    np.testing.assert_array_equal(out.copy_to_host(), want)


@pytest.mark.kernel
def test_producer_consumer_handoff(rng):
    run(rng)


@pytest.mark.gpu
def test_gpu_producer_consumer_handoff_draws(rng):
    for _ in range(200):
        run(rng)


def _probe_racecheck():
    """scripts/probe_racecheck.py, loaded as a module."""
    from helpers import script_module

    return script_module("probe_racecheck")


@pytest.mark.kernel
def test_probe_racecheck_kernel_hands_off_right():
    """scripts/probe_racecheck.py's kernel (the seesaw kernel's named-barrier pattern, then
    its epilogue's handoff across the block barrier) gives the values it should, so a hazard
    racecheck reports on it is racecheck's: 3 pairs."""
    assert _probe_racecheck().child(3) == 0


@pytest.mark.kernel
@pytest.mark.parametrize("kind", ["arrive", "sync", "ring", "ring_ahead", "ring_sync"])
def test_probe_racecheck_handoff_kernel_hands_off_right(kind):
    """scripts/probe_racecheck.py's one-way handoff (the split-role mma_sync kernel's: a store,
    ``bar.arrive``; ``bar.sync``, a load) gives the stored values, so a hazard racecheck
    reports on it is racecheck's."""
    assert _probe_racecheck().handoff_child(kind) == 0
