"""The partition kernels built for sm_90a without a GPU (scripts/build_check.py): no spills,
no call; for the tensor-core kernels no serialised wgmma and their HGMMA in the SASS (40 in the
lockstep kernel, 32 in the seesaw); the warp tensor-core kernel built for sm_80 and sm_89 with
its mma.sync and their HMMA. Needs NVVM and nvJitLink (``pip install "numba-cuda[cu13]"
nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm``, about 830 MB, not in CI); skipped where they
are missing. Run it on every change to a kernel: ``python -m pytest -m build``."""
import os

import pytest
from helpers import run_build_script

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "build_check.py")


@pytest.mark.build
def test_partition_kernels_build_for_sm90a():
    run_build_script(SCRIPT)
