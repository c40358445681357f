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
