"""Choosing, at import time, between a GPU primitive and its plain-Python simulator twin.

In Numba's CUDA simulator ``@intrinsic`` code generation and the warp functions do not exist,
so each primitive has a twin with the same results written in Python, and the name is bound to
one of the two when the module is imported (``NUMBA_ENABLE_CUDASIM`` is read then too). The
twin is written just above its primitive:

    def _lds32_twin(arr, addr):
        ...

    @intrinsic_with_twin(_lds32_twin)
    def lds32(typingctx, arr, addr):
        ...

In the simulator the decorated definition is never turned into a GPU object.
"""
from numba import cuda
from numba.cuda.extending import intrinsic

from .._compat import SIMULATOR


def with_twin(twin, make=None):
    """Decorator: in the simulator ``twin``; on the GPU the decorated definition, passed
    through ``make`` when given (``intrinsic``, ``cuda.jit(device=True)``). Also serves
    factories: decorate the GPU factory with the twin factory."""

    def choose(gpu):
        if SIMULATOR:
            return twin
        return make(gpu) if make else gpu

    return choose


def intrinsic_with_twin(twin):
    """``@intrinsic`` on the GPU, ``twin`` in the simulator."""
    return with_twin(twin, intrinsic)


def device_with_twin(twin):
    """A Numba device function (``@cuda.jit(device=True)``) on the GPU, ``twin`` in the
    simulator."""
    return with_twin(twin, cuda.jit(device=True))


def no_op(*args):
    """The twin of an instruction with nothing to do in the simulator (a fence, a commit, a
    wait: there every memory access and copy takes effect when it is issued)."""
