"""Barriers beyond the block's ``syncthreads``: named barriers, and mbarriers (shared-memory
barriers that count bytes, on which TMA copies complete; see tma.py).

Named barriers
- ``bar_sync(barrier_id, nthreads)``: named barrier ``barrier_id`` (1..15; 0 is the block's)
  for the ``nthreads`` threads (whole warps) that use it, e.g. one warpgroup.
  ``bar_arrive(barrier_id, nthreads)`` counts the calling warp's arrival without waiting: a
  producer signals "written" (its shared-memory writes before it are seen by the threads
  that ``bar_sync`` on the same barrier), and moves on; the waiters' ``bar_sync`` counts too.

mbarriers (8 bytes of shared memory at the byte offset ``bar`` of the shared array ``arr``)
- ``mbar_init(arr, bar, count)``, then ``mbar_fence_init()`` and a block barrier;
- ``mbar_expect_tx(arr, bar, nbytes)``: arrive, announcing nbytes of copies that will
  complete on this barrier; the phase completes when both the arrivals and the bytes are in;
- ``mbar_try_wait(arr, bar, parity)``: True once the phase of that parity completed.
Registers (sm_90a)
- ``set_max_registers(n, grow)``: a function that moves this warpgroup's registers to ``n`` a
  thread (a multiple of 8 in 24..256; ``setmaxnreg.inc`` where ``grow``, else ``.dec``), all
  four warps together: a warpgroup that needs few gives them to those that need many. ptxas
  keeps it only when it compiles the kernel as a whole program (the driver's JIT, launch.py's
  ``whole_program`` path); Numba's nvJitLink link drops it. A no-op in the simulator.
Grids (sm_90: programmatic dependent launch)
- ``grid_dependency_wait()``: in a kernel launched with programmatic stream serialization
  (launch.py), wait until the grid it follows in the stream has completed and its memory
  writes are visible; nothing to wait for in a kernel launched plainly. The simulator runs
  kernels one after the other: a no-op there.

In the simulator an mbarrier keeps [phases completed, bytes still expected] in its own 8 bytes
and a copy counts its bytes off when it lands (``complete_tx``): a waiter waits until the
issuing lane has copied, as on the GPU (under the simulator's block scheduler it gives up its
turn until the phase completes; from plain threads it sleeps on a condition). A copy by the
copy engine (``tma_load``) lands only when a thread first tests its mbarrier
(``land_later``); until then its destination reads as NaN. A thread's arrival without a wait
(``bar_arrive``; ``mbar_expect_tx`` where it completes the phase) tells the block scheduler
(``_numba.sim_arrived``), which under a "+late" turn order runs every other thread that can
run first (those it let go among them).
"""
import threading

from llvmlite import ir
from numba.cuda import types
from numba.cuda.extending import intrinsic

from .._compat import SIMULATOR
from .._numba import SimCondition, sim_arrived, sim_block
from ._codegen import addr32, i32, void_asm
from ._twin import intrinsic_with_twin, no_op

# -- named barriers ----------------------------------------------------------------------------


class _Named:
    """(Simulator) A named barrier: ``nthreads`` arrivals complete a phase; ``sync`` arrives
    and waits for its phase to complete, ``arrive`` only counts."""

    def __init__(self, nthreads):
        self.n, self.count, self.phase = nthreads, 0, 0
        self.cv = SimCondition("a named barrier")

    def _arrive(self):
        self.count += 1
        if self.count == self.n:
            self.count, self.phase = 0, self.phase + 1
            self.cv.notify_all()

    def arrive(self):
        with self.cv:
            self._arrive()
        sim_arrived()  # (a "+late" turn order: the threads let go run first)

    def sync(self):
        with self.cv:
            phase = self.phase
            self._arrive()
            self.cv.wait_for(lambda: self.phase != phase)


_named = {}
_named_lock = threading.Lock()


def _named_barrier(barrier_id, nthreads):
    with _named_lock:  # (the simulator runs one block at a time)
        block = sim_block()  # (a new block starts afresh: nothing of a failed one is left)
        key = barrier_id, nthreads, block
        if key not in _named:
            for gone in [k for k in _named if k[2] is not block]:
                del _named[gone]
            _named[key] = _Named(nthreads)
        return _named[key]


def _barrier_twin(method):
    def barrier(barrier_id, nthreads):
        getattr(_named_barrier(barrier_id, nthreads), method)()

    return barrier


def _barrier(text):
    @intrinsic
    def barrier(typingctx, barrier_id, nthreads):
        def cg(ctx, b, sig, args):
            ids = [addr32(ctx, b, v, t) for v, t in zip(args, sig.args)]
            b.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i32]),
                                text, "r,r,~{memory}", side_effect=True), ids)
            return ctx.get_dummy_value()

        return types.void(barrier_id, nthreads), cg

    return barrier


bar_sync = _barrier_twin("sync") if SIMULATOR else _barrier("bar.sync $0, $1;")
bar_arrive = _barrier_twin("arrive") if SIMULATOR else _barrier("bar.arrive $0, $1;")

