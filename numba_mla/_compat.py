"""Environment shims, applied once before numba.cuda is imported anywhere in the package.

numba-cuda 0.30.4 calls ``np.row_stack``, which NumPy 2.5 removed (numba-cuda#907): every
kernel compile fails with an AttributeError. ``np.vstack`` is the same function, so we alias
it here, the one place the package touches NumPy's namespace. This lets both a fresh install
(NumPy < 2.5) and the GPU image (NumPy 2.5.2) run unchanged.
"""
import os

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

#: True when Numba's CUDA simulator is in use (read by numba at import time).
SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
#: Compiled kernels are also cached on disk (Numba's cache, keyed by the kernel's source and
#: its closure: the mods and tile sizes), so a new process loads them instead of compiling.
#: NUMBA_MLA_DISK_CACHE=0 turns it off; the simulator compiles nothing.
DISK_CACHE = not SIMULATOR and os.environ.get("NUMBA_MLA_DISK_CACHE", "1") != "0"
#: Options for the kernels' @cuda.jit (the simulator takes none). lineinfo=True is left out:
#: NVVM 13 rejects these kernels with it (ERROR_COMPILATION, seen on the H200).
JIT_OPTIONS = {} if SIMULATOR else dict(cache=DISK_CACHE)
#: Device functions that must be inlined into straight-line code (NVVM's alwaysinline) for
#: ptxas to interleave their loads with their neighbours' arithmetic.
INLINE = {} if SIMULATOR else dict(forceinline=True)


def gpu_present():
    """Whether this machine has a usable NVIDIA GPU, asked of nvidia-smi so that numba.cuda
    is not imported (the simulator switch must come before that import)."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return False
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


def use_simulator_without_gpu():
    """Select Numba's CUDA simulator when no GPU is present and nothing chose yet. Call it
    before numba.cuda is first imported (test configuration, command line)."""
    if "NUMBA_ENABLE_CUDASIM" not in os.environ and not gpu_present():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
