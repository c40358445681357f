"""The tensor-map prefetch (``ptx.prefetch_tensormap``): it runs on a real map and changes
nothing (on a GPU the map goes into the copy engine's cache; in the simulator its twin only
checks the argument), and the twin refuses what is not a map, as a GPU would fault on it."""
import numpy as np
import pytest

from numba_mla import ptx  # before numba.cuda: applies numba_mla's environment shims
from numba import cuda

from numba_mla._compat import SIMULATOR


@cuda.jit
def prefetch_then_copy(tmap, out):
    t = cuda.threadIdx.x
    if t == 0:
        ptx.prefetch_tensormap(tmap)
    cuda.syncthreads()
    out[t] = tmap[t]


@pytest.mark.kernel
def test_prefetch_tensormap_changes_nothing(rng):
    """A map of a [64, 576] bf16 array (boxes of 64 rows of 64 values, swizzled: the seesaw
    kernel's kind) prefetched by one thread, then read back byte by byte: as it was."""
    rows = cuda.to_device(rng.integers(-1000, 1000, (64, 288)).astype(np.int32))
    tmap = ptx.tensor_map(rows, 64, 64, 64, True)
    out = cuda.to_device(np.zeros(128, np.uint8))
    prefetch_then_copy[1, 128](tmap, out)
    assert np.array_equal(out.copy_to_host(), tmap.copy_to_host())


@pytest.mark.skipif(not SIMULATOR, reason="the twin's check: simulator only")
@pytest.mark.parametrize("arr", [np.zeros(128, np.int32), np.zeros(64, np.uint8),
                                 np.zeros((2, 128), np.uint8)])
def test_prefetch_tensormap_refuses_what_is_not_a_map_in_simulator(arr):
    @cuda.jit
    def prefetch(tmap):
        ptx.prefetch_tensormap(tmap)

    with pytest.raises(Exception, match="not a tensor map"):
        prefetch[1, 1](cuda.to_device(arr))
