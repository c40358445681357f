"""From a checked ``Call`` to kernel launches: device views, workspace, grid, split-K.

Every call is run in ragged form: padded q ``[B, Sq, H, 576]`` is the ragged q ``[B*Sq, H, 576]``
with row offsets ``b * Sq``. NumPy inputs are copied to the device and the result copied back;
Numba device arrays, torch and CuPy tensors are used in place, and results come back in the
caller's kind of array (torch in, torch out).
"""
import ctypes
import functools
import threading

import numpy as np

from . import _compat, _numba
from . import factory, heuristics, ptx, selector
from .arrays import BF16, data_ptr, is_device, is_torch
from .caches import D_QK, D_V, to_device_like
from numba import cuda

_SMEM_STATIC_LIMIT = 48 * 1024
_MAX_GRID_X = 2**31 - 1
_tls = threading.local()
_load_lock = threading.RLock()


# ---------------------------------------------------------------------------------------------
# Arrays
# ---------------------------------------------------------------------------------------------
def _as_device(x, sixteen_bit, shape=None, pairs=False, name="an array"):
    """A Numba device array over x's memory, copying host data. 16-bit floats are seen as
    int16 bits, or as int32 words of two (``pairs``: the last axis halves). ``name``: the
    argument, for the error a strided Numba (or CuPy) device array gets where it would be read
    as wider elements (Numba changes the element size of C-contiguous device arrays only;
    torch views need only contiguous rows)."""
    if shape is not None:
        x = x.reshape(shape)
    view = (np.int32 if pairs else np.int16) if sixteen_bit else None
    if isinstance(x, np.ndarray):
        host = np.ascontiguousarray(x)
        return cuda.to_device(host.view(view) if view else host)
    if is_torch(x):
        import torch

        if view:
            x = x.view(torch.int32 if pairs else torch.int16)
        return cuda.as_cuda_array(x.detach())
    # Numba device arrays (the simulator's too) are used as they are; CuPy and others by CAI
    d = x if hasattr(x, "copy_to_host") else cuda.as_cuda_array(x)
    if view and np.dtype(view).itemsize != d.dtype.itemsize and not d.is_c_contiguous():
        raise ValueError(f"{name}: a strided Numba or CuPy device array is read as "
                         f"{8 * np.dtype(view).itemsize}-bit words here, which Numba allows "
                         "only for C-contiguous arrays; pass a contiguous copy (or the strided "
                         "view as a torch tensor)")
    return d.view(view) if view else d


def _int32_device(x, host):
    if is_device(x):
        return _as_device(x, False)
    return cuda.to_device(np.ascontiguousarray(host, np.int32))


def _dummy(shape, dtype):
    key = ("dummy", shape, np.dtype(dtype).str)
    cache = getattr(_tls, "dummies", None)
    if cache is None:
        cache = _tls.dummies = {}
    if key not in cache:
        cache[key] = cuda.to_device(np.zeros(shape, dtype))
    return cache[key]


def _empty_lse_like_caller(q, shape):
    """A float32 LSE array of the caller's kind (torch for torch q)."""
    if is_torch(q):
        import torch

        return torch.empty(shape, dtype=torch.float32, device=q.device)
    return cuda.device_array(shape, dtype=np.float32)


