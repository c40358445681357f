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
from .._numba import sim_scratch


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
    """The twin of an instruction with nothing to do in the simulator (a fence; a barrier's
    arrival where nothing waits)."""


class AsyncGroups:
    """(Simulator) One thread's asynchronous operations of one kind (``cp.async`` copies,
    wgmma products) in flight, as the GPU keeps them: those issued since the last commit
    (``open``), then the committed groups, oldest first. Each is a function that completes
    it (writes shared memory, or the product into the accumulators), or what the wait's
    ``complete`` completes; a wait of the thread completes the oldest groups' until at most
    ``pending`` groups remain. So nothing a kernel reads before the wait that completes an
    operation comes from it: a wait too few, or an operand overwritten before its product's
    wait, shows as a wrong result here. Outside the simulator's block scheduler an operation
    completes when issued."""

    __slots__ = ("open", "groups")

    def __init__(self):
        self.open, self.groups = [], []

    @staticmethod
    def _of_this_thread(kind):
        scratch = sim_scratch()
        if scratch is None:
            return None
        state = scratch.get(kind)
        if state is None:
            state = scratch[kind] = AsyncGroups()
        return state

    @staticmethod
    def issue(kind, op, complete=None):
        """``op`` in flight (completed now outside the scheduler: ``complete(op)``, or
        ``op()``)."""
        state = AsyncGroups._of_this_thread(kind)
        if state is not None:
            state.open.append(op)
        elif complete is None:
            op()
        else:
            complete(op)

    @staticmethod
    def commit(kind):
        state = AsyncGroups._of_this_thread(kind)
        if state is not None:
            state.groups.append(state.open)
            state.open = []

    @staticmethod
    def wait(kind, pending, complete=None):
        """Complete the thread's oldest groups until at most ``pending`` remain: each
        operation by ``complete(op)``, or ``op()``."""
        state = AsyncGroups._of_this_thread(kind)
        while state is not None and len(state.groups) > pending:
            for op in state.groups.pop(0):
                if complete is None:
                    op()
                else:
                    complete(op)
