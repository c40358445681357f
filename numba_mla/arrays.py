"""What an input array is, wherever it lives: NumPy, Numba device arrays, torch, CuPy.

The checks and the reference need only shape, dtype and (for small integer arrays such as
lengths) the values; none of these functions copies a large array.
"""
import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
#: The storage dtypes q, the cache and out may share.
IO_DTYPES = (BF16, np.dtype(np.float16), np.dtype(np.float32))


def _torch_dtype_to_numpy(tdtype):
    import torch

    table = {
        torch.bfloat16: BF16,
        torch.float16: np.dtype(np.float16),
        torch.float32: np.dtype(np.float32),
        torch.float64: np.dtype(np.float64),
        torch.int32: np.dtype(np.int32),
        torch.int64: np.dtype(np.int64),
        torch.int16: np.dtype(np.int16),
        torch.uint8: np.dtype(np.uint8),
        torch.bool: np.dtype(np.bool_),
    }
    if hasattr(torch, "float8_e4m3fn"):  # FP8 caches
        table[torch.float8_e4m3fn] = np.dtype(ml_dtypes.float8_e4m3fn)
    return table.get(tdtype)


_TORCH_TYPES = {}  # type -> whether it is a torch tensor type (asked on every call: cached)


def is_torch(x):
    t = type(x)
    known = _TORCH_TYPES.get(t)
    if known is None:
        known = _TORCH_TYPES[t] = t.__module__.startswith("torch") and hasattr(x, "is_cuda")
    return known


def data_ptr(x):
    """The device address of a device array's first element (torch, CuPy, Numba)."""
    if is_torch(x):
        return x.data_ptr()
    return x.__cuda_array_interface__["data"][0]


def is_array(x):
    """Anything we accept as an array argument."""
    return (
        isinstance(x, np.ndarray)
        or is_torch(x)
        or hasattr(x, "__cuda_array_interface__")
        or hasattr(x, "__dlpack__")
    )


def dtype_of(x):
    """NumPy dtype of any accepted array (torch bf16 -> ml_dtypes.bfloat16); None if unknown."""
    if is_torch(x):
        return _torch_dtype_to_numpy(x.dtype)
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    try:
        return np.dtype(dt)
    except TypeError:
        return None


def shape_of(x):
    return tuple(int(n) for n in x.shape)


def is_device(x):
    """True for memory the GPU can use in place (Numba device arrays, CUDA torch/CuPy)."""
    if isinstance(x, np.ndarray):
        return False
    if is_torch(x):
        return bool(x.is_cuda)
    # CUDA array interface (Numba, CuPy); the simulator's device arrays have copy_to_host only
    return hasattr(x, "__cuda_array_interface__") or hasattr(x, "copy_to_host")


def strides_of(x):
    """Strides in bytes of a device array; None means C-contiguous (CUDA array interface)."""
    if is_torch(x):
        return tuple(int(s) * x.element_size() for s in x.stride())
    cai = getattr(x, "__cuda_array_interface__", None) or {}
    strides = cai.get("strides")
    return None if strides is None else tuple(int(s) for s in strides)


def last_axis_contiguous(x):
    """Whether the last axis's elements are adjacent in memory (NumPy input counts as such: it is
    copied to a contiguous device array before use)."""
    if isinstance(x, np.ndarray) or shape_of(x)[-1] <= 1:
        return True
    strides = strides_of(x)
    return strides is None or strides[-1] == dtype_of(x).itemsize


def to_host(x):
    """A NumPy copy (or view, for NumPy input) of any accepted array."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch(x):
        import torch

        t = x.detach()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).cpu().numpy().view(BF16)
        if t.dtype == getattr(torch, "float8_e4m3fn", None):
            return t.view(torch.uint8).cpu().numpy().view(ml_dtypes.float8_e4m3fn)
        return t.cpu().numpy()
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    if hasattr(x, "get"):  # CuPy
        return x.get()
    return np.asarray(x)