def _out_allocator(q, shape, dtype):
    """A callable ``alloc(q)`` for output storage of the caller's kind: torch for torch q (on
    q's device), else a Numba device array."""
    if is_torch(q):
        import torch

        tdt = {BF16: torch.bfloat16, np.dtype(np.float16): torch.float16,
               np.dtype(np.float32): torch.float32}[np.dtype(dtype)]
        if tdt == q.dtype:  # (new_empty: q's dtype and device, without parsing them again)
            return lambda q: q.new_empty(shape)
        return lambda q: torch.empty(shape, dtype=tdt, device=q.device)
    if np.dtype(dtype).itemsize == 2:  # allocated as int16 (any dtype Numba knows), seen as dtype
        return lambda q: cuda.device_array(shape, dtype=np.int16).view(dtype)
    return lambda q: cuda.device_array(shape, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Workspace: per-partition results, reused between calls (stream-ordered on the default stream)
# ---------------------------------------------------------------------------------------------
def _workspace(nfloats, stream=0, private=False):
    """Per-partition results: a pool per (thread, stream), reused by later calls on that
    stream (stream order keeps them apart), or a ``private`` allocation (a prepared decoder's,
    whose address must not change under a CUDA graph)."""
    what = "num_partitions: the split-K workspace (T x H x P x 513 float32)"
    if private:
        _check_fits(4 * nfloats, what)
        return _zeroed(max(nfloats, 1), stream, settle=True)
    pools = getattr(_tls, "workspaces", None)
    if pools is None:
        pools = _tls.workspaces = {}
    pool = pools.get(stream)
    if pool is None or pool.size < nfloats:
        _check_fits(4 * nfloats, what)
        pool = pools[stream] = _zeroed(max(nfloats, 1 << 20), stream)
    return pool


def _zeroed(nfloats, stream, settle=False):
    """A new float32 device array of zeros (set on ``stream``, in its order). The combine
    reads an empty partition's output slot beside its LSE, before it knows the LSE is -inf,
    and ignores it: that slot then holds zeros or an earlier call's values, never memory
    no kernel wrote. ``settle``: the array will be used on other streams too (a prepared
    decoder's, launched on whatever stream is current at each call), so the host waits for
    the clearing here, unless ``stream`` is being captured into a CUDA graph (the clearing
    is then the graph's, ordered before its kernels). (The simulator's arrays are left as
    NumPy makes them.)"""
    arr = cuda.device_array(nfloats, np.float32)
    if not _compat.SIMULATOR:
        from cuda.bindings import driver as binding

        err, = binding.cuMemsetD32Async(arr.device_ctypes_pointer.value, 0, nfloats, stream)
        if not err and settle:
            err, status = binding.cuStreamIsCapturing(stream)
            if not err and status == binding.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE:
                err, = binding.cuStreamSynchronize(stream)
        if err:
            raise RuntimeError(f"numba_mla: clearing the split-K workspace failed ({err})")
    return arr


def current_stream(q):
    """The stream a call on ``q`` is ordered on: torch's current stream for torch tensors (so
    side streams and CUDA-graph capture work as torch users expect), else the legacy default
    stream (0), as Numba uses."""
    if _compat.SIMULATOR or not is_torch(q):
        return 0
    import torch

    return torch.cuda.current_stream(q.device).cuda_stream


def _stream_query(q):
    """``current_stream(q)`` as a callable for the per-call path. For torch tensors it is
    torch's raw current-stream query (what torch.compile's generated code calls), which skips
    building a torch.cuda.Stream object on every call."""
    if _compat.SIMULATOR or not is_torch(q):
        return lambda: 0
    query = _numba.torch_raw_stream_query(q.device.index)
    return functools.partial(current_stream, q) if query is None else query


_core_streams = {}


def _core_stream(handle):
    """A cuda.core stream object for a raw stream handle (cached: made once per handle)."""
    st = _core_streams.get(handle)
    if st is None:
        st = _core_streams[handle] = _numba.stream_from_handle(handle)
    return st


def _check_fits(nbytes, what):
    """A clear error before an allocation the device cannot hold (instead of the driver's)."""
    if _compat.SIMULATOR:
        return
    free, _ = cuda.current_context().get_memory_info()
    if nbytes > free:
        raise MemoryError(f"{what} needs {nbytes / 2**30:.2f} GiB of device memory, "
                          f"{free / 2**30:.2f} GiB are free; use fewer partitions or a smaller "
                          f"batch")


# ---------------------------------------------------------------------------------------------
# Compiled kernels: arguments packed once, each launch one cuLaunchKernel
# ---------------------------------------------------------------------------------------------
def _param_array(values):
    """cuLaunchKernel's ``void*[]`` (one entry per kernel parameter) over the values Numba's
    launch hands to cuda.core, packed as cuda.core packs them: a bool is a one-byte C bool, an
    int a pointer-sized integer, a ctypes scalar is itself. Returns the array and the C values
    it points at: both must stay alive as long as it is launched with."""
    cvals = []
    for v in values:
        if isinstance(v, bool):
            v = ctypes.c_bool(v)
        elif isinstance(v, int):
            v = ctypes.c_ssize_t(v)
        elif not isinstance(v, ctypes._SimpleCData):
            raise TypeError(f"kernel parameter: cannot pack a {type(v).__name__}")
        cvals.append(v)
    return (ctypes.c_void_p * len(cvals))(*map(ctypes.addressof, cvals)), cvals


def _pack(kernel, args):
    """The parameter array for launching a compiled kernel with ``args``: Numba's own conversion
    (``_prepare_args``, what ``kernel.launch`` redoes on every call: a device array becomes
    meminfo, parent, nitems, itemsize, data, shape..., strides...; a float32 a C float), run
    once. Also returns where each argument's values start (``set_arg`` patches an array's data
    address there)."""
    values, writebacks, starts = [], [], []
    for ty, val in zip(kernel.argument_types, args):
        starts.append(len(values))
        _numba.prepare_arg(kernel, ty, val, writebacks, values)
    if writebacks:  # a host array was copied to the device: later launches would reuse the copy
        raise TypeError("_Launch: the arguments must be device arrays and scalars")
    params, cvals = _param_array(values)
    return params, cvals, starts


#: Where an array argument's data address sits among its values (meminfo, parent, nitems,
#: itemsize, data, shape..., strides...: Numba's layout of an array argument).
_DATA_FIELD = 4


def _dim3(d):
    d = (d,) if isinstance(d, (int, np.integer)) else tuple(d)
    return tuple(int(x) for x in d) + (1,) * (3 - len(d))


def _kinds(args):
    """What a GPU types kernel arguments by, as far as the simulator can tell: an array's
    dtype and dimensions, a scalar's type."""
    return [(str(a.dtype), a.ndim) if hasattr(a, "ndim") and hasattr(a, "dtype")
            else type(a).__name__ for a in args]


def _check_count(dispatcher, args):
    """In the simulator, a TypeError where ``args`` are not as many as the kernel's
    parameters: on a GPU the kernel is typed on its arguments and refuses them so; the
    simulator would run the function with whatever it is given (or fail deep inside it)."""
    func = getattr(dispatcher, "py_func", None)
    if func is None:
        return
    want = func.__code__.co_argcount
    if len(args) != want:
        raise TypeError(f"{func.__name__} takes {want} arguments, {len(args)} given")


class _Launch:
    """One kernel with its arguments, grid and shared memory, ready to go. On a GPU the kernel
    is compiled and its parameters packed here, once; a call is then a single cuLaunchKernel
    (Numba's ``kernel.launch`` re-packs every argument into ctypes on every call, tens of
    microseconds). The dynamic shared-memory limit is raised once when above 48 KB (Numba has
    no API for it: numba-cuda#94). The simulator keeps Numba's dispatcher."""

    def __init__(self, dispatcher, args, grid, block, smem=0, follows=False):
        self.args, self.grid, self.block, self.smem = args, grid, block, smem
        self.dispatcher, self.follows = dispatcher, follows
        self.kernel = self._params = self._whole = None
        if _compat.SIMULATOR:  # (nothing is compiled here: the count is checked, as a GPU's
            _check_count(dispatcher, args)  # typing would, for launches and candidates alike)
            return
        from cuda.bindings import driver as binding
        from numba.core.typing import typeof

        sig = tuple(typeof.typeof(a, typeof.Purpose.argument) for a in args)
        # One thread at a time compiles, loads the module into the context (Numba's module
        # table asserts when two threads load one kernel at once) and raises the limit.
        with _load_lock:
            self.kernel = dispatcher.compile(sig)
            fn = _numba.cufunc(self.kernel)
            whole = self._whole = (_numba.whole_program_function(self.kernel)
                                   if getattr(dispatcher, "whole_program", False) else None)
            if whole is not None:  # (its own module in each context: its own limit)
                if smem > _SMEM_STATIC_LIMIT and whole.smem < smem:
                    whole.allow_dynamic_smem(smem)
            elif smem > _SMEM_STATIC_LIMIT and getattr(self.kernel, "_numba_mla_smem", 0) < smem:
                _numba.allow_dynamic_smem(fn, smem)
                self.kernel._numba_mla_smem = smem
        if whole is None and _numba.needs_numba_launch(self.kernel):
            return  # Numba's launch does their extra work (error readback, cooperative launch)
        # Kept together: the parameter array points into _cvals, and both into self.args' memory.
        self._params, self._cvals, self._starts = _pack(self.kernel, args)
        self._params_ptr = ctypes.addressof(self._params)
        # A CUkernel handle (Numba loads modules as libraries): the driver launches it in the
        # thread's current context. A whole-program kernel: the function of its own module.
        self._func = fn.handle if whole is None else whole.handle
        self._dims = _dim3(grid) + _dim3(block) + (int(smem),)
        # cuda.bindings: about 0.6 us of Python a call (timed against a stub libcuda), where
        # calling libcuda through ctypes (argtypes set) took about 1.5 us.
        self._enqueue = binding.cuLaunchKernel
        self._config = self._stream = None
        if follows:
            # The previous launch's programmatic dependent (``follows``: the kernel waits for
            # that grid itself, kernels/combine.py): the driver may start it early, so the gap
            # between the two kernels is not a whole launch's latency.
            attr = binding.CUlaunchAttribute()
            ids = binding.CUlaunchAttributeID
            attr.id = ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg = binding.CUlaunchConfig()
            (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.blockDimY,
             cfg.blockDimZ, cfg.sharedMemBytes) = self._dims
            cfg.attrs, cfg.numAttrs = [attr], 1
            self._config = cfg

    def spills(self):
        """Whether the compiled kernel uses local memory (registers spilled, or a call's
        frame); never in the simulator, which compiles nothing."""
        if self.kernel is None:
            return False
        if self._whole is not None:  # (and fewer registers at launch than its setmaxnreg
            # moves would leave .inc waiting for ever)
            return (self._whole.local_bytes > 0
                    or self._whole.regs < getattr(self.dispatcher, "launch_registers", 0))
        return self.kernel.local_mem_per_thread > 0

    def __call__(self, stream=0):
        """Enqueue on ``stream`` (a raw handle; 0: the legacy default stream)."""
        if self._params is not None:
            err = self._launch(stream)
            if err:
                self._failed(err, stream)
        elif self.kernel is None:
            self.dispatcher[self.grid, self.block, 0, self.smem](*self.args)
        else:
            self.kernel.launch(self.args, self.grid, self.block, _core_stream(stream), self.smem)

    def _launch(self, stream):
        """One launch of the packed kernel on ``stream``; the driver's error code."""
        if self._config is None:
            return self._enqueue(self._func, *self._dims, stream, self._params_ptr, 0)[0]
        from cuda.bindings import driver as binding

        if stream != self._stream:
            self._config.hStream, self._stream = stream, stream
        err, = binding.cuLaunchKernelEx(self._config, self._func, self._params_ptr, 0)
        if err:  # a driver without programmatic launches: plain ones from now on (the
            self._config = None  # kernel's wait then has nothing to wait for)
            return self._launch(stream)
        return err

    def set_arg(self, index, array):
        """Later launches take ``array`` as argument ``index``: an array of the same type
        (dtype, dimensions, layout) and shape as the one it replaces, on the same device. On a
        GPU only its data address changes in the packed parameters (the driver copies them at
        each launch, so this is safe between launches)."""
        if self._params is not None:
            self._cvals[self._starts[index] + _DATA_FIELD].value = data_ptr(array)
        else:
            args = list(self.args)
            args[index] = array
            self.args = tuple(args)

    def _failed(self, err, stream):
        """cuLaunchKernel failed (nothing was enqueued). A thread that has not used CUDA yet has
        no current context (Numba's launch makes one current): make Numba's current and retry
        once; any other failure is raised."""
        from cuda.bindings import driver as binding
        from numba.cuda.cudadrv.driver import CudaAPIError

        res, ctx = binding.cuCtxGetCurrent()
        if not res and not int(ctx):
            cuda.current_context()
            if not self._launch(stream):
                return
        name = binding.cuGetErrorName(err)[1]
        name = name.decode() if isinstance(name, bytes) else getattr(err, "name", str(err))
        gx, gy, gz, bx, by, bz, smem = self._dims
        raise CudaAPIError(int(err), f"cuLaunchKernel: {name} launching "
                                     f"{self.dispatcher.py_func.__name__} (grid {gx}x{gy}x{gz}, "
                                     f"block {bx}x{by}x{bz}, {smem} bytes of dynamic shared "
                                     f"memory, stream {stream:#x})")


# ---------------------------------------------------------------------------------------------
# Backends (decided in selector.py; the names stay importable here)
# ---------------------------------------------------------------------------------------------
mma_supported = selector.mma_supported
resolve_backend = selector.resolve_backend


def _aligned16(dev):
    if _compat.SIMULATOR:
        return True
    return dev.__cuda_array_interface__["data"][0] % 16 == 0


# ---------------------------------------------------------------------------------------------
# The plan: everything but the launches, done once
# ---------------------------------------------------------------------------------------------
#: The kernel arguments that are arrays a later call may replace (``Plan.rebind``), in the
#: partition kernels' order; the scale follows them.
INPUT_ROLES = ("q", "offsets", "storage", "block_table", "lengths", "bias")


class Plan:
    """A checked call turned into device arrays and ready launches: ``launch()`` enqueues the
    partition and combine kernels, ``result()`` returns out (and lse) as the caller expects.
    Which kernel runs is selector.py's decision; a plan keeps device views, workspace and the
    launches. The benchmark times ``launch()`` alone.

    A plan runs again on other arrays of the same layouts: ``rebind(role, array)`` swaps one
    kernel argument in place (plans.py does it for the plain ``mla_decode`` call)."""

    def __init__(self, call, private_workspace=False):
        from .kernels import combine

        _compat.notice_simulator()
        self.call = call
        self.cache = call.cache  # the cache object whose arrays are bound (plans.run)
        self._alloc_out = None
        self._offsets = None  # (host offsets' bytes, their device copy): device_offsets
        self._work = None  # (the listed schedule's table, its device copy): _inputs
        self.stream = current_stream(call.q)
        tag = factory.dtype_tag(call.dtype)
        sixteen = self.sixteen = tag != "f32"
        cache = call.cache
        B, H = call.batch, call.heads

        if call.ragged:
            offs_host, offs_src = call.q_offsets_host, call.q_offsets
        else:
            offs_host = offs_src = (np.arange(B + 1) * call.sq).astype(np.int32)
        if offs_host is None:  # device offsets, not read: every sequence up to call.sq rows
            T, counts = call.out_shape[0], np.full(B, call.sq)
        else:
            T, counts = int(offs_host[-1]), np.diff(offs_host)
        self.q_shape3 = None if call.ragged else (B * call.sq, H, D_QK)
        # Device offsets the host did not read go through kernels/offsets.py's clamp into a
        # buffer of the plan's, which the partition kernel reads (guard: that launch)
        guard = None
        if offs_host is None:
            offsets = cuda.device_array(B + 1, np.int32)
            guard = (_as_device(offs_src, False), offsets, np.int32(T))
        else:
            offsets = _int32_device(offs_src, offs_host)
        inputs = dict(
            offsets=offsets,
            # rows contiguous; FP8 rows as int32 words of four codes
            storage=_as_device(cache.storage, sixteen or bool(cache.fp8_layout), pairs=True,
                               name="cache.storage"),
            lengths=_as_device(cache.device_lengths(), False),
            block_table=(_dummy((1, 1), np.int32) if cache.block_table is None
                         else _as_device(cache.device_block_table(), False)),
            bias=_dummy((1, 1, 1), np.float32) if call.mask.bias_array() is None
            else _as_device(call.mask.bias_array(), False))
        # q as 16-bit pairs (the tensor-core kernels' view), or as 16-bit values (the others')
        q_pairs = _as_device(call.q, sixteen, self.q_shape3, pairs=sixteen, name="q")
        storage = inputs["storage"]
        facts = selector.ArrayFacts(
            aligned16=_aligned16(q_pairs) and _aligned16(storage),
            cache_aligned16=_aligned16(storage),
            packed_rows=q_pairs.is_c_contiguous() and storage.is_c_contiguous(),
            cache_packed=storage.is_c_contiguous())
        rows = int(counts.max(initial=0)) * H
        keys = heuristics.key_counts(call.mask, cache.lengths_host, counts,
                                     getattr(cache, "position_map", None))

        trials = []  # (the simulator's: each candidate and its arguments' kinds)

        def spills(spec):  # compile a candidate for these arguments: does it use local memory?
            args = self._trial_args(spec, dict(inputs, q=q_pairs), storage, T)
            if _compat.SIMULATOR:
                trials.append((spec, _kinds(args)))
            try:
                return _Launch(spec.dispatcher, args, spec.grid(B), spec.threads,
                               spec.smem).spills()
            except _numba.WholeProgramError:  # (the driver's JIT refused it: another kernel)
                return True

        spec = self.spec = selector.select_kernel(call, tag, rows, keys, facts, spills)
        # the family asked
        self.backend = ("mma" if spec.backend in ("seesaw", "transposed") else
                        "mma_sync" if spec.backend == "mma_sync_roles" else spec.backend)
        self.block_m = spec.block_m
        P = self.num_partitions = spec.num_partitions
        if P > _MAX_GRID_X:
            raise ValueError(f"num_partitions: at most {_MAX_GRID_X} (a grid's x dimension; "
                             f"the workspace alone would not fit in memory), got {P}")
        inputs["q"] = q_pairs if spec.q_pairs or not sixteen else _as_device(
            call.q, sixteen, self.q_shape3)

        out_shape3 = (T, H, D_V)
        if call.out is not None and is_device(call.out):
            self.out_dev = _as_device(call.out, sixteen, out_shape3)
            self.result_array = call.out
        elif is_device(call.q):
            self.result_array = self.new_out(call.q)
            self.out_dev = _as_device(self.result_array, sixteen, out_shape3)
        else:
            self.result_array = None  # host caller: copied back in result()
            self.out_dev = cuda.device_array(out_shape3, np.int16 if sixteen else np.float32)
        self.lse_dev = cuda.device_array((T, H), np.float32)
        self.lse_array = None  # the caller's kind of lse array (result())

        # Where each array a later call may replace sits: role -> (launch, argument index)
        self.slots = {}
        self.launches = []
        self._maps_of = {}  # address -> tensor map, for rebinding TMA kernels
        self._bound = {}  # role -> id of the array (simulator) or its address (GPU) last bound
        self._keep = {}  # role -> the array last bound (the simulator's ids stay valid)
        self._rows = T * H  # query rows: q seen as [T * H, 576]
        if T == 0 or B == 0:
            return
        args = self._inputs(inputs, spec)
        # out and lse as a partition kernel that writes them takes them
        outs = (self.out_dev.reshape((T, H, 1, D_V)), self.lse_dev.reshape((T, H, 1)))
        if spec.direct:  # one partition: the kernel writes out and lse itself (no combine)
            results = outs
        else:
            n_out, n_lse = T * H * P * D_V, T * H * P
            ws = _workspace(n_out + n_lse, self.stream, private_workspace)
            results = (ws[:n_out].reshape((T, H, P, D_V)),
                       ws[n_out:n_out + n_lse].reshape((T, H, P)))
        maps = self._maps(spec, inputs["q"], storage, T)
        # (mixed runs: the items of whole sequences write out and lse themselves too)
        direct_results = outs if spec.mixed else ()
        # (a kernel built to wait for the grid before it: launched as its programmatic
        # dependent, kernels/seesaw.py FOLLOWS)
        partition = _Launch(spec.dispatcher, args + results + direct_results + maps,
                            spec.grid(B), spec.threads, spec.smem,
                            follows=getattr(spec.dispatcher, "follows", False))
        self.launches.append(partition)
        for tried, kinds in trials:  # (a GPU compiles the candidate and the launch's kernel
            if tried is spec and kinds != _kinds(partition.args):  # for their argument types)
                raise AssertionError(f"the {spec.backend} candidate was compiled for {kinds}, "
                                     f"the launch passes {_kinds(partition.args)}")
        self.slots.update({role: (partition, i) for i, role in enumerate(INPUT_ROLES)})
        if guard is not None:  # first, and the caller's offsets are its argument 0
            from .kernels import offsets as offsets_kernel

            clamp = _Launch(offsets_kernel.clamp_offsets, guard, 1, offsets_kernel.NTHREADS)
            self.launches.insert(0, clamp)
            self.slots["offsets"] = (clamp, 0)
        if spec.tma:
            self.slots["q_map"] = (partition, len(args) + 2 + len(direct_results))
            self.slots["storage_map"] = (partition, len(args) + 3 + len(direct_results))
        if spec.direct:
            self.slots["out"], self.slots["lse"] = (partition, len(args)), (partition, len(args) + 1)
        else:
            # (partition groups of a combine block; ``spec.groups`` are row groups)
            few, merge_groups = combine.variant(T * H, P, heuristics.sm_count())
            follows = (_compat.SIMULATOR  # (in the simulator: the wait is a no-op)
                       or cuda.get_current_device().compute_capability >= (9, 0))
            merge = _Launch(factory.combine_kernel(tag, follows, few, skips=spec.mixed),
                            results + (self.out_dev, self.lse_dev), (T, H),
                            (combine.NTHREADS, merge_groups), follows=follows)
            self.launches.append(merge)
            self.slots["out"], self.slots["lse"] = (merge, 2), (merge, 3)
            if spec.mixed:  # (the partition kernel's out and lse: rebound with the merge's)
                self.slots["out direct"] = (partition, len(args) + 2)
                self.slots["lse direct"] = (partition, len(args) + 3)

    def _trial_args(self, spec, inputs, storage, T):
        """A candidate partition kernel's arguments for compiling it (``spills``): the call's
        inputs, results of the types the launch gives (a one-row workspace; with ``mixed``,
        out and lse after it, as the launch passes them) and its tensor maps."""
        out_type = np.int16 if self.sixteen else np.float32
        outs = (cuda.device_array((1, 1, 1, D_V), out_type),
                cuda.device_array((1, 1, 1), np.float32))
        results = outs if spec.direct else (cuda.device_array((1, 1, 1, D_V), np.float32),
                                            outs[1])
        if spec.mixed:
            results += outs
        return self._inputs(inputs, spec) + results + self._maps(spec, inputs["q"], storage, T)

    def _inputs(self, inputs, spec):
        """The partition kernel's arguments before its results: the arrays, the scale and the
        schedule: its chunk, or the listed schedule's table on the device (both part of the
        plan's key through the lengths: never rebound)."""
        cache = self.call.cache
        if cache.fp8_layout:  # the FP8 kernels take scale + 1j * kv_scale (kernels/simt.py)
            scale = np.complex64(complex(self.call.scale, cache.kv_scale or 1.0))
        else:
            scale = np.float32(self.call.scale)
        if spec.work is None:
            schedule = np.int32(spec.chunk)
        else:
            if self._work is None or self._work[0] is not spec.work:
                self._work = (spec.work, cuda.to_device(np.ascontiguousarray(spec.work)))
            schedule = self._work[1]
        return tuple(inputs[role] for role in INPUT_ROLES) + (scale, schedule)

    def _maps(self, spec, q_dev, storage, T):
        """The tensor maps of a TMA kernel (q, then the cache); placeholders for the lockstep
        tensor-core kernel that copies by cp.async; none for the others."""
        if not spec.tma:
            return ((_dummy((128,), np.uint8),) * 2 if spec.backend in ("mma", "transposed")
                    else ())
        return (self._tensor_map("q_map", q_dev, T * self.call.heads),
                self._tensor_map("storage_map", storage, storage.shape[0] * storage.shape[1]))

    def _tensor_map(self, role, dev, rows):
        from .kernels import mma

        if role == "storage_map" and self.call.cache.fp8_layout:  # "e4m3" codes (seesaw.py):
            # boxes of 64 codes (32 16-bit values) a row, as they are (no swizzle)
            return ptx.tensor_map(dev, rows, mma.BLOCK_N, mma.BOX // 2, False, row_bytes=D_QK)
        box_rows = mma.BLOCK_M if role == "q_map" else mma.BLOCK_N
        return ptx.tensor_map(dev, rows, box_rows, mma.BOX, True)

    def rebind(self, role, array):
        """Run later launches on ``array`` in place of the current argument of ``role`` (one of
        INPUT_ROLES, "out", "lse"): a device array of the layout this plan was made for."""
        slot = self.slots.get(role)
        if slot is None:
            return
        # What is bound: the array itself in the simulator (compared by identity), else its
        # address (a new tensor at the same address needs no new parameters)
        ident = id(array) if _compat.SIMULATOR else data_ptr(array)
        if self._bound.get(role) == ident:
            return
        self._bound[role] = ident
        self._keep[role] = array
        launch, index = slot
        launch.set_arg(index, self._view(role, array) if _compat.SIMULATOR else array)
        also = self.slots.get(role + " direct")  # (mixed runs: the partition kernel's too)
        if also is not None:
            also[0].set_arg(also[1], self._view(role, array, True) if _compat.SIMULATOR
                            else array)
        map_role = role + "_map"
        if map_role in self.slots:  # TMA kernels: the tensor map holds the address too
            tmap = self._maps_of.get(ident)
            if tmap is None:
                if len(self._maps_of) >= 16:
                    self._maps_of.clear()
                rows = (self._rows if role == "q"
                        else int(array.shape[0]) * int(array.shape[1]))
                tmap = self._maps_of[ident] = self._tensor_map(map_role, array, rows)
            mlaunch, mindex = self.slots[map_role]
            mlaunch.set_arg(mindex, tmap)

    def _view(self, role, array, direct=None):
        """The simulator's kernel argument for ``role`` (on a GPU only the address matters);
        ``direct``: out and lse as a partition kernel that writes them takes them (default:
        as this plan's first kernel to write them does)."""
        direct = self.spec.direct if direct is None else direct
        sixteen, T, H = self.sixteen, self._rows // max(self.call.heads, 1), self.call.heads
        if role == "q":
            return _as_device(array, sixteen, self.q_shape3, pairs=sixteen and self.spec.q_pairs)
        if role == "storage":
            return _as_device(array, sixteen or bool(self.call.cache.fp8_layout), pairs=True,
                              name="cache.storage")
        if role == "out":
            v = _as_device(array, sixteen, (T, H, D_V))
            return v.reshape((T, H, 1, D_V)) if direct else v
        if role == "lse":
            v = _as_device(array, False, (T, H))
            return v.reshape((T, H, 1)) if direct else v
        return _as_device(array, False)

    def device_offsets(self, host, q):
        """A device copy of a ragged call's host row offsets, for a call on ``q``: the last one
        made while the values stay the same (a decode loop's seldom change), else a new one,
        enqueued on q's stream for torch q (caches.to_device_like: no wait for the GPU)."""
        key = host.tobytes()
        if self._offsets is None or self._offsets[0] != key:
            self._offsets = (key, to_device_like(q, host))
        return self._offsets[1]

    def new_out(self, q):
        """A new output for a call on ``q``, of the caller's kind (plans.run)."""
        if self._alloc_out is None:
            self._alloc_out = _out_allocator(q, self.call.out_shape, self.call.dtype)
        return self._alloc_out(q)

    def launch(self, stream=None):
        """Enqueue the kernels on ``stream`` (default: the stream current at construction)."""
        stream = self.stream if stream is None else stream
        for launch in self.launches:
            launch(stream)

    def result(self):
        call = self.call
        result = self.result_array
        if result is None:  # host caller: copy back
            host = self.out_dev.copy_to_host()
            if self.sixteen:
                host = host.view(call.dtype)  # int16 bits back to bfloat16 or float16
            host = host.reshape(call.out_shape)
            if call.out is not None:
                call.out[...] = host
                host = call.out
            result, lse = host, self.lse_dev.copy_to_host()
        elif is_torch(call.q):
            import torch

            lse = torch.as_tensor(self.lse_dev, device=call.q.device)
        else:
            lse = self.lse_dev
        if not call.return_lse:
            return result
        return result, lse.reshape(call.out_shape[:-1])


class Decoder:
    """A decode call prepared once (``numba_mla.prepare``): checks, device views, workspace,
    compiled kernels and their arguments. Each call enqueues the kernels on the caller's current
    stream (torch's, for torch tensors) and returns out (and lse): the same arrays every time,
    so between calls the inputs' contents may change but not their addresses or shapes: what a
    decode loop and a CUDA graph (``torch.cuda.graph``) need."""

    def __init__(self, call):
        if not is_device(call.q):
            raise TypeError("q: prepare() needs device arrays (torch, CuPy or Numba); use "
                            "mla_decode for NumPy inputs")
        self.plan = Plan(call, private_workspace=True)
        self.q = call.q
        self._stream = _stream_query(call.q)
        self._result = self.plan.result()  # device arrays: the same ones every call, no copy

    def __call__(self):
        # The per-call path: a stream query and one cuLaunchKernel per kernel (_Launch).
        self.plan.launch(self._stream())
        return self._result


def run(call):
    """Run the split-K kernels for a checked call; returns out (and lse)."""
    plan = Plan(call)
    plan.launch()
    return plan.result()
