"""The one module that touches Numba's private internals.

It checks the installed numba / numba-cuda version on import and raises a clear ImportError
naming the supported range. Everything else in the package uses Numba's public API
(``numba.cuda``, ``numba.cuda.types``, ``numba.cuda.extending.intrinsic``) and takes what lies
beyond it from here, so that a numba-cuda release that moves an internal breaks one file, in
one visible place.

Sections: the version check; the code-generation helpers of ``numba_mla.ptx``.
"""
import re
from importlib import metadata

from . import _compat  # noqa: F401  (must run before numba.cuda is imported)

# ---------------------------------------------------------------------------------------------
# Version check
# ---------------------------------------------------------------------------------------------
#: The oldest numba-cuda release known to work: 0.30 is the one proven so far (0.30.4, on the
#: H200 and in the simulator). The packaging work will establish the true lower bound; raise or
#: lower this constant with it.
MIN_NUMBA_CUDA = (0, 30)


def _release(version):
    """(major, minor) of a version string such as "0.30.4" or "0.31.0rc1"."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _check_versions():
    need = ".".join(map(str, MIN_NUMBA_CUDA))
    try:
        found = metadata.version("numba-cuda")
    except metadata.PackageNotFoundError:
        raise ImportError(f"numba_mla needs numba-cuda >= {need} (pip install numba-cuda); "
                          "it is not installed (Numba's own numba.cuda is not supported)") from None
    if _release(found) < MIN_NUMBA_CUDA:
        raise ImportError(f"numba_mla needs numba-cuda >= {need}; found numba-cuda {found} "
                          f'(pip install -U "numba-cuda>={need}")')


_check_versions()

# ---------------------------------------------------------------------------------------------
# numba_mla.ptx: code generation inside @intrinsic
# ---------------------------------------------------------------------------------------------
# An @intrinsic's codegen receives Numba's lowering context and an llvmlite builder. The
# context's cast / make_tuple / get_dummy_value are the vocabulary Numba's intrinsic examples
# use; what follows reaches further: into the array data model (the struct behind an array
# argument) and the typing errors. Tested with numba-cuda 0.30.
from numba.cuda import cgutils  # noqa: E402
from numba.cuda.core.errors import TypingError  # noqa: E402, F401  (re-exported)
from numba.cuda import types  # noqa: E402


def array_data(ctx, builder, aryty, ary):
    """The pointer to element 0 of the array value ``ary`` of Numba type ``aryty``."""
    return ctx.make_array(aryty)(ctx, builder, value=ary).data


def element_pointers(ctx, builder, aryty, ary, n, start=0):
    """Pointers to elements start..start+n-1 of a 1-D array (constant offsets: an array
    indexed only so stays in registers)."""
    data = array_data(ctx, builder, aryty, ary)
    return [cgutils.gep(builder, data, start + i) for i in range(n)]


def item_pointer(ctx, builder, aryty, ary, idx_vals, idx_types):
    """The pointer to ``ary[idx...]`` (indices as LLVM values of Numba types ``idx_types``),
    with Numba's own index arithmetic (strides, no bounds check)."""
    arr = ctx.make_array(aryty)(ctx, builder, value=ary)
    inds = [ctx.cast(builder, v, t, types.intp) for v, t in zip(idx_vals, idx_types)]
    return cgutils.get_item_pointer(ctx, builder, aryty, arr, inds)
