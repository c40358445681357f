"""Test configuration: puts ``tests/helpers.py`` on the import path (``from helpers import ...``),
gives every test its own seeded random generator, and skips the ``gpu``-marked tests unless a
real GPU is present (on the GPU machine: ``python -m pytest -m gpu``).

Without a GPU (``nvidia-smi`` finds none) the CUDA simulator is selected here, before numba.cuda
is first imported; ``NUMBA_ENABLE_CUDASIM`` set in the environment takes precedence.
"""
import os
import sys
import warnings
import zlib

import numpy as np
import pytest


def _select_simulator_without_gpu():
    """Without a GPU, Numba's CUDA simulator runs the kernels. The choice must come before
    numba.cuda is first imported, and importing numba_mla imports it: so numba_mla/_compat.py
    is loaded on its own, from wherever the package is installed, without running the package."""
    import importlib.util

    pkg = importlib.util.find_spec("numba_mla")
    path = os.path.join(os.path.dirname(pkg.origin), "_compat.py")
    spec = importlib.util.spec_from_file_location("_numba_mla_compat_probe", path)
    mod = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():  # its import-time notice is for users, not test runs
        warnings.simplefilter("ignore")
        spec.loader.exec_module(mod)
    mod.use_simulator_without_gpu()


_select_simulator_without_gpu()
sys.path.insert(0, os.path.dirname(__file__))

#: Set NUMBA_MLA_SEED to draw different data; by default each test's data is fixed by its id,
#: so a failure reproduces.
BASE_SEED = int(os.environ.get("NUMBA_MLA_SEED", "0"))


@pytest.fixture
def rng(request):
    seed = zlib.crc32(request.node.nodeid.encode()) ^ BASE_SEED
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)


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


#: CI's time budget (12 minutes on 2 cores, the simulator): these matrices keep their first N
#: cases there, and the cases below run only where ``slow`` tests run (every test runs on the
#: GPU machine). Each path they reach is reached in CI by a cheaper case: the FMA kernel for
#: the tensor-core one (whose simulated warpgroups are the slowest thing in the suite), the
#: first cases of a matrix for the rest of it. The warp tensor-core kernel (a simulated warp
#: exchange for each of its ~250 mma.sync and ldmatrix a warp a tile) keeps two factor cases
#: in CI, one tile each, one of them split three ways; its runs of several tiles run on the GPU
#: machine (test_split_paths).
SIMULATOR_BUDGET = {
    "tests/test_dcp.py::test_sharded_decode_matches_whole_cache": 7,
    "tests/test_kernels.py::test_warp_split_k_each_factor": 4,
    "tests/test_kernels.py::test_simt_warp_split_k_each_factor": 2,
    "tests/test_kernels.py::test_simple_kernel_each_factor": 6,
    "tests/test_kernels.py::test_mma_sync_kernel_each_factor": 2,
    "tests/test_fp8.py::test_fp8_kernel": 5,
}
SIMULATOR_SLOW = (
    "tests/test_dcp.py::test_sharded_decode_tensor_cores",
    "tests/test_plans.py::test_plain_call_reuses_its_plan[mma]",
    "tests/test_plans.py::test_values_changed_on_the_device_stay_in_bounds[mma-False]",
    "tests/test_plans.py::test_values_changed_on_the_device_stay_in_bounds[mma_sync-False]",
    "tests/test_plans.py::test_ragged_device_offsets_are_not_read[simple]",
    "tests/test_plans.py::test_ragged_device_offsets_are_not_read[mma",
    "tests/test_plans.py::test_device_offsets_out_of_range_stay_in_bounds[simple]",
    "tests/test_plans.py::test_device_offsets_out_of_range_stay_in_bounds[mma",
    "tests/test_max.py::test_ragged_cache_kernels[mma]",
    "tests/test_schedule.py::test_balanced_schedule_kernels[mma-chunk2]",
    "tests/test_split_paths.py::test_split_path[mma-ragged_three_parts]",
    "tests/test_split_paths.py::test_listed_schedule[ragged]",
    "tests/test_split_paths.py::test_split_path[mma_sync-runs_of_tiles]",
    "tests/test_split_paths.py::test_split_path[mma_sync-ragged_three_parts]",
    "tests/test_split_paths.py::test_split_path[mma_sync-sixteen_parts]",
    "tests/test_kernels.py::test_mma_sync_32_rows[(1, 2, 20",
    "tests/test_fp8.py::test_fp8_mma_sync_32_rows",
    "tests/test_fp8.py::test_fp8_mma_sync_two_raw_stages[32",
    "tests/test_fp8.py::test_fp8_mma_kernel[float16",
)


def _mark_slow_in_the_simulator(items):
    seen = {}
    slow = pytest.mark.slow
    for item in items:
        base = item.nodeid.split("[")[0]
        if base in SIMULATOR_BUDGET:
            seen[base] = seen.get(base, 0) + 1
            if seen[base] > SIMULATOR_BUDGET[base]:
                item.add_marker(slow)
        if item.nodeid.startswith(SIMULATOR_SLOW):
            item.add_marker(slow)


@pytest.hookimpl(tryfirst=True)  # before ``-m "not slow"`` deselects
def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run only on a real GPU (``pytest -m gpu`` there); elsewhere they
    are skipped with the reason shown, and the cases over CI's budget are marked ``slow``.
    Tests marked ``simulator`` call device functions as plain Python: on a GPU they are
    skipped (the kernels that use those functions are tested there instead)."""
    if not real_gpu():
        _mark_slow_in_the_simulator(items)
    on_gpu = real_gpu()
    if on_gpu:  # device functions called as Python run only in the simulator
        skip = pytest.mark.skip(reason="calls device functions as Python: the simulator only")
        for item in items:
            if "simulator" in item.keywords:
                item.add_marker(skip)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not on_gpu:
        skip = pytest.mark.skip(reason="needs a real CUDA GPU (numba.cuda.is_available(), "
                                       "not the simulator)")
        for item in gpu_items:
            item.add_marker(skip)


_controller = True  # False in an xdist worker (whose reports the controller logs once)


def pytest_configure(config):
    global _controller
    _controller = not hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    """``NUMBA_MLA_FAILOG=path``: each failure's report is appended to ``path`` as it happens,
    so a run cut short by a time limit (the GPU machine's) still says what failed and why."""
    path = os.environ.get("NUMBA_MLA_FAILOG")
    if path and report.failed and _controller:
        with open(path, "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n")
