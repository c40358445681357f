"""LLVM IR helpers shared by the primitives' code generators (GPU only; the simulator's twins
use none of this).

A codegen function receives Numba's lowering context ``ctx``, an llvmlite builder ``b``, the
signature and the argument values; it returns the result's LLVM value. Inline PTX is an
``ir.InlineAsm`` call: ``side_effect=True`` keeps it in place (the barriers and the other
asm it is ordered with) and alive, and a ``~{memory}`` clobber keeps memory accesses from
moving across it.
"""
from llvmlite import ir
from numba.cuda import types
from numba.cuda.extending import intrinsic

from .._numba import element_pointers

i16, i32, i64, f32 = ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()


def addr32(ctx, b, v, ty):
    """An integer argument (a shared address, a barrier id, a count) as a 32-bit value."""
    return b.trunc(ctx.cast(b, v, ty, types.int64), i32)


def pair(ctx, b, sig, lo, hi):
    """The 2-tuple return value ``(lo, hi)``."""
    return ctx.make_tuple(b, sig.return_type, [lo, hi])


def shared_window(b, ptr):
    """The 32-bit shared-window address of a generic pointer into shared memory."""
    g = b.ptrtoint(ptr, i64)
    cvta = ir.InlineAsm(ir.FunctionType(i64, [i64]), "cvta.to.shared.u64 $0, $1;", "=l,l")
    return b.trunc(b.call(cvta, [g]), i32)


def global_window(b, ptr):
    """The global-window address (64-bit integer) of a generic pointer."""
    cvta = ir.InlineAsm(ir.FunctionType(i64, [i64]), "cvta.to.global.u64 $0, $1;", "=l,l")
    return b.call(cvta, [b.ptrtoint(ptr, i64)])


def void_asm(text):
    """An intrinsic without arguments or result that emits ``text`` (a fence, a commit, a
    wait), ordered with memory accesses."""

    @intrinsic
    def _impl(typingctx):
        def cg(ctx, b, sig, args):
            b.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}",
                                side_effect=True), [])
            return ctx.get_dummy_value()

        return types.void(), cg

    return _impl


def f32_asm(text, result):
    """An intrinsic of one number, converted to float32, whose value is the inline PTX ``text``
    ($0 the result, $1 the argument) of Numba type ``result`` (float32, or int16 bits)."""
    lltype, con = {types.float32: (f32, "f"), types.int16: (i16, "h")}[result]

    @intrinsic
    def _impl(typingctx, x):
        def cg(ctx, b, sig, args):
            v = ctx.cast(b, args[0], sig.args[0], types.float32)
            asm = ir.InlineAsm(ir.FunctionType(lltype, [f32]), text, f"={con},f")
            return b.call(asm, [v])

        return result(x), cg

    return _impl


def acc_pointers(ctx, b, aryty, ary, n, start=0):
    """Pointers to ``n`` floats of an accumulator array from element ``start`` (a
    ``cuda.local.array`` indexed only by constants, so it lives in registers)."""
    return element_pointers(ctx, b, aryty, ary, n, start)


def tied_asm(b, ptrs, text, in_types, in_cons, ins):
    """Call asm whose first len(ptrs) operands are the accumulators (read-write, "+f"
    written as outputs tied to inputs), then ``ins``; store the results back."""
    n = len(ptrs)
    cons = ",".join(["=f"] * n + in_cons + [str(i) for i in range(n)] + ["~{memory}"])
    fty = ir.FunctionType(ir.LiteralStructType([f32] * n), in_types + [f32] * n)
    r = b.call(ir.InlineAsm(fty, text, cons, side_effect=True),
               ins + [b.load(p) for p in ptrs])
    for i, p in enumerate(ptrs):
        b.store(b.extract_value(r, i), p)
