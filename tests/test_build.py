"""The partition kernels built for sm_90a without a GPU (scripts/build_check.py): no spills,
no call; for the tensor-core kernels no serialised wgmma and their HGMMA in the SASS (40 in the
lockstep kernel, 32 in the seesaw). Needs NVVM and nvJitLink
(``pip install "numba-cuda[cu13]" nvidia-cuda-cuobjdump``, about 830 MB, not in CI); skipped
where they are missing. Run it on every change to the kernel: ``python -m pytest -m build``."""
import os

import pytest
from helpers import run_build_script

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "build_check.py")


@pytest.mark.build
def test_partition_kernels_build_for_sm90a():
    run_build_script(SCRIPT)