# -- mbarriers ---------------------------------------------------------------------------------

# (Simulator) A condition keeps the lanes' updates of an mbarrier whole and wakes the waiters
# when a phase completes.
_mbar_cond = SimCondition("an mbarrier")


def complete_tx(arr, bar, nbytes):
    """(Simulator) ``nbytes`` of copies done (negative: announced) on the mbarrier at ``bar``;
    the phase completes when none is still expected."""
    with _mbar_cond:
        arr[bar // 4 + 1] -= nbytes
        if arr[bar // 4 + 1] == 0:
            arr[bar // 4] += 1
            _mbar_cond.notify_all()


_landings = {}  # (block, shared array's address, mbarrier) -> copies that have not landed


def _landing_key(arr, bar):
    import numpy as np

    return sim_block(), np.asarray(arr).__array_interface__["data"][0], int(bar)


def land_later(arr, bar, land):
    """(Simulator) A copy issued on the mbarrier at ``bar``: its destination reads as
    ``shared.IN_FLIGHT`` (the caller wrote it) until a thread first tests that mbarrier (or
    is waiting on it already), when ``land()``
    writes the data and counts its bytes off (``complete_tx``). So a thread that reads the
    destination between the copy's issue and its wait, as no kernel may, reads NaN, as the GPU
    could give it anything there."""
    key = _landing_key(arr, bar)
    with _mbar_cond:
        for gone in [k for k in _landings if k[0] is not key[0]]:
            del _landings[gone]  # (a block that has finished, or failed)
        _landings.setdefault(key, []).append(land)
        _mbar_cond.notify_all()  # (a thread already waiting on it tests it again)


def _land(arr, bar):
    """(Simulator; ``_mbar_cond`` held) Land the copies issued on the mbarrier at ``bar``."""
    for land in _landings.pop(_landing_key(arr, bar), []):
        land()


def _mbar_init_twin(arr, bar, count):
    assert count == 1, "the twin models one arrival per phase"
    arr[bar // 4] = 0
    arr[bar // 4 + 1] = 0


def _mbar_expect_tx_twin(arr, bar, nbytes):
    phase = arr[bar // 4]
    complete_tx(arr, bar, -nbytes)
    if arr[bar // 4] != phase:  # (no bytes announced: this arrival lets the waiters go, and
        sim_arrived()  # under a "+late" turn order they run first)


def _mbar_op(text):
    """An mbarrier instruction on (shared address ``bar``, 32-bit ``value``)."""

    @intrinsic
    def op(typingctx, arr, bar, value):
        sig = types.void(arr, bar, value)

        def cg(ctx, b, s, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i32]), text,
                               "r,r,~{memory}", side_effect=True)
            b.call(asm, [addr32(ctx, b, args[1], s.args[1]),
                         addr32(ctx, b, args[2], s.args[2])])
            return ctx.get_dummy_value()

        return sig, cg

    return op


mbar_init = (_mbar_init_twin if SIMULATOR
             else _mbar_op("mbarrier.init.shared::cta.b64 [$0], $1;"))
mbar_expect_tx = (_mbar_expect_tx_twin if SIMULATOR
                  else _mbar_op("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;"))
mbar_fence_init = no_op if SIMULATOR else void_asm("fence.mbarrier_init.release.cluster;")

# -- registers ---------------------------------------------------------------------------------


def set_max_registers(n, grow):
    """The ``setmaxnreg`` instruction for ``n`` registers a thread (``grow``: .inc, else .dec)."""
    assert n % 8 == 0 and 24 <= n <= 256, n
    if SIMULATOR:
        return no_op
    return void_asm(f"setmaxnreg.{'inc' if grow else 'dec'}.sync.aligned.u32 {n};")


# -- grids ---------------------------------------------------------------------------------------
grid_dependency_wait = no_op if SIMULATOR else void_asm("griddepcontrol.wait;")


def _mbar_try_wait_twin(arr, bar, parity):
    # Like the instruction, waits a while for the phase and then says whether it completed:
    # under the block scheduler the lane gives up its turn until the phase completes (then
    # True), from plain threads it sleeps up to a second (so the copying lanes run).
    def done():
        _land(arr, bar)  # (the copies issued on it land now, if they have not)
        return arr[bar // 4] % 2 != parity

    with _mbar_cond:
        return _mbar_cond.wait_for(done, timeout=1.0)


@intrinsic_with_twin(_mbar_try_wait_twin)
def mbar_try_wait(typingctx, arr, bar, parity):
    sig = types.boolean(arr, bar, parity)

    def cg(ctx, b, s, args):
        asm = ir.InlineAsm(
            ir.FunctionType(i32, [i32, i32]),
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; "
            "selp.b32 $0, 1, 0, p; }", "=r,r,r,~{memory}", side_effect=True)
        r = b.call(asm, [addr32(ctx, b, args[1], s.args[1]),
                         addr32(ctx, b, args[2], s.args[2])])
        return b.icmp_unsigned("!=", r, ir.Constant(i32, 0))

    return sig, cg
