"""Environment shims, applied once before numba.cuda is imported anywhere in the package.

numba-cuda 0.30.4 calls ``np.row_stack``, which NumPy 2.5 removed (numba-cuda#907): every
kernel compile fails with an AttributeError. ``np.vstack`` is the same function, so we alias
it here, the one place the package touches NumPy's namespace. This lets both a fresh install
(NumPy < 2.5) and the GPU image (NumPy 2.5.2) run unchanged.
"""
import os
import sys
import warnings

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack


def gpu_present():
    """Whether this machine has a usable NVIDIA GPU, decided without initialising CUDA (so a
    later fork stays safe) and before numba.cuda is imported: the driver library must load,
    and nvidia-smi (where installed) must list a GPU."""
    import ctypes
    import shutil
    import subprocess

    names = ["nvcuda.dll"] if sys.platform == "win32" else ["libcuda.so.1", "libcuda.so",
                                                            "libcuda.dylib"]
    for name in names:
        try:
            ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return False
    if not shutil.which("nvidia-smi"):
        return True  # a driver without its tool: let Numba find out
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


def use_simulator_without_gpu():
    """Select Numba's CUDA simulator when no GPU is present and nothing chose yet
    (``NUMBA_ENABLE_CUDASIM`` unset). Must run before numba.cuda is first imported. Returns
    whether the simulator is selected."""
    if "NUMBA_ENABLE_CUDASIM" not in os.environ and not gpu_present():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        return True
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


def _choose_simulator_on_import():
    """``import numba_mla`` on a machine without a usable GPU selects Numba's CUDA simulator
    (``notice_simulator`` says so once, at the first kernel launch); ``NUMBA_ENABLE_CUDASIM=1``
    or ``=0`` forces either way, silently. Once numba.cuda has been imported the choice is
    Numba's. Returns (simulator in use, chosen here for want of a GPU)."""
    if "NUMBA_ENABLE_CUDASIM" in os.environ:
        return os.environ["NUMBA_ENABLE_CUDASIM"] == "1", False
    if "numba.cuda" in sys.modules:
        from numba import config

        return bool(config.ENABLE_CUDASIM), False
    if use_simulator_without_gpu():
        return True, True
    return False, False


class SimulatorWarning(RuntimeWarning):
    """Kernels run in Numba's CUDA simulator because no usable GPU was found."""


_noticed = []


def notice_simulator():
    """Warn once per process, at the first kernel launch, when the simulator was chosen for
    want of a GPU (not when the environment chose it)."""
    if AUTO_SIMULATOR and not _noticed:
        _noticed.append(True)
        warnings.warn("numba_mla: no usable CUDA GPU found, so kernels run in Numba's CUDA "
                      "simulator (correct but slow: for learning and tests). Set "
                      "NUMBA_ENABLE_CUDASIM=1 to choose it silently, or =0 to insist on a GPU.",
                      SimulatorWarning, stacklevel=4)


def quiet_simulator_notice():
    """The caller announced the simulator itself (the command line): no warning."""
    _noticed.append(True)


#: True when Numba's CUDA simulator is in use (chosen here, read by numba at import time).
SIMULATOR, AUTO_SIMULATOR = _choose_simulator_on_import()
#: Compiled kernels are also cached on disk (kernel_cache.py). NUMBA_MLA_DISK_CACHE=0 turns it
#: off; the simulator compiles nothing.
DISK_CACHE = not SIMULATOR and os.environ.get("NUMBA_MLA_DISK_CACHE", "1") != "0"
#: Options for the kernels' @cuda.jit (the simulator takes none). lineinfo=True is left out:
#: NVVM 13 rejects these kernels with it (ERROR_COMPILATION, seen on the H200).
JIT_OPTIONS = {}
#: Device functions that must be inlined into straight-line code (NVVM's alwaysinline) for
#: ptxas to interleave their loads with their neighbours' arithmetic.
INLINE = {} if SIMULATOR else dict(forceinline=True)
