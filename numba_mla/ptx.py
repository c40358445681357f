"""GPU-only primitives and their plain-Python twins for the CUDA simulator.

On a GPU each primitive is a Numba ``@intrinsic`` that emits LLVM IR or inline PTX and is
inlined at its call site. In the simulator (``NUMBA_ENABLE_CUDASIM=1``) ``@intrinsic`` does not
run, so the same name is bound to a Python function with identical results; the kernels call
these names and run unchanged in both places.

16-bit storage (bfloat16, float16) reaches the kernels as int16 views of the same memory: every
array library can make one (torch has no bf16 in ``__cuda_array_interface__``), and the kernels
convert with the primitives below.
"""
import ml_dtypes
import numpy as np

from ._compat import SIMULATOR

if SIMULATOR:

    def bf16_to_f32(x):
        """int16 bits of a bfloat16 -> float32."""
        return float(np.int16(x).view(ml_dtypes.bfloat16))

    def f16_to_f32(x):
        """int16 bits of a float16 -> float32."""
        return float(np.int16(x).view(np.float16))

    def f32_to_bf16(x):
        """float32 -> int16 bits of the nearest bfloat16 (ties to even)."""
        return np.float32(x).astype(ml_dtypes.bfloat16).view(np.int16)

    def f32_to_f16(x):
        """float32 -> int16 bits of the nearest float16 (ties to even)."""
        return np.float32(x).astype(np.float16).view(np.int16)

else:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    _i16, _i32, _f32 = ir.IntType(16), ir.IntType(32), ir.FloatType()

    @intrinsic
    def bf16_to_f32(typingctx, x):
        # bfloat16 is the top half of a float32: zero-extend, shift up 16, reinterpret.
        def cg(ctx, b, sig, args):
            v = b.trunc(args[0], _i16) if args[0].type != _i16 else args[0]
            return b.bitcast(b.shl(b.zext(v, _i32), ir.Constant(_i32, 16)), _f32)

        return types.float32(x), cg

    @intrinsic
    def f16_to_f32(typingctx, x):
        def cg(ctx, b, sig, args):
            v = b.trunc(args[0], _i16) if args[0].type != _i16 else args[0]
            return b.fpext(b.bitcast(v, ir.HalfType()), _f32)

        return types.float32(x), cg

    @intrinsic
    def f32_to_bf16(typingctx, x):
        def cg(ctx, b, sig, args):
            v = ctx.cast(b, args[0], sig.args[0], types.float32)
            asm = ir.InlineAsm(ir.FunctionType(_i16, [_f32]), "cvt.rn.bf16.f32 $0, $1;", "=h,f")
            return b.call(asm, [v])

        return types.int16(x), cg

    @intrinsic
    def f32_to_f16(typingctx, x):
        def cg(ctx, b, sig, args):
            v = ctx.cast(b, args[0], sig.args[0], types.float32)
            return b.bitcast(b.fptrunc(v, ir.HalfType()), _i16)

        return types.int16(x), cg
