"""Compiled kernels on disk, so that a new process loads them instead of compiling.

A kernel is keyed by a digest of what makes it: its configuration (the factory's cache key:
mods, dtype, cache kind, tiles, heads), the source of every module of this package, and the
versions of Python, Numba, numba-cuda and llvmlite (Numba adds the GPU architecture). A kernel
built from a user's own Python function (``FunctionMask``, ``FunctionScoreMod``) is not cached
on disk: its code is not part of this package's sources.

Where: ``NUMBA_MLA_CACHE_DIR``, else ``$XDG_CACHE_HOME/numba_mla``, else
``~/.cache/numba_mla``, created private to the user (mode 700). Numba unpickles the index files
it finds there, so a directory that others can write to is refused (with one warning, and
kernels are then compiled in every process). ``NUMBA_MLA_DISK_CACHE=0`` turns the cache off.
"""
import functools
import hashlib
import os
import sys
import warnings
from importlib import metadata

from . import _compat

_USER_FUNCTION_MODS = ("FunctionMask", "FunctionScoreMod")


def cache_dir():
    path = os.environ.get("NUMBA_MLA_CACHE_DIR")
    if not path:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(base, "numba_mla")
    return os.path.join(path, "kernels")


@functools.lru_cache(maxsize=None)
def _usable_dir(path):
    """Create ``path`` private to this user; None (and one warning) if that cannot be done
    or others may write there."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError as e:
        warnings.warn(f"numba_mla: kernel disk cache off ({path}: {e})", RuntimeWarning)
        return None
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
        warnings.warn(f"numba_mla: kernel disk cache off: {path} is writable by other users "
                      f"or not yours (set NUMBA_MLA_CACHE_DIR to a private directory)",
                      RuntimeWarning)
        return None
    return path


@functools.lru_cache(maxsize=None)
def _sources_digest():
    """A hash of this package's sources and of the versions that compile them."""
    h = hashlib.sha256()
    root = os.path.dirname(os.path.abspath(__file__))
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    versions = [sys.version]
    for dist in ("numba", "numba-cuda", "llvmlite"):
        try:
            versions.append(f"{dist}={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist}=?")
    h.update(repr(versions).encode())
    return h.hexdigest()


def _stable(key):
    """Whether a configuration key means the same in every process (no user function)."""
    if isinstance(key, tuple):
        if key and key[0] in _USER_FUNCTION_MODS:
            return False
        return all(_stable(k) for k in key)
    return isinstance(key, (str, int, float, bool, type(None)))


def digest(key):
    return hashlib.sha256((_sources_digest() + repr(key)).encode()).hexdigest()


def attach(dispatcher, key):
    """Give a newly built kernel its disk cache (where enabled and the key is stable)."""
    if not _compat.DISK_CACHE or not _stable(key):
        return dispatcher
    path = _usable_dir(cache_dir())
    if path is None:
        return dispatcher
    from . import _numba

    return _numba.attach_disk_cache(dispatcher, path, digest(key))
