"""The partition kernels built for sm_90a without a GPU (scripts/build_check.py): no local
memory (spills or a stack frame, but the warp split-K's known one), no call; for the
tensor-core kernels no serialised wgmma and their HGMMA in the SASS (40 in the lockstep
kernel; 160 in the seesaw, 32 with S's loop; on "e4m3" rows 48, 160 with ``S8_UNROLL``, 32
with the converter warpgroup); the warp tensor-core kernel built for sm_80 and sm_89 with
its mma.sync and their HMMA. Needs NVVM and nvJitLink (``pip install "numba-cuda[cu13]"
nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm``, about 830 MB, not in CI); skipped where they
are missing. Run it on every change to a kernel: ``python -m pytest -m build -n 4`` (its
parts in parallel)."""
import os

import pytest
from helpers import run_build_script

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "build_check.py")
PARTS = 8  # (all in one process took 15 minutes on the 2-core machine, near its 900 s limit)


@pytest.mark.build
@pytest.mark.parametrize("part", range(PARTS))
def test_partition_kernels_build_for_sm90a(part):
    """Every PARTS-th kernel of the script's order, from the part-th."""
    run_build_script(SCRIPT, "--part", f"{part}/{PARTS}")


@pytest.mark.build
def test_only_some_kernels_and_their_sass(tmp_path):
    """``--only seesaw --sass DIR`` builds the seesaw kernel's cases alone and writes each
    one's SASS, its HGMMA in it, into a file named by its report line."""
    run_build_script(SCRIPT, "--only", "seesaw", "--sass", str(tmp_path))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files and all(f.startswith("seesaw_") and f.endswith(".sass") for f in files), files
    assert any("H=128" in f for f in files), files
    for f in tmp_path.iterdir():
        assert "HGMMA" in f.read_text(), f.name
