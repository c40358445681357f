"""The one module that touches private internals: Numba's (and one of torch's).

It checks the installed numba / numba-cuda version on import and raises a clear ImportError
naming the supported range. Everything else in the package uses Numba's public API
(``numba.cuda``, ``numba.cuda.types``, ``numba.cuda.extending.intrinsic``) and takes what lies
beyond it from here, so that a numba-cuda release that moves an internal breaks one file, in
one visible place.

Sections: the version check; the code-generation helpers of ``numba_mla.ptx``; the thin
launch path of launch.py (one ``cuLaunchKernel`` over parameters packed once, shared memory
above 48 KB: numba-cuda#94, a stream object for a raw handle, torch's raw stream query); the
disk cache of compiled kernels (kernel_cache.py); in the simulator, a block scheduler that
calls the package's device functions directly, and shared arrays safe for threads.
"""
import contextlib
import os
import re
import sys
from importlib import metadata
from threading import get_ident as _get_ident

from . import _compat  # noqa: F401  (must run before numba.cuda is imported)

# ---------------------------------------------------------------------------------------------
# Version check
# ---------------------------------------------------------------------------------------------
#: The oldest numba-cuda release known to work: 0.30 is the one proven so far (0.30.4, on the
#: H200 and in the simulator). The packaging work will establish the true lower bound; raise or
#: lower this constant with it.
MIN_NUMBA_CUDA = (0, 30)


def _release(version):
    """(major, minor) of a version string such as "0.30.4" or "0.31.0rc1"."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _check_versions():
    need = ".".join(map(str, MIN_NUMBA_CUDA))
    try:
        found = metadata.version("numba-cuda")
    except metadata.PackageNotFoundError:
        raise ImportError(f"numba_mla needs numba-cuda >= {need} (pip install numba-cuda); "
                          "it is not installed (Numba's own numba.cuda is not supported)") from None
    if _release(found) < MIN_NUMBA_CUDA:
        raise ImportError(f"numba_mla needs numba-cuda >= {need}; found numba-cuda {found} "
                          f'(pip install -U "numba-cuda>={need}")')


_check_versions()

# ---------------------------------------------------------------------------------------------
# numba_mla.ptx: code generation inside @intrinsic
# ---------------------------------------------------------------------------------------------
# An @intrinsic's codegen receives Numba's lowering context and an llvmlite builder. The
# context's cast / make_tuple / get_dummy_value are the vocabulary Numba's intrinsic examples
# use; what follows reaches further: into the array data model (the struct behind an array
# argument) and the typing errors. Tested with numba-cuda 0.30.
from numba.cuda import cgutils  # noqa: E402
from numba.cuda.core.errors import TypingError  # noqa: E402, F401  (re-exported)
from numba.cuda import types  # noqa: E402


def array_data(ctx, builder, aryty, ary):
    """The pointer to element 0 of the array value ``ary`` of Numba type ``aryty``."""
    return ctx.make_array(aryty)(ctx, builder, value=ary).data


def element_pointers(ctx, builder, aryty, ary, n, start=0):
    """Pointers to elements start..start+n-1 of a 1-D array (constant offsets: an array
    indexed only so stays in registers)."""
    data = array_data(ctx, builder, aryty, ary)
    return [cgutils.gep(builder, data, start + i) for i in range(n)]


def item_pointer(ctx, builder, aryty, ary, idx_vals, idx_types):
    """The pointer to ``ary[idx...]`` (indices as LLVM values of Numba types ``idx_types``),
    with Numba's own index arithmetic (strides, no bounds check)."""
    arr = ctx.make_array(aryty)(ctx, builder, value=ary)
    inds = [ctx.cast(builder, v, t, types.intp) for v, t in zip(idx_vals, idx_types)]
    return cgutils.get_item_pointer(ctx, builder, aryty, arr, inds)


# ---------------------------------------------------------------------------------------------
# Launching (launch.py)
# ---------------------------------------------------------------------------------------------
def prepare_arg(kernel, ty, val, writebacks, values):
    """Numba's conversion of one kernel argument into the values its launch passes (appended
    to ``values``): what ``kernel.launch`` redoes on every call."""
    kernel._prepare_args(ty, val, 0, writebacks, values)


def cufunc(kernel):
    """The compiled kernel's function handle, its module loaded into the current context."""
    return kernel._codelibrary.get_cufunc()


