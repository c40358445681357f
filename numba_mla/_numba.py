"""The one module that touches private internals: Numba's (and one of torch's).

numba-cuda has no public API for a few things this library needs: the thin launch path (one
``cuLaunchKernel`` over parameters packed once), shared memory above 48 KB (numba-cuda#94), a
stream object for a raw handle, and inline PTX (numba-cuda#532, in ptx/). Everything of that
kind is imported here, behind small functions, so that a numba-cuda upgrade breaks one file,
and the installed version is checked on import with a clear message.
"""
from importlib import metadata

#: The oldest numba-cuda whose internals this module was checked against.
MIN_NUMBA_CUDA = (0, 30)


def _version(dist):
    try:
        text = metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None, None
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts), text


def check_versions():
    """Raise ImportError naming the supported range when numba-cuda is too old (its private
    launch and stream internals differ there)."""
    have, text = _version("numba-cuda")
    if have is not None and have < MIN_NUMBA_CUDA:
        need = ".".join(map(str, MIN_NUMBA_CUDA))
        raise ImportError(f"numba_mla needs numba-cuda >= {need} (found {text}): "
                          f"pip install -U 'numba-cuda>={need}'")


check_versions()


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
