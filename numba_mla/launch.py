"""From a checked ``Call`` to kernel launches: device views, workspace, grid, split-K.

Every call is run in ragged form: padded q ``[B, Sq, H, 576]`` is the ragged q ``[B*Sq, H, 576]``
with row offsets ``b * Sq``. NumPy inputs are copied to the device and the result copied back;
Numba device arrays, torch and CuPy tensors are used in place, and results come back in the
caller's kind of array (torch in, torch out).
"""
import math
import threading

import numpy as np

from . import _compat  # noqa: F401
from . import factory, heuristics
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
# Compiled kernels, with shared memory above 48 KB
# ---------------------------------------------------------------------------------------------
class _Launch:
    """One kernel with its arguments, grid and shared memory, ready to go. On a GPU it holds
    the compiled kernel and launches it directly (the dispatcher would re-type the arguments on
    every call); the dynamic shared-memory limit is raised once when above 48 KB (Numba has no
    API for it: numba-cuda#94)."""

    def __init__(self, dispatcher, args, grid, block, smem=0):
        self.args, self.grid, self.block, self.smem = args, grid, block, smem
        self.dispatcher = dispatcher
        self.kernel = None
        if not _compat.SIMULATOR:
            from numba.core.typing import typeof

            sig = tuple(typeof.typeof(a, typeof.Purpose.argument) for a in args)
            self.kernel = dispatcher.compile(sig)
            if smem > _SMEM_STATIC_LIMIT and getattr(self.kernel, "_numba_mla_smem", 0) < smem:
                from cuda.bindings import driver as binding
                from numba.cuda.cudadrv.driver import driver

                fn = self.kernel._codelibrary.get_cufunc()
                attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                driver.cuKernelSetAttribute(attr, smem, fn.handle, fn.device.id)
                self.kernel._numba_mla_smem = smem

    def __call__(self, stream=0):
        """Enqueue on ``stream`` (a raw handle; 0: the legacy default stream)."""
        if self.kernel is None:
            self.dispatcher[self.grid, self.block, 0, self.smem](*self.args)
        else:
            self.kernel.launch(self.args, self.grid, self.block, _core_stream(stream), self.smem)


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
        from .kernels import mma, simt
        from .kernels.combine import NTHREADS as COMBINE_THREADS

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

        storage = _as_device(cache.storage, sixteen, pairs=True)
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
        else:
            self.block_m, block_n = heuristics.simt_block_m(rows, sixteen), simt.BLOCK_N
        groups = max(1, math.ceil(rows / self.block_m))
        split = heuristics.num_partitions_waves if backend == "mma" else heuristics.num_partitions
        P = self.num_partitions = call.num_partitions or split(
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
            # One partition on tensor cores: the kernel writes out and lse itself (no combine).
            direct = backend == "mma" and P == 1
            if backend == "mma":
                kern = factory.mma_partition_kernel(call.mask, call.score_mod, tag, type(cache),
                                                    H, direct)
                threads, smem = mma.NTHREADS, mma.SMEM_BYTES
            else:
                kern = factory.partition_kernel(call.mask, call.score_mod, tag, type(cache),
                                                self.block_m, H)
                threads, smem = simt.NTHREADS, simt.smem_bytes(self.block_m, sixteen)
            if direct:
                results = (self.out_dev.reshape((T, H, 1, D_V)), self.lse_dev.reshape((T, H, 1)))
            else:
                n_out, n_lse = T * H * P * D_V, T * H * P
                ws = _workspace(n_out + n_lse, self.stream, private_workspace)
                results = (ws[:n_out].reshape((T, H, P, D_V)),
                           ws[n_out:n_out + n_lse].reshape((T, H, P)))
            self.launches.append(_Launch(kern, args + results, grid, threads, smem))
            if not direct:
                self.launches.append(_Launch(factory.combine_kernel(tag),
                                             results + (self.out_dev, self.lse_dev),
                                             (T, H), COMBINE_THREADS))

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
        self._result = self.plan.result()  # device arrays: the same ones every call, no copy

    def __call__(self):
        self.plan.launch(current_stream(self.q))
        return self._result


def run(call):
    """Run the split-K kernels for a checked call; returns out (and lse)."""
    plan = Plan(call)
    plan.launch()
    return plan.result()