def allow_dynamic_smem(fn, nbytes):
    """Let ``fn`` take ``nbytes`` of dynamic shared memory (needed above 48 KB)."""
    from cuda.bindings import driver as binding
    from numba.cuda.cudadrv.driver import driver

    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, nbytes, fn.handle, fn.device.id)


def jit_load(ptx):
    """``ptx`` compiled by the driver's JIT and loaded into the current context as a module:
    (the driver's result, the module, the JIT's info log, its error log)."""
    from cuda.bindings import driver as binding

    size = 1 << 14
    info, error = bytearray(size), bytearray(size)
    o = binding.CUjit_option
    opts = [o.CU_JIT_INFO_LOG_BUFFER, o.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            o.CU_JIT_ERROR_LOG_BUFFER, o.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, o.CU_JIT_LOG_VERBOSE]
    err, module = binding.cuModuleLoadDataEx(ptx.encode() + b"\0", len(opts), opts,
                                             [info, size, error, size, 1])
    info, error = (b.split(b"\0", 1)[0].decode(errors="replace") for b in (info, error))
    return err, module, info, error


class WholeProgramError(RuntimeError):
    """The driver's JIT could not build or load a whole-program kernel."""


class WholeProgram:
    """A compiled kernel's PTX built again by the driver's JIT, as a whole program, into a
    module of its own, loaded in the current context: ptxas then keeps ``setmaxnreg``, which
    Numba's link (nvJitLink, the PTX as one unit of a link) drops ("C7504: 'setmaxnreg'
    ignored to maintain compatibility across compilation units"). ``handle``: the
    CUfunction; ``regs`` and ``local_bytes`` (spills) as ptxas allocated them; ``log``: the
    JIT's info log."""

    def __init__(self, kernel):
        from cuda.bindings import driver as binding

        err, self.module, self.log, error = jit_load(kernel._codelibrary.get_asm_str())
        if err != binding.CUresult.CUDA_SUCCESS:
            raise WholeProgramError(f"the driver's JIT could not build {kernel.entry_name}: "
                                    f"{err}\n{error}")
        err, self.handle = binding.cuModuleGetFunction(self.module, kernel.entry_name.encode())
        if err != binding.CUresult.CUDA_SUCCESS:
            raise WholeProgramError(f"cuModuleGetFunction({kernel.entry_name}): {err}")
        a = binding.CUfunction_attribute
        self.regs = binding.cuFuncGetAttribute(a.CU_FUNC_ATTRIBUTE_NUM_REGS, self.handle)[1]
        self.local_bytes = binding.cuFuncGetAttribute(a.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                                                      self.handle)[1]
        self.smem = 0  # the dynamic shared memory it may take, once raised past 48 KB

    def allow_dynamic_smem(self, nbytes):
        from cuda.bindings import driver as binding

        attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        err, = binding.cuFuncSetAttribute(self.handle, attr, nbytes)
        if err != binding.CUresult.CUDA_SUCCESS:
            raise WholeProgramError(f"cuFuncSetAttribute(max dynamic shared memory {nbytes}): "
                                    f"{err}")
        self.smem = nbytes


def whole_program_function(kernel):
    """``kernel``'s ``WholeProgram`` in the current context, built once a context."""
    from cuda.bindings import driver as binding

    err, ctx = binding.cuCtxGetCurrent()
    built = kernel.__dict__.setdefault("_numba_mla_whole", {})
    key = int(ctx)
    if key not in built:
        built[key] = WholeProgram(kernel)
    return built[key]


def needs_numba_launch(kernel):
    """Kernels whose launch does extra work (debug error readback, cooperative launch)."""
    return bool(kernel.debug or kernel.cooperative)


def stream_from_handle(handle):
    """A stream object Numba's ``kernel.launch`` takes, for a raw CUDA stream handle."""
    from numba.cuda.cudadrv.driver import ExperimentalStream

    return ExperimentalStream.from_handle(handle)


def torch_raw_stream_query(device_index):
    """torch's raw current-stream query for a device (what torch.compile's generated code
    calls: no torch.cuda.Stream object a call), or None where this torch lacks it."""
    import functools

    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return None if raw is None else functools.partial(raw, device_index)


