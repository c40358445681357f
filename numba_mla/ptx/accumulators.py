"""Tensor-core accumulators held in registers: the fragment layout, and whole-accumulator
operations written out element by element.

A warpgroup's ``wgmma`` (wgmma.py) accumulates D[64 x N] in fp32 registers spread over its 128
threads: element i of thread t's N/2 floats (w = t // 32, lane = t % 32) is D[row, col] with
    row = 16*w + lane//4 + 8*((i//2) % 2),   col = 8*(i//4) + 2*(lane % 4) + i % 2
A warp's ``mma.sync`` m16n8k16 tiles (mma_sync.py) held at i = 0, 4, 8, ... have warp 0's part
of the same layout, so the operations below serve both.

The kernels hold accumulators in ``cuda.local.array``s whose every index is a compile-time
constant, so they live in registers; a loop over 128 elements is not always unrolled (the array
would then live in local memory), hence the written-out forms.

- ``acc_row(i, wtid)``, ``acc_col(i, wtid)``: the row and column of element i of thread
  ``wtid`` (its index in the warpgroup).
- ``acc_zero(n)`` -> ``zero(acc)``: acc[:n] = 0.
- ``acc_scale(n)`` -> ``scale(acc, a0, a1)``: rows of the fragment's upper and lower 8 times
  a0 and a1; ``acc_scale_halves(n)`` -> ``scale(acc, a0, a1, a2, a3)``: the same with a0, a1
  for acc[:n/2] and a2, a3 for acc[n/2:] (two m16 tiles of mma.sync accumulators).
- ``acc_scale_cols(n, nacc)`` -> ``scale(acc, f)``: every column of each product's fragment
  (``nacc`` elements a product, n / nacc products) times its factor: element i times
  ``f[2 * (k // 4) + k % 2]``, k = i % nacc (``f``: a local array of nacc / 2 floats, the
  thread's columns).
- ``acc_store(n)`` -> ``store(acc, arr, addr, row_bytes)``: element i to ``addr +
  8*((i//2)%2)*row_bytes + 4*(8*(i//4) + i%2)``, i.e. the fragment into a float32 row-major
  shared array whose thread-dependent origin is the shared address ``addr`` (8-byte aligned:
  elements i, i + 1 of even i go in one 8-byte store). A warp's store covers 8 rows of 32
  bytes: with ``row_bytes`` a multiple of 128 they fall in the same 8 banks (8 passes where 2
  do); a pitch of 128 k + 32 bytes spreads them over all 32.
- ``acc_store16(n, tag)`` -> ``store(acc, arr, addr, row_bytes)``: the same fragment as 16-bit
  values (``tag`` "bf16" or "f16", rounded to nearest even), into rows of 16-bit values
  (``arr``: the shared array, of any 4-byte type):
  elements i, i + 1 of even i, packed, to ``addr + 8*((i//2)%2)*row_bytes + 2*(8*(i//4))``
  (4-byte aligned). A warp's store covers 8 rows of 16 bytes: a pitch of 128 k + 16 bytes
  puts them in all 32 banks.
"""
import ml_dtypes
import numpy as np
from llvmlite import ir
from numba import cuda
from numba.cuda import types
from numba.cuda.extending import intrinsic

from ._codegen import acc_pointers, addr32, f32, i32
from .shared import _aligned
from ._twin import with_twin


