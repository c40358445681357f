"""Scalar arithmetic that Numba would otherwise compile to a subroutine call.

- ``divmod_u32(a, b)``: ``(a // b, a % b)`` for 0 <= a, 0 < b < 2**31, in 32-bit arithmetic
  (Python's ints make Numba divide in 64 bits, which ptxas turns into a subroutine call; any
  call in a kernel serialises its wgmma instructions).
- ``rcp(x)``: 1/x to within an ulp (``rcp.approx``: an IEEE division is a subroutine call).
"""
import numpy as np
from numba.cuda import types

from .._compat import SIMULATOR
from ._codegen import f32_asm, i32, pair
from ._twin import intrinsic_with_twin


def _divmod_u32_twin(a, b):
    return divmod(int(a), int(b))


@intrinsic_with_twin(_divmod_u32_twin)
def divmod_u32(typingctx, a, b):
    sig = types.UniTuple(types.int32, 2)(a, b)

    def cg(ctx, bld, s, args):
        x, y = (bld.trunc(ctx.cast(bld, v, t, types.int64), i32) for v, t in zip(args, s.args))
        quo = bld.udiv(x, y)
        return pair(ctx, bld, s, quo, bld.sub(x, bld.mul(quo, y)))

    return sig, cg


def _rcp_twin(x):
    return np.float32(1.0) / np.float32(x)


rcp = _rcp_twin if SIMULATOR else f32_asm("rcp.approx.f32 $0, $1;", types.float32)
