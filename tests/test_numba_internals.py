"""numba_mla._numba's version check, and the ptx package's public names."""
import pytest

from numba_mla import _numba, ptx
from numba_mla._compat import SIMULATOR


def test_version_check_names_the_supported_range(monkeypatch):
    monkeypatch.setattr(_numba.metadata, "version", lambda dist: "0.29.3")
    with pytest.raises(ImportError, match=r"numba-cuda >= 0\.30; found numba-cuda 0\.29\.3"):
        _numba._check_versions()
    monkeypatch.setattr(_numba.metadata, "version", lambda dist: "0.30.0rc1")
    _numba._check_versions()


def test_version_check_without_numba_cuda(monkeypatch):
    def missing(dist):
        raise _numba.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(_numba.metadata, "version", missing)
    with pytest.raises(ImportError, match="not installed"):
        _numba._check_versions()


def test_every_public_primitive_exists_in_this_mode():
    """Each name of ``ptx.__all__`` is bound; in the simulator to a plain-Python twin (a Numba
    intrinsic there would fail only when a kernel reaches it)."""
    from numba.cuda.extending import intrinsic

    assert len(set(ptx.__all__)) == len(ptx.__all__)
    kinds = {type(getattr(ptx, name)) for name in ptx.__all__}
    gpu_intrinsic = type(intrinsic(lambda typingctx: None))
    if SIMULATOR:
        assert gpu_intrinsic not in kinds
    else:
        assert gpu_intrinsic in kinds
