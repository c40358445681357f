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
    """The twin of an instruction with nothing to do in the simulator (a fence; a barrier's
    arrival where nothing waits)."""


class AsyncGroups:
    """(Simulator) One thread's asynchronous operations of one kind (``cp.async`` copies,
    wgmma products) in flight, as the GPU keeps them: those issued since the last commit
    (``open``), then the committed groups, oldest first. Each is a function that completes
    it (writes shared memory, or the product into the accumulators); a wait of the thread
    runs the oldest groups' until at most ``pending`` groups remain. So what a kernel reads
    before the wait that completes an operation is what was there before: a wait too few,
    or an operand overwritten before its product's wait, shows as a wrong result here."""

    _threads = {}  # (threading.get_ident(), kind) -> this, for the block it was made in

    def __init__(self, block):
        self.block, self.open, self.groups = block, [], []

    @classmethod
    def of_this_thread(cls, kind):
        """The calling thread's, or None outside the simulator's block scheduler (where an
        operation completes when issued)."""
        import threading

        from .._numba import sim_block

        block = sim_block()
        if block is None:
            return None
        key = threading.get_ident(), kind
        state = cls._threads.get(key)
        if state is None or state.block is not block:  # (a new block starts with none)
            state = cls._threads[key] = cls(block)
        return state

    @classmethod
    def issue(cls, kind, complete):
        state = cls.of_this_thread(kind)
        if state is None:
            complete()
        else:
            state.open.append(complete)

    @classmethod
    def commit(cls, kind):
        state = cls.of_this_thread(kind)
        if state is not None:
            state.groups.append(state.open)
            state.open = []

    @classmethod
    def wait(cls, kind, pending):
        """Complete the thread's oldest groups until at most ``pending`` remain."""
        state = cls.of_this_thread(kind)
        while state is not None and len(state.groups) > pending:
            for complete in state.groups.pop(0):
                complete()
