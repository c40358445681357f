"""The tensor-core kernel built for sm_90a without a GPU (scripts/build_check.py): no spills,
no call, no serialised wgmma, 40 HGMMA in the SASS. Needs NVVM and nvJitLink
(``pip install "numba-cuda[cu13]" nvidia-cuda-cuobjdump``, about 830 MB, not in CI); skipped
where they are missing. Run it on every change to the kernel: ``python -m pytest -m build``."""
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "build_check.py")


@pytest.mark.build
def test_mma_kernel_builds_for_sm90a():
    python = os.environ.get("NUMBA_MLA_BUILD_PYTHON", sys.executable)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([python, SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    if r.returncode == 77:
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0, r.stdout + r.stderr
