"""Scalar arithmetic that Numba would otherwise compile to a subroutine call.

- ``divmod_u32(a, b)``: ``(a // b, a % b)`` for 0 <= a, 0 < b < 2**31, in 32-bit arithmetic
  (Python's ints make Numba divide in 64 bits, which ptxas turns into a subroutine call; any
  call in a kernel serialises its wgmma instructions).
- ``rcp(x)``: 1/x to within an ulp (``rcp.approx``: an IEEE division is a subroutine call).
- ``exp2_ftz(x)``: 2^x as ``ex2.approx.ftz.f32``, one MUFU instruction; a result below 2^-126
  (a subnormal) is 0. ``math.exp2`` keeps subnormal results at four instructions each
  (a test, two multiplies around the MUFU).
- ``byte_perm(sel)`` -> ``perm(a, b)``: ``prmt.b32`` with the constant selector ``sel``: byte
  k of the result is byte ``(sel >> 4k) & 7`` of the pair (bytes 0-3 of ``a``, 4-7 of ``b``);
  e.g. 0x5140 interleaves the low bytes of two words (a0 b0 a1 b1), 0x7362 the high ones.
- ``row_addr(base, page, rows, slot, nbytes)``: the address ``base + (page rows + slot)
  nbytes`` (a row of a C-contiguous array of ``rows`` rows a page, ``nbytes`` apart), the row
  index in 32-bit arithmetic (page rows + slot < 2**32) and one widening multiply; Python's
  ints would make it a 64-bit product of 64-bit indices.
- ``min_i32(a, b)``, ``lt_i32(a, b)``: ``min(a, b)`` and ``a < b`` of the low 32 bits, as
  32-bit instructions (Numba widens int32 arithmetic to 64 bits, and a comparison or min of
  64-bit sums stays 64-bit: two instructions each, with the carries).
- ``opaque_i32(x)``: ``x`` through a ``mov.b32`` the compiler keeps where it stands (volatile
  asm): what is computed from the result is computed there, not hoisted out of a loop into
  registers held across it.
"""
import numpy as np
from numba.cuda import types

from llvmlite import ir
from numba.cuda.extending import intrinsic

from .._compat import SIMULATOR
from ._codegen import f32_asm, i32, pair
from ._twin import intrinsic_with_twin, with_twin


def _low32(ctx, bld, tys, args):
    """The low 32 bits of each of ``args`` (of types ``tys``)."""
    return [bld.trunc(ctx.cast(bld, v, t, types.int64), i32) for v, t in zip(args, tys)]


def _divmod_u32_twin(a, b):
    return divmod(int(a), int(b))


@intrinsic_with_twin(_divmod_u32_twin)
def divmod_u32(typingctx, a, b):
    sig = types.UniTuple(types.int32, 2)(a, b)

    def cg(ctx, bld, s, args):
        x, y = _low32(ctx, bld, s.args, args)
        quo = bld.udiv(x, y)
        return pair(ctx, bld, s, quo, bld.sub(x, bld.mul(quo, y)))

    return sig, cg


def _rcp_twin(x):
    return np.float32(1.0) / np.float32(x)


rcp = _rcp_twin if SIMULATOR else f32_asm("rcp.approx.f32 $0, $1;", types.float32)


def _exp2_ftz_twin(x):
    with np.errstate(over="ignore", under="ignore"):
        y = np.exp2(np.float32(x), dtype=np.float32)
    return np.float32(0.0) if abs(y) < np.float32(2.0 ** -126) else y


exp2_ftz = _exp2_ftz_twin if SIMULATOR else f32_asm("ex2.approx.ftz.f32 $0, $1;", types.float32)


def _byte_perm_twin(sel):
    shifts = [8 * ((sel >> (4 * k)) & 7) for k in range(4)]  # (bit offsets in b:a)

    def perm(a, b):
        src = (int(a) & 0xFFFFFFFF) | (int(b) & 0xFFFFFFFF) << 32
        v = sum(((src >> s) & 255) << (8 * k) for k, s in enumerate(shifts))
        return v - (1 << 32) if v >> 31 else v

    return perm


@with_twin(_byte_perm_twin)
def byte_perm(sel):
    assert sel & 0x8888 == 0 and 0 <= sel <= 0xFFFF, "selector nibbles 0..7 only"
    text = f"prmt.b32 $0, $1, $2, {sel:#x};"

    @intrinsic
    def perm(typingctx, a, b):
        def cg(ctx, bld, s, args):
            x, y = (bld.trunc(ctx.cast(bld, v, t, types.int64), i32)
                    for v, t in zip(args, s.args))
            return bld.call(ir.InlineAsm(ir.FunctionType(i32, [i32, i32]), text, "=r,r,r"),
                            [x, y])

        return types.int32(a, b), cg

    return perm


def _row_addr_twin(base, page, rows, slot, nbytes):
    return base + (int(page) * int(rows) + int(slot)) % 2 ** 32 * int(nbytes)


@intrinsic_with_twin(_row_addr_twin)
def row_addr(typingctx, base, page, rows, slot, nbytes):
    def cg(ctx, bld, s, args):
        p, r, k = _low32(ctx, bld, s.args[1:4], args[1:4])
        row = bld.zext(bld.add(bld.mul(p, r), k), ir.IntType(64))
        nbytes = ctx.cast(bld, args[4], s.args[4], types.int64)
        return bld.add(ctx.cast(bld, args[0], s.args[0], types.int64), bld.mul(row, nbytes))

    return types.int64(base, page, rows, slot, nbytes), cg


def _i32(x):
    return (int(x) + 2 ** 31) % 2 ** 32 - 2 ** 31


def _min_i32_twin(a, b):
    return min(_i32(a), _i32(b))


def _lt_i32_twin(a, b):
    return _i32(a) < _i32(b)


@intrinsic_with_twin(_min_i32_twin)
def min_i32(typingctx, a, b):
    def cg(ctx, bld, s, args):
        x, y = _low32(ctx, bld, s.args, args)
        return bld.select(bld.icmp_signed("<", x, y), x, y)

    return types.int32(a, b), cg


@intrinsic_with_twin(_lt_i32_twin)
def lt_i32(typingctx, a, b):
    def cg(ctx, bld, s, args):
        x, y = _low32(ctx, bld, s.args, args)
        return bld.icmp_signed("<", x, y)

    return types.boolean(a, b), cg


def _opaque_i32_twin(x):
    return x


@intrinsic_with_twin(_opaque_i32_twin)
def opaque_i32(typingctx, x):
    def cg(ctx, bld, s, args):
        v = bld.trunc(ctx.cast(bld, args[0], s.args[0], types.int64), i32)
        return bld.call(ir.InlineAsm(ir.FunctionType(i32, [i32]), "mov.b32 $0, $1;", "=r,r",
                                     side_effect=True), [v])

    return types.int32(x), cg