# ---------------------------------------------------------------------------------------------
# The disk cache of compiled kernels (kernel_cache.py)
# ---------------------------------------------------------------------------------------------
def attach_disk_cache(dispatcher, cache_dir, digest):
    """Give a kernel dispatcher Numba's disk cache, with its index and key made from ``digest``
    (a stable hash of the kernel's configuration and sources) instead of Numba's pickle of the
    closure (which holds objects whose identity differs in every process, so it never hit).
    One index file per configuration, in ``cache_dir``; Numba writes files atomically."""
    from numba.cuda.core.caching import _CacheLocator
    from numba.cuda.dispatcher import CUDACache, CUDACacheImpl

    class Locator(_CacheLocator):
        def __init__(self, py_func, py_file):
            pass

        def get_cache_path(self):
            return cache_dir

        def get_source_stamp(self):
            return digest

        def get_disambiguator(self):
            return digest[:20]

        @classmethod
        def from_function(cls, py_func, py_file):
            return cls(py_func, py_file)

    class Impl(CUDACacheImpl):
        _locator_classes = [Locator]

    class StableCache(CUDACache):
        _impl_class = Impl

        def _index_key(self, sig, codegen):
            return (sig, codegen.magic_tuple(), digest)

    dispatcher._cache = StableCache(dispatcher.py_func)
    return dispatcher


# ---------------------------------------------------------------------------------------------
# The simulator's block scheduler
# ---------------------------------------------------------------------------------------------
# Numba's CUDA simulator runs a block as one Python thread per CUDA thread, all at once under
# the interpreter's lock, and finds out that every live thread reached ``syncthreads`` by
# polling them all in a loop that never sleeps. Each wait then costs a wake-up of every thread
# (a 32-lane warp exchange 2-3 ms on the 2-core CI machine, most of it the operating system's),
# and the polling thread takes the interpreter from the threads doing the work.
#
# The scheduler installed below lets the block's threads take turns instead: one thread runs at
# a time, until it waits or exits, and then hands the turn to the next thread ready to run (it
# releases that thread's lock and blocks on its own: one wake-up, about 13 us). A wait is
# ``syncthreads`` or one of the twins' barriers and conditions (``SimBarrier``,
# ``SimCondition`` below: warp exchanges, named barriers, mbarriers); when it opens, its waiters
# queue up in the order they came. It keeps the simulator's rules: a barrier opens when every
# thread still running waits at it; a thread's exception aborts the block and is raised with
# its thread and block indices. It adds two: a block in which every live thread waits and
# none can go on (a barrier some thread never reaches, a warp exchange with a lane gone)
# raises an error that says where they wait, where Numba's hangs; and a launch runs the same
# way every time (the threads' order does not depend on the machine's load). The Python
# threads of a block shape are made once and kept for its next blocks (``Thread``), for the
# life of the process (a set of idle threads for each block shape and debug flag).
# ``syncthreads_count`` / ``_and`` / ``_or`` go through ``syncthreads`` and keep working.
# Tested with numba-cuda 0.30 (tests/test_simulator.py); installed on import when the simulator
# is in use and its classes have the members this relies on.

#: (Simulator) The scheduler's threads now running, by ``threading.get_ident()``.
_turn_threads = {}

#: (Simulator) Which ready thread gets the next turn: "fifo" (in the order they became
#: ready: the default), "low" / "high" (the lowest or highest thread index first, so those
#: warps run as far ahead of the others as the barriers let them), or "warps:SEED" (the
#: warps in an order drawn from SEED, a warp's lanes in index order: some warps run ahead of
#: others, whichever they are). Any of them may end in "+late": a thread that arrives at a
#: barrier without waiting there (``bar.arrive``, an mbarrier's arrival that completes its
#: phase) then runs on only once no other thread can (such threads go on one at a time, the
#: longest deferred first), so that the threads its arrival lets go run as far as they can
#: first. That is the order in which an arrival made while the arriving warps' own
#: asynchronous reads are still in flight (a wgmma product not yet waited for) shows: the
#: threads let go overwrite the operands before the product completes (at its wait, in the
#: simulator), where by default the arriving thread runs on to that wait first. Every order
#: is one a GPU may take; a kernel that is right only in some of them lacks a barrier or a
#: wait. Set for a while by ``sim_turn_order``; for a whole run by
#: ``NUMBA_MLA_SIM_TURN_ORDER``.
_turn_order = [os.environ.get("NUMBA_MLA_SIM_TURN_ORDER", "fifo")]


def _split_turn_order(order):
    """(Simulator) ``order`` as (the ready queue's order, whether arrivals run late)."""
    late = order.endswith("+late")
    return (order[:-len("+late")] if late else order), late