def _acc_row(i, wtid):
    return 16 * (wtid // 32) + (wtid % 32) // 4 + 8 * ((i // 2) % 2)


def _acc_col(i, wtid):
    return 8 * (i // 4) + 2 * (wtid % 4) + i % 2


# Plain arithmetic: the same device functions run in the simulator (the wgmma twin calls the
# Python functions on index arrays).
acc_row = cuda.jit(device=True)(_acc_row)
acc_col = cuda.jit(device=True)(_acc_col)


def _acc_zero_twin(n):
    def zero(acc):
        acc[:n] = 0

    return zero


@with_twin(_acc_zero_twin)
def acc_zero(n):
    @intrinsic
    def zero(typingctx, acc):
        def cg(ctx, b, sig, args):
            for p in acc_pointers(ctx, b, sig.args[0], args[0], n):
                b.store(ir.Constant(f32, 0.0), p)
            return ctx.get_dummy_value()

        return types.void(acc), cg

    return zero


def _acc_scale_twin(n):
    def scale(acc, a0, a1):
        for i in range(n):
            acc[i] *= a0 if (i // 2) % 2 == 0 else a1

    return scale


@with_twin(_acc_scale_twin)
def acc_scale(n):
    @intrinsic
    def scale(typingctx, acc, a0, a1):
        def cg(ctx, b, sig, args):
            a = [ctx.cast(b, v, t, types.float32) for v, t in zip(args[1:], sig.args[1:])]
            for i, p in enumerate(acc_pointers(ctx, b, sig.args[0], args[0], n)):
                b.store(b.fmul(b.load(p), a[(i // 2) % 2]), p)
            return ctx.get_dummy_value()

        return types.void(acc, a0, a1), cg

    return scale


def _acc_scale_halves_twin(n):
    def scale(acc, a0, a1, a2, a3):
        for i in range(n):
            acc[i] *= (a0, a1, a2, a3)[2 * (i // (n // 2)) + (i // 2) % 2]

    return scale


@with_twin(_acc_scale_halves_twin)
def acc_scale_halves(n):
    @intrinsic
    def scale(typingctx, acc, a0, a1, a2, a3):
        def cg(ctx, b, sig, args):
            a = [ctx.cast(b, v, t, types.float32) for v, t in zip(args[1:], sig.args[1:])]
            for i, p in enumerate(acc_pointers(ctx, b, sig.args[0], args[0], n)):
                b.store(b.fmul(b.load(p), a[2 * (i // (n // 2)) + (i // 2) % 2]), p)
            return ctx.get_dummy_value()

        return types.void(acc, a0, a1, a2, a3), cg

    return scale


def _acc_scale_cols_twin(n, nacc):
    def scale(acc, f):
        for i in range(n):
            k = i % nacc
            acc[i] *= f[2 * (k // 4) + k % 2]

    return scale


@with_twin(_acc_scale_cols_twin)
def acc_scale_cols(n, nacc):
    @intrinsic
    def scale(typingctx, acc, f):
        def cg(ctx, b, sig, args):
            fs = [b.load(p) for p in acc_pointers(ctx, b, sig.args[1], args[1], nacc // 2)]
            for i, p in enumerate(acc_pointers(ctx, b, sig.args[0], args[0], n)):
                k = i % nacc
                b.store(b.fmul(b.load(p), fs[2 * (k // 4) + k % 2]), p)
            return ctx.get_dummy_value()

        return types.void(acc, f), cg

    return scale


def _acc_offset(i, row_bytes):
    return 8 * ((i // 2) % 2) * row_bytes + 4 * (8 * (i // 4) + i % 2)


def _acc_store_twin(n):
    def store(acc, arr, addr, row_bytes):
        for i in range(0, n, 2):  # as the GPU form: 8-byte stores, which must be aligned
            k = _aligned(addr + _acc_offset(i, row_bytes), 8, "acc_store")
            arr[k], arr[k + 1] = acc[i], acc[i + 1]

    return store


def _pair_stores(n, text, elem_bytes):
    """The GPU form of the fragment stores: an intrinsic ``store(acc, arr, addr, row_bytes)``
    that runs the inline PTX ``text`` ($0 the shared address, $1 and $2 elements i and i + 1)
    for each even i at ``addr + 8*((i//2)%2)*row_bytes + elem_bytes*(8*(i//4))``."""

    @intrinsic
    def store(typingctx, acc, arr, addr, row_bytes):
        def cg(ctx, b, sig, args):
            base = addr32(ctx, b, args[2], sig.args[2])
            rb = addr32(ctx, b, args[3], sig.args[3])
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, f32, f32]), text,
                               "r,f,f,~{memory}", side_effect=True)
            ptrs = acc_pointers(ctx, b, sig.args[0], args[0], n)
            for i in range(0, n, 2):  # (i, i + 1): adjacent columns of one row
                row = b.mul(rb, ir.Constant(i32, 8 * ((i // 2) % 2)))
                off = b.add(row, ir.Constant(i32, elem_bytes * (8 * (i // 4))))
                b.call(asm, [b.add(base, off), b.load(ptrs[i]), b.load(ptrs[i + 1])])
            return ctx.get_dummy_value()

        return types.void(acc, arr, addr, row_bytes), cg

    return store


@with_twin(_acc_store_twin)
def acc_store(n):
    return _pair_stores(n, "st.shared.v2.f32 [$0], {$1, $2};", 4)


def _acc_store16_twin(n, tag):
    dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}[tag]

    def store(acc, arr, addr, row_bytes):
        for i in range(0, n, 2):  # a 4-byte store of the pair, as the GPU form
            off = 8 * ((i // 2) % 2) * row_bytes + 2 * (8 * (i // 4))
            k = _aligned(addr + off, 4, "acc_store16")
            np.asarray(arr).view(np.int32)[k] = (
                np.array([acc[i], acc[i + 1]], np.float32).astype(dtype).view(np.int32)[0])

    return store


@with_twin(_acc_store16_twin)
def acc_store16(n, tag):
    # cvt packs its first source in the high half: element i + 1 (the higher address)
    cvt = {"bf16": "cvt.rn.bf16x2.f32", "f16": "cvt.rn.f16x2.f32"}[tag]
    return _pair_stores(n, f"{{ .reg .b32 w; {cvt} w, $2, $1; st.shared.b32 [$0], w; }}", 2)
