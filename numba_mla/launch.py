"""From a checked ``Call`` to kernel launches: device views, workspace, grid, split-K.

Every call is run in ragged form: padded q ``[B, Sq, H, 576]`` is the ragged q ``[B*Sq, H, 576]``
with row offsets ``b * Sq``. NumPy inputs are copied to the device and the result copied back;
Numba device arrays, torch and CuPy tensors are used in place, and results come back in the
caller's kind of array (torch in, torch out).
"""
import ctypes
import functools
import math
import threading

import numpy as np

from . import _compat  # noqa: F401
from . import factory, heuristics, ptx
from .arrays import BF16, is_device, is_torch
from .caches import D_QK, D_V
from numba import cuda

_SMEM_STATIC_LIMIT = 48 * 1024
_MAX_GRID_X = 2**31 - 1
_tls = threading.local()


# ---------------------------------------------------------------------------------------------
# Arrays
# ---------------------------------------------------------------------------------------------
def _as_device(x, sixteen_bit, shape=None, pairs=False):
    """A Numba device array over x's memory, copying host data. 16-bit floats are seen as
    int16 bits, or as int32 words of two (``pairs``: the last axis halves)."""
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
    d = x if cuda.is_cuda_array(x) and hasattr(x, "copy_to_host") else cuda.as_cuda_array(x)
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


def _empty_like_caller(q, shape, dtype):
    """Output storage of the caller's kind: torch for torch q, else a Numba device array."""
    if is_torch(q):
        import torch

        tdt = {BF16: torch.bfloat16, np.dtype(np.float16): torch.float16,
               np.dtype(np.float32): torch.float32}[np.dtype(dtype)]
        return torch.empty(shape, dtype=tdt, device=q.device)
    if np.dtype(dtype).itemsize == 2:  # allocated as int16 (any dtype Numba knows), seen as dtype
        return cuda.device_array(shape, dtype=np.int16).view(dtype)
    return cuda.device_array(shape, dtype=dtype)


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
        return cuda.device_array(max(nfloats, 1), np.float32)
    pools = getattr(_tls, "workspaces", None)
    if pools is None:
        pools = _tls.workspaces = {}
    pool = pools.get(stream)
    if pool is None or pool.size < nfloats:
        _check_fits(4 * nfloats, what)
        pool = pools[stream] = cuda.device_array(max(nfloats, 1 << 20), np.float32)
    return pool


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
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:  # a torch without it
        return functools.partial(current_stream, q)
    return functools.partial(raw, q.device.index)


_core_streams = {}