def _check_turn_order(order):
    base, _ = _split_turn_order(order)
    ok = base in ("fifo", "low", "high") or (
        base.startswith("warps:") and base[6:].isdigit())
    if not ok:
        raise ValueError(f"simulator turn order {order!r}: 'fifo', 'low', 'high' or "
                         f"'warps:SEED', each alone or with '+late' "
                         f"(NUMBA_MLA_SIM_TURN_ORDER, sim_turn_order)")


_check_turn_order(_turn_order[0])


@contextlib.contextmanager
def sim_turn_order(order):
    """(Simulator) Launches within run their blocks' threads in ``order`` (``_turn_order``),
    as a test's way to reach the interleavings where a missing barrier shows: with "low" the
    lower warps run ahead (a consumer before its producer, when the consumers are the lower
    warps), with "high" the higher ones, with "warps:SEED" those SEED's draw puts first; with
    "+late" after any of them, a thread that arrives at a barrier without waiting goes on last
    (where an arrival comes before the arriving warps' products have read their operands)."""
    _check_turn_order(order)
    before = _turn_order[0]
    _turn_order[0] = order
    try:
        yield
    finally:
        _turn_order[0] = before


class _ReadyByRank:
    """(Simulator) Ready threads, the one first whose thread index ``key`` maps lowest: a
    heap with the deque methods ``_Turns`` uses."""

    def __init__(self, threads, key):
        import heapq

        self._heapq, self._key, self._heap, self._n = heapq, key, [], 0
        self.extend(threads)

    def extend(self, threads):
        for t in threads:
            self._n += 1
            self._heapq.heappush(self._heap, (self._key(t.rank), self._n, t))

    def popleft(self):
        return self._heapq.heappop(self._heap)[2]

    def __bool__(self):
        return bool(self._heap)


