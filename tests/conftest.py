"""Test configuration: puts ``tests/helpers.py`` on the import path (``from helpers import ...``)
and gives every test its own seeded random generator.

Run the suite without a GPU with ``NUMBA_ENABLE_CUDASIM=1`` (read when numba.cuda is first
imported, so it must be set in the environment, not here).
"""
import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

#: Set NUMBA_MLA_SEED to draw different data; by default each test's data is fixed by its id,
#: so a failure reproduces.
BASE_SEED = int(os.environ.get("NUMBA_MLA_SEED", "0"))


@pytest.fixture
def rng(request):
    seed = zlib.crc32(request.node.nodeid.encode()) ^ BASE_SEED
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "kernel: runs the kernels (the CUDA simulator in CI, the GPU when there is one)")


def real_gpu():
    """A CUDA GPU is present and Numba is not simulating one."""
    from numba import config

    if config.ENABLE_CUDASIM:
        return False
    from numba import cuda

    try:
        return cuda.is_available()
    except Exception:  # no driver at all
        return False


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run only on a real GPU (``pytest -m gpu`` there); elsewhere they
    are skipped with the reason shown."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not real_gpu():
        skip = pytest.mark.skip(reason="needs a real CUDA GPU (numba.cuda.is_available(), "
                                       "not the simulator)")
        for item in gpu_items:
            item.add_marker(skip)