def _core_stream(handle):
    """A cuda.core stream object for a raw stream handle (cached: made once per handle)."""
    st = _core_streams.get(handle)
    if st is None:
        from numba.cuda.cudadrv.driver import ExperimentalStream

        st = _core_streams[handle] = ExperimentalStream.from_handle(handle)
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
    once."""
    values, writebacks = [], []
    for ty, val in zip(kernel.argument_types, args):
        kernel._prepare_args(ty, val, 0, writebacks, values)
    if writebacks:  # a host array was copied to the device: later launches would reuse the copy
        raise TypeError("_Launch: the arguments must be device arrays and scalars")
    return _param_array(values)


def _dim3(d):
    d = (d,) if isinstance(d, (int, np.integer)) else tuple(d)
    return tuple(int(x) for x in d) + (1,) * (3 - len(d))


class _Launch:
    """One kernel with its arguments, grid and shared memory, ready to go. On a GPU the kernel
    is compiled and its parameters packed here, once; a call is then a single cuLaunchKernel
    (Numba's ``kernel.launch`` re-packs every argument into ctypes on every call, tens of
    microseconds). The dynamic shared-memory limit is raised once when above 48 KB (Numba has
    no API for it: numba-cuda#94). The simulator keeps Numba's dispatcher."""

    def __init__(self, dispatcher, args, grid, block, smem=0):
        self.args, self.grid, self.block, self.smem = args, grid, block, smem
        self.dispatcher = dispatcher
        self.kernel = self._params = None
        if _compat.SIMULATOR:
            return
        from cuda.bindings import driver as binding
        from numba.core.typing import typeof
        from numba.cuda.cudadrv.driver import driver

        sig = tuple(typeof.typeof(a, typeof.Purpose.argument) for a in args)
        self.kernel = dispatcher.compile(sig)
        fn = self.kernel._codelibrary.get_cufunc()  # loads the module into the context, once
        if smem > _SMEM_STATIC_LIMIT and getattr(self.kernel, "_numba_mla_smem", 0) < smem:
            attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            driver.cuKernelSetAttribute(attr, smem, fn.handle, fn.device.id)
            self.kernel._numba_mla_smem = smem
        if self.kernel.debug or self.kernel.cooperative:
            return  # Numba's launch does their extra work (error readback, cooperative launch)
        # Kept together: the parameter array points into _cvals, and both into self.args' memory.
        self._params, self._cvals = _pack(self.kernel, args)
        self._params_ptr = ctypes.addressof(self._params)
        # A CUkernel handle (Numba loads modules as libraries): the driver launches it in the
        # thread's current context.
        self._func = fn.handle
        self._dims = _dim3(grid) + _dim3(block) + (int(smem),)
        # cuda.bindings: about 0.6 us of Python a call (timed against a stub libcuda), where
        # calling libcuda through ctypes (argtypes set) took about 1.5 us.
        self._enqueue = binding.cuLaunchKernel

    def spills(self):
        """Whether the compiled kernel uses local memory (registers spilled, or a call's
        frame); never in the simulator, which compiles nothing."""
        return self.kernel is not None and self.kernel.local_mem_per_thread > 0

    def __call__(self, stream=0):
        """Enqueue on ``stream`` (a raw handle; 0: the legacy default stream)."""
        if self._params is not None:
            err, = self._enqueue(self._func, *self._dims, stream, self._params_ptr, 0)
            if err:
                self._failed(err, stream)
        elif self.kernel is None:
            self.dispatcher[self.grid, self.block, 0, self.smem](*self.args)
        else:
            self.kernel.launch(self.args, self.grid, self.block, _core_stream(stream), self.smem)

    def _failed(self, err, stream):
        """cuLaunchKernel failed (nothing was enqueued). A thread that has not used CUDA yet has
        no current context (Numba's launch makes one current): make Numba's current and retry
        once; any other failure is raised."""
        from cuda.bindings import driver as binding
        from numba.cuda.cudadrv.driver import CudaAPIError

        res, ctx = binding.cuCtxGetCurrent()
        if not res and not int(ctx):
            cuda.current_context()
            err, = self._enqueue(self._func, *self._dims, stream, self._params_ptr, 0)
            if not err:
                return
        name = binding.cuGetErrorName(err)[1]
        name = name.decode() if isinstance(name, bytes) else getattr(err, "name", str(err))
        gx, gy, gz, bx, by, bz, smem = self._dims
        raise CudaAPIError(int(err), f"cuLaunchKernel: {name} launching "
                                     f"{self.dispatcher.py_func.__name__} (grid {gx}x{gy}x{gz}, "
                                     f"block {bx}x{by}x{bz}, {smem} bytes of dynamic shared "
                                     f"memory, stream {stream:#x})")


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------
def mma_supported():
    """wgmma exists on sm_90 (Hopper) only; the simulator runs the kernel's Python twin."""
    if _compat.SIMULATOR:
        return True
    return cuda.get_current_device().compute_capability == (9, 0)


def resolve_backend(backend, tag):
    """The kernel that runs: ``"auto"`` is the tensor-core kernel for 16-bit data where wgmma
    exists, the FMA kernel otherwise."""
    if backend == "auto":
        return "mma" if tag != "f32" and mma_supported() else "simt"
    if backend == "mma":
        if tag == "f32":
            raise ValueError("backend: 'mma' (tensor cores) needs bfloat16 or float16 data, got "
                             "float32; use 'simt' or 'auto'")
        if not mma_supported():
            cc = cuda.get_current_device().compute_capability
            raise ValueError(f"backend: 'mma' needs an sm_90 GPU (wgmma), got compute capability "
                             f"{cc[0]}.{cc[1]}; use 'simt' or 'auto'")
    return backend


def _aligned16(dev):
    if _compat.SIMULATOR:
        return True
    return dev.__cuda_array_interface__["data"][0] % 16 == 0


# ---------------------------------------------------------------------------------------------
# The plan: everything but the launches, done once
# ---------------------------------------------------------------------------------------------
class Plan:
    """A checked call turned into device arrays and ready launches: ``launch()`` enqueues the
    partition and combine kernels, ``result()`` returns out (and lse) as the caller expects.
    The benchmark times ``launch()`` alone."""

    def __init__(self, call, private_workspace=False):
        from .kernels import combine, mma, seesaw, simple, simt

        self.call = call
        self.stream = current_stream(call.q)
        tag = factory.dtype_tag(call.dtype)
        sixteen = self.sixteen = tag != "f32"
        backend = self.backend = resolve_backend(call.backend, tag)
        # The tensor-core kernel reads q as 16-bit pairs, 16 bytes at a time.
        q_pairs = backend == "mma"
        cache = call.cache
        B, H = call.batch, call.heads

        if call.ragged:
            offs_host = call.q_offsets_host
            q_dev = _as_device(call.q, sixteen, pairs=q_pairs)
            offs_src = call.q_offsets
        else:
            offs_host = (np.arange(B + 1) * call.sq).astype(np.int32)
            q_dev = _as_device(call.q, sixteen, (B * call.sq, H, D_QK), pairs=q_pairs)
            offs_src = offs_host
        T = int(offs_host[-1])
        counts = np.diff(offs_host)
        offs_dev = _int32_device(offs_src, offs_host)

        storage = _as_device(cache.storage, sixteen, pairs=True)  # rows contiguous (caches.py)
        if backend == "mma" and not (_aligned16(q_dev) and _aligned16(storage)):
            if call.backend == "mma":
                raise ValueError("backend: 'mma' copies 16-byte pieces: q and the cache must start "
                                 "at 16-byte aligned addresses; use 'simt' or 'auto'")
            backend = self.backend = "simt"
            q_dev = _as_device(call.q, sixteen, None if call.ragged else (B * call.sq, H, D_QK))
        lengths = _int32_device(cache.lengths, cache.lengths_host)
        if cache.block_table is None:
            block_table = _dummy((1, 1), np.int32)
        else:
            block_table = _int32_device(cache.block_table, cache.block_table_host)
        bias = call.mask.bias_array()
        bias = _dummy((1, 1, 1), np.float32) if bias is None else _as_device(bias, False)

        rows = int(counts.max(initial=0)) * H
        if backend == "mma":
            self.block_m, block_n = mma.BLOCK_M, mma.BLOCK_N
        elif backend == "simple":
            self.block_m, block_n = simple.BLOCK_M, simple.BLOCK_N
        else:
            self.block_m = heuristics.simt_block_m(rows, sixteen)
            block_n = simt.block_n(self.block_m, sixteen)
        groups = max(1, math.ceil(rows / self.block_m))
        P = self.num_partitions = call.num_partitions or heuristics.num_partitions(
            B, groups, heuristics.longest_key_range(call.mask, cache.lengths_host, counts),
            block_n)
        if P > _MAX_GRID_X:
            raise ValueError(f"num_partitions: at most {_MAX_GRID_X} (a grid's x dimension; "
                             f"the workspace alone would not fit in memory), got {P}")

        out_user = call.out
        out_shape3 = (T, H, D_V)
        if out_user is not None and is_device(out_user):
            self.out_dev = _as_device(out_user, sixteen, out_shape3)
            self.result_array = out_user
        elif is_device(call.q):
            self.result_array = _empty_like_caller(call.q, call.out_shape, call.dtype)
            self.out_dev = _as_device(self.result_array, sixteen, out_shape3)
        else:
            self.result_array = None  # host caller: copied back in result()
            self.out_dev = cuda.device_array(out_shape3, np.int16 if sixteen else np.float32)
        self.lse_dev = cuda.device_array((T, H), np.float32)

        self.launches = []
        if T > 0 and B > 0:
            args = (q_dev, offs_dev, storage, block_table, lengths, bias, np.float32(call.scale))
            grid = (P, groups, B)
            # One partition: the kernel writes out and lse itself (no combine).
            direct = P == 1
            if backend == "mma":
                # Tiles by the copy engine (TMA) where a 64-key tile never straddles pages and
                # rows are packed (the tensor maps see q and the cache as [rows, 576]).
                tma = ((cache.kind == "contiguous" or cache.page_size % mma.BLOCK_N == 0)
                       and q_dev.is_c_contiguous() and storage.is_c_contiguous())
                kern = factory.mma_partition_kernel(call.mask, call.score_mod, tag, type(cache),
                                                    H, direct, tma)
                threads, smem = mma.NTHREADS, mma.SMEM_BYTES
                if tma:
                    maps = (ptx.tensor_map(q_dev, T * H, mma.BLOCK_M, mma.BOX, True),
                            ptx.tensor_map(storage, storage.shape[0] * storage.shape[1],
                                           mma.BLOCK_N, mma.BOX, True))
                else:
                    maps = (_dummy((128,), np.uint8),) * 2
            elif backend == "simple":
                kern = factory.simple_partition_kernel(call.mask, call.score_mod, tag,
                                                       type(cache), self.block_m, H, direct)
                threads, smem = simple.NTHREADS, simple.smem_bytes(self.block_m)
                maps = ()
            else:
                kern = factory.partition_kernel(call.mask, call.score_mod, tag, type(cache),
                                                self.block_m, H, direct, _aligned16(storage))
                threads, smem = simt.NTHREADS, simt.smem_bytes(self.block_m, sixteen)
                maps = ()
            if direct:
                results = (self.out_dev.reshape((T, H, 1, D_V)), self.lse_dev.reshape((T, H, 1)))
            else:
                n_out, n_lse = T * H * P * D_V, T * H * P
                ws = _workspace(n_out + n_lse, self.stream, private_workspace)
                results = (ws[:n_out].reshape((T, H, P, D_V)),
                           ws[n_out:n_out + n_lse].reshape((T, H, P)))
            partition = None
            if backend == "mma" and tma:
                # The seesaw kernel where it compiles without spills: beside its 160
                # accumulators a mask with much arithmetic can push it past 255 registers
                # (then the kernel above, whose score fragment is half as large).
                partition = _Launch(factory.seesaw_partition_kernel(
                    call.mask, call.score_mod, tag, type(cache), H, direct),
                    args + results + maps, grid, threads, seesaw.SMEM_BYTES)
                if partition.spills():
                    partition = None
            if partition is None:
                partition = _Launch(kern, args + results + maps, grid, threads, smem)
            self.launches.append(partition)
            if not direct:
                # (partition groups of a combine block; ``groups`` above are row groups)
                merge_groups = combine.split(T * H, P, heuristics.sm_count())
                self.launches.append(_Launch(factory.combine_kernel(tag),
                                             results + (self.out_dev, self.lse_dev),
                                             (T, H), (combine.NTHREADS, merge_groups)))

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