def _ready_queue(threads, order):
    """(Simulator) The ready queue of a block's ``threads`` (all ready at its start) under a
    turn order."""
    import collections

    if order == "fifo":
        return collections.deque(threads)
    if order == "low":
        return _ReadyByRank(threads, lambda r: r)
    if order == "high":
        return _ReadyByRank(threads, lambda r: -r)
    import numpy as np

    warps = -(-len(threads) // 32)
    place = np.random.default_rng(int(order[6:])).permutation(warps)  # (the warps' order)
    return _ReadyByRank(threads, lambda r: 32 * int(place[r // 32]) + r % 32)


def _turn_thread():
    """(Simulator) The calling thread when it is a block's thread run by the scheduler, else
    None (Numba's own scheduler, or a plain Python thread calling a twin)."""
    return _turn_threads.get(_get_ident())


def sim_scratch():
    """(Simulator) A dict of the calling thread's own for the block it runs, new for every
    block, under the scheduler; None elsewhere. The twins keep a thread's state there (its
    asynchronous operations in flight: ptx/_twin.py)."""
    me = _turn_thread()
    return None if me is None else me.scratch


def sim_block():
    """(Simulator) The block the calling thread belongs to under the scheduler (an object that
    is new for every block), else None: twins keep per-block state (a warp's exchange counts,
    a named barrier's arrivals) under it, so nothing carries over from a block that failed."""
    me = _turn_thread()
    return None if me is None else me.turns


class _Turns:
    """(Simulator) A block's threads taking turns: the queue of those ready to run, the count
    of those still running, the threads waiting at ``syncthreads``, and the block's error."""

    def __init__(self, threads):
        import threading

        self.threads = threads
        order, self.late = _split_turn_order(_turn_order[0])
        self.ready = _ready_queue(threads, order)
        self.deferred = []  # ("+late") threads past an arrival, run once none is ready
        self.live, self.at_barrier, self.error = len(threads), [], None
        self.done = threading.Event()

    def _pass(self):
        """Hand the turn to the next ready thread (the caller waits or has exited); with none
        ready, to the threads deferred after an arrival."""
        if not self.ready and self.deferred:
            self.wake([self.deferred.pop(0)])
        if self.ready:
            self.ready.popleft().turn.release()
        elif self.live:
            self._fail(RuntimeError(self._stuck()), None)
        else:
            self.done.set()

    def _stuck(self):
        import collections

        waits = collections.Counter(t.waiting_on for t in self.threads
                                    if t.waiting_on is not None)  # (set while parked)
        where = ", ".join(f"{n} at {w}" for w, n in sorted(waits.items()))
        return ("the simulated block cannot go on: every running thread waits (%s); a barrier "
                "some thread never reaches, or a warp exchange with a lane gone" % where)

    def _fail(self, error, traceback):
        """Abort the block: every thread is let go and raises when it next runs."""
        self.error = error, traceback
        for t in self.threads:
            t.abort = True
            t.turn.release()
        self.done.set()

    def park(self, me, where):
        """``me`` waits (it is on some waiting list) until woken: the turn goes on."""
        me.waiting_on = where
        self._pass()
        me.turn.acquire()
        me.waiting_on = None
        if me.abort:
            raise RuntimeError("abort flag set while waiting at %s" % where)

    def defer(self, me):
        """``me`` has arrived at a barrier ("+late" order): it goes on once no other thread
        can, after the threads deferred before it (one at a time: a thread let go runs
        before the next deferred one)."""
        self.deferred.append(me)
        self.park(me, "its turn after an arrival")

    def wake(self, threads):
        """Queue ``threads`` (waiters whose wait is over) to run after those already queued."""
        self.ready.extend(threads)

    def arrive(self, me):
        """``me`` at ``syncthreads``: the last one there opens it and goes on."""
        self.at_barrier.append(me)
        if len(self.at_barrier) == self.live:
            self._open(me)
        else:
            self.park(me, "syncthreads")

    def _open(self, me=None):
        waiting, self.at_barrier = self.at_barrier, []
        self.wake(t for t in waiting if t is not me)

    def exit(self, me):
        if self.error is not None:
            return  # the block was aborted: every thread was let go at once
        self.live -= 1
        if me.exception is not None:
            self._fail(*me.exception)
            return
        if self.at_barrier and len(self.at_barrier) == self.live:
            self._open()
        self._pass()


def sim_arrived():
    """(Simulator) A twin's call right after the calling thread arrived at a barrier without
    waiting there (``bar.arrive``, an mbarrier's arrival that completed its phase): under a
    "+late" turn order (``_turn_order``) the thread gives up its turn until no other thread
    can run; otherwise nothing."""
    me = _turn_thread()
    if me is not None and me.turns.late:
        me.turns.defer(me)


class SimCondition:
    """(Simulator) ``threading.Condition``'s ``with``, ``wait_for`` and ``notify_all`` for the
    twins (``SimBarrier``, named barriers, mbarriers). Under the scheduler only one thread
    runs, so ``with`` takes no lock and a waiter gives up its turn until notified
    (``wait_for``'s timeout is not needed there: a waiter runs again only when something
    changed); elsewhere a ``threading.Condition``. ``where`` names it in the scheduler's
    error."""

    def __init__(self, where="a condition"):
        import threading

        self.where = where
        self._cv = threading.Condition()
        self._waiting = []

    def __enter__(self):
        if _turn_thread() is None:
            self._cv.acquire()
        return self

    def __exit__(self, *exc):
        if _turn_thread() is None:
            self._cv.release()

    def wait_for(self, predicate, timeout=None):
        me = _turn_thread()
        if me is None:
            return self._cv.wait_for(predicate, timeout)
        while not predicate():
            if self._waiting and self._waiting[0].turns is not me.turns:
                self._waiting = []  # (waiters of a block that failed: none is kept alive)
            self._waiting.append(me)
            me.turns.park(me, self.where)
        return True

    def notify_all(self):
        me = _turn_thread()
        if me is None:
            self._cv.notify_all()
            return
        turns = me.turns
        waiting, self._waiting = self._waiting, []
        turns.wake(t for t in waiting if t.turns is turns)


class SimBarrier:
    """(Simulator) A barrier for ``n`` threads, for the twins (a warp's exchange): ``wait()``
    returns once ``n`` threads called it, after the last of them has run ``action`` (when
    given). Made of a ``SimCondition``: under the scheduler the waiters give up their turn and
    go on in the order they came."""

    def __init__(self, n, action=None, where="a barrier"):
        self.n, self.action = n, action
        self.cv = SimCondition(where)
        self.count = self.generation = 0

    def wait(self):
        with self.cv:
            generation = self.generation
            self.count += 1
            if self.count < self.n:
                self.cv.wait_for(lambda: self.generation != generation)
                return
            self.count, self.generation = 0, generation + 1
            try:
                if self.action is not None:
                    self.action()
            finally:
                self.cv.notify_all()


def _with_indices(error, thread):
    """(Simulator) ``error`` with the thread's and block's indices in front of its message, as
    Numba's simulator raises it; a RuntimeError from it where its class takes other
    arguments."""
    msg = "tid=%s ctaid=%s" % (list(thread.threadIdx), list(thread.blockIdx))
    if str(error):
        msg = "%s: %s" % (msg, error)
    try:
        return type(error)(msg)
    except Exception:
        new = RuntimeError("%s (%s)" % (msg, type(error).__name__))
        new.__cause__ = error
        return new


class _Shape:
    """(Simulator) What a block thread reads of its manager when it is made: the block's
    shape."""

    def __init__(self, block_dim):
        self._block_dim = block_dim


def _install_block_scheduler():
    import threading

    import numpy as np

    from numba.cuda.simulator import kernel as sim

    if not (hasattr(sim, "BlockManager") and hasattr(sim, "BlockThread")
            and all(hasattr(sim.BlockThread, m) for m in ("syncthreads", "run"))
            and getattr(sim.BlockManager.run, "_numba_mla", False) is False):
        return False

    from numba.cuda.simulator.kernelapi import Dim3

    class Thread(sim.BlockThread):
        """A CUDA thread index of a block shape, kept for every block of that shape: Python
        threads are made once, not for every block (making and starting them took about a
        quarter of the interpreter's time in a simulated FMA kernel's test, by py-spy). It
        runs a block's ``job`` each time it is given the turn for a new block, until a block
        fails (then it ends)."""

        def __init__(self, block_dim, point, debug):
            super().__init__(None, _Shape(block_dim), (0, 0, 0), point, debug)
            x, y, z = point
            self.rank = x + block_dim[0] * (y + block_dim[1] * z)  # CUDA's linear index
            self.turn = threading.Lock()  # held while the thread may not run
            self.turn.acquire()
            self.turns = self.job = self.waiting_on = None

        def syncthreads(self):
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads call")
            self.turns.arrive(self)

        def run(self):
            ident = _get_ident()
            _turn_threads[ident] = self
            try:
                self._run()
            finally:
                del _turn_threads[ident]

        def _run(self):
            while not self.abort:  # (a block failed: the pool is dropped, its threads end)
                self.turn.acquire()  # the first turn of its next block
                if self.abort:
                    return
                try:
                    if self.debug:
                        np.seterr(divide="raise")
                    self.job()
                except BaseException as e:  # (Numba's BlockThread.run: the indices in front)
                    self.exception = _with_indices(e, self), e.__traceback__
                finally:
                    self.turns.exit(self)

    pools, pools_lock = {}, threading.Lock()  # (block shape, debug) -> threads not in use

    def run(self, grid_point, *args):
        def job():
            self._f(*args)

        key = tuple(self._block_dim), self._debug
        with pools_lock:  # (a launch from another Python thread makes threads of its own)
            threads = pools.pop(key, None)
        if threads is None:
            threads = [Thread(self._block_dim, point, self._debug)
                       for point in np.ndindex(*self._block_dim)]
            for t in threads:
                t.start()
        turns = _Turns(threads)
        for t in threads:
            t._manager, t.blockIdx, t.job, t.turns = self, Dim3(*grid_point), job, turns
            t.scratch = {}  # (the twins' per-thread state for this block: sim_scratch)
            t.exception = None
        with _package_swapped(sim._get_kernel_context()):
            turns._pass()
            turns.done.wait()
        for t in threads:
            t._manager = t.job = None  # (nothing of the launch kept alive)
        if turns.error is None:
            if all(t.is_alive() for t in threads):
                with pools_lock:
                    pools[key] = threads
            return
        for t in threads:
            t.join(timeout=10)
        error, traceback = turns.error
        raise error.with_traceback(traceback)

    run._numba_mla = True
    sim.BlockManager.run = run

    # The fast call: a device function of this package, called while its module is held
    # swapped (below), runs directly.
    call = sim.FakeCUDAKernel.__call__

    def fast_call(self, *args):
        if self._device and id(self.fn.__globals__) in _held:
            return self.fn(*args)
        return call(self, *args)

    sim.FakeCUDAKernel.__call__ = fast_call
    return True


#: ids of the module namespaces held swapped for the block now running (the simulator's
#: scheduler thread writes it between blocks, while no thread of a block runs)
_held = set()


class _Namespace:
    """What ``swapped_cuda_module`` reads of a function: its globals."""

    def __init__(self, namespace):
        self.__globals__ = namespace


@contextlib.contextmanager
def _package_swapped(fake_cuda):
    """Numba's simulator calls a device function inside ``swapped_cuda_module``: its module's
    name for numba.cuda is pointed at the launch's fake module, under two locks and a
    reference count, on every call of every thread (``from numba import cuda`` included). A
    quarter to a third of a simulated kernel's busy time went there (py-spy, the FMA kernel).
    Here each module of this package is swapped once for the whole block, by the same
    function and count (so it cannot be restored under a running thread), and its device
    functions are called directly (``fast_call``). Device functions of other modules (a
    user's score mod) take Numba's path."""
    from numba.cuda.simulator import kernelapi

    with contextlib.ExitStack() as stack:
        for name, module in list(sys.modules.items()):
            if module is not None and (name == __package__ or
                                       name.startswith(__package__ + ".")):
                namespace = vars(module)
                stack.enter_context(kernelapi.swapped_cuda_module(_Namespace(namespace),
                                                                  fake_cuda))
                _held.add(id(namespace))
        try:
            yield
        finally:
            _held.clear()


# ---------------------------------------------------------------------------------------------
# The simulator's shared arrays
# ---------------------------------------------------------------------------------------------
# The simulator makes a static shared array when the first thread of a launch reaches its line:
# it looks the line up, finds nothing, allocates, stores (``FakeCUDAShared.array``). The block's
# threads are Python threads, so a second one can look up before the first has stored; it then
# allocates an array of its own, and what it writes there never reaches the others. A correct
# kernel so gives a wrong output, rarely, more often on a loaded machine (one CI run failed
# so; tests/test_simulator.py makes it likely with a short switch interval). The replacement
# does the same under a lock: one array a line, as the original's docstring promises.
def _guard_shared_arrays():
    import threading

    import numpy as np
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    shared = getattr(kernelapi, "FakeCUDAShared", None)
    if (shared is None or getattr(shared.array, "_numba_mla", False)
            or not hasattr(shared(0), "_allocations")):
        return False
    original = shared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:  # the original's error, or the dynamic buffer
            return original(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        line = (caller.f_code.co_filename, caller.f_lineno)  # the original's key
        with lock:
            found = self._allocations.get(line)
            if found is None:
                if isinstance(dtype, types.Type):
                    dtype = numpy_support.as_dtype(dtype)
                found = self._allocations[line] = np.empty(shape, dtype)
        return found

    array._numba_mla = True
    shared.array = array
    return True


# In the simulator a kernel's ``float32(x)`` / ``int32(x)`` / ``uint64(x)`` is Numba's
# ``Type.__call__``: an import statement and an isinstance test against an abstract base class
# on every call, before the NumPy cast (``cast_python_value``). The simulated kernels call it
# tens of thousands of times a launch (about a tenth of an FMA kernel's busy time, by cProfile).
# The replacement takes the cast at once where the argument is a Python or NumPy number (never
# a Numba type), and leaves everything else to the original: the same results.
def _fast_scalar_casts():
    import numpy as np
    from numba.core import types

    original = types.Type.__call__
    if getattr(original, "_numba_mla", False):
        return True

    def __call__(self, *args):
        if len(args) == 1 and isinstance(args[0], (int, float, np.generic)):
            return self.cast_python_value(args[0])
        return original(self, *args)

    __call__._numba_mla = True
    types.Type.__call__ = __call__
    return True


from ._compat import SIMULATOR as _SIMULATOR  # noqa: E402

#: Whether the simulator runs its blocks with the scheduler above (NUMBA_MLA_SIM_SCHEDULER=0
#: keeps Numba's own).
BLOCK_SCHEDULER = (_SIMULATOR and os.environ.get("NUMBA_MLA_SIM_SCHEDULER", "1") != "0"
                   and _install_block_scheduler())

#: Whether the simulator's shared arrays are made under a lock (above; always, where the
#: simulator's class has the members this relies on).
SHARED_ARRAYS_GUARDED = _SIMULATOR and _guard_shared_arrays()

#: Whether Numba's scalar types cast numbers the short way (above; in the simulator).
FAST_SCALAR_CASTS = _SIMULATOR and _fast_scalar_casts()
