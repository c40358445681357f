"""16-bit floats (bfloat16, float16) to and from float32.

16-bit storage reaches the kernels as int16 views (single elements) or int32 views (packed
pairs, "x2") of the same memory: every array library can make one (torch has no bf16 in
``__cuda_array_interface__``), and the kernels convert with these.

- ``bf16_to_f32(x)``, ``f16_to_f32(x)``: int16 bits -> float32.
- ``f32_to_bf16(x)``, ``f32_to_f16(x)``: float32 -> int16 bits, round to nearest even.
- ``bf16x2_to_f32(w)``, ``f16x2_to_f32(w)``: int32 word (element 2i low, 2i+1 high) -> 2 floats.
- ``pack_bf16x2(lo, hi)``, ``pack_f16x2(lo, hi)``: two floats -> one int32 word of 16-bit pairs
  (round to nearest even), ``lo`` in the low half.
- ``i32_as_f32(w)``: the float32 whose bits are the int32 ``w`` (a scale stored in a word);
  ``f32_as_i32(x)``: the int32 whose bits are the float32 ``x`` (a word kept in a float's
  register).
- ``e4m3x4_to_f32(w)``: int32 word of four float8_e4m3fn codes (byte k is element k) -> four
  floats, exactly (a NaN code gives NaN). ``pack_e4m3x4(x0, x1, x2, x3)``: four floats -> one
  word of codes, round to nearest even, saturating at +-448 (NaN stays NaN). PTX
  ``cvt.rn.f16x2.e4m3x2`` / ``cvt.rn.satfinite.e4m3x2.f32``: sm_89 and later.
- ``e4m3x4_to_bf16x4(w)``, ``e4m3x4_to_f16x4(w)``: the four codes of ``w`` as two words of
  16-bit pairs (codes 0, 1 in the first), exactly (a NaN code gives NaN), without a round
  trip through a rounding step: ``cvt.rn.f16x2.e4m3x2`` (float16 pairs as they come;
  bfloat16 through float32 and ``cvt.rn.bf16x2.f32``, exact since every e4m3 value is a
  bfloat16 value).
"""
import functools

import ml_dtypes
import numpy as np
from llvmlite import ir
from numba.cuda import types
from numba.cuda.extending import intrinsic

from .._compat import SIMULATOR
from ._codegen import f32, f32_asm, i16, i32, pair
from ._twin import intrinsic_with_twin


def _to_i16(b, v):
    return b.trunc(v, i16) if v.type != i16 else v


# The twins decode by table: every code of a 16- or 8-bit float type, its value as a Python
# float (exact), so that a conversion is an index, not a NumPy array made and viewed (the
# simulated FMA kernel converts every key word it reads).
@functools.lru_cache(maxsize=None)
def _values(dtype):
    """(Simulator) The value of every code of the 8- or 16-bit float ``dtype``, by code."""
    bits = np.dtype(dtype).itemsize * 8
    with np.errstate(invalid="ignore"):  # (NaN codes: NaN)
        return np.arange(2 ** bits, dtype=f"uint{bits}").view(dtype).astype(np.float64).tolist()


def _bf16_to_f32_twin(x):
    return _values(ml_dtypes.bfloat16)[int(x) & 0xFFFF]


@intrinsic_with_twin(_bf16_to_f32_twin)
def bf16_to_f32(typingctx, x):
    # bfloat16 is the top half of a float32: zero-extend, shift up 16, reinterpret.
    def cg(ctx, b, sig, args):
        return b.bitcast(b.shl(b.zext(_to_i16(b, args[0]), i32), ir.Constant(i32, 16)), f32)

    return types.float32(x), cg


def _f16_to_f32_twin(x):
    return _values(np.float16)[int(x) & 0xFFFF]


@intrinsic_with_twin(_f16_to_f32_twin)
def f16_to_f32(typingctx, x):
    def cg(ctx, b, sig, args):
        return b.fpext(b.bitcast(_to_i16(b, args[0]), ir.HalfType()), f32)

    return types.float32(x), cg


def _f32_to_bf16_twin(x):
    return np.float32(x).astype(ml_dtypes.bfloat16).view(np.int16)


f32_to_bf16 = (_f32_to_bf16_twin if SIMULATOR
               else f32_asm("cvt.rn.bf16.f32 $0, $1;", types.int16))


def _f32_to_f16_twin(x):
    return np.float32(x).astype(np.float16).view(np.int16)


@intrinsic_with_twin(_f32_to_f16_twin)
def f32_to_f16(typingctx, x):
    def cg(ctx, b, sig, args):
        v = ctx.cast(b, args[0], sig.args[0], types.float32)
        return b.bitcast(b.fptrunc(v, ir.HalfType()), i16)

    return types.int16(x), cg


def _unpack_twin(dtype):
    values = _values(dtype)

    def unpack(w):
        w = int(w)
        return values[w & 0xFFFF], values[(w >> 16) & 0xFFFF]

    return unpack


def _unpack(halves):
    """An intrinsic: an int32 word of two 16-bit floats -> (lo, hi) float32s, the two LLVM
    values made by ``halves(b, word)``."""

    @intrinsic
    def unpack(typingctx, w):
        def cg(ctx, b, sig, args):
            return pair(ctx, b, sig, *halves(b, ctx.cast(b, args[0], sig.args[0], types.int32)))

        return types.UniTuple(types.float32, 2)(w), cg

    return unpack


def _bf16_halves(b, v):
    # bfloat16 is the top half of a float32: the low half shifted up, the high half masked.
    return (b.bitcast(b.shl(v, ir.Constant(i32, 16)), f32),
            b.bitcast(b.and_(v, ir.Constant(i32, -65536)), f32))


def _f16_halves(b, v):
    half = ir.HalfType()
    return (b.fpext(b.bitcast(b.trunc(v, i16), half), f32),
            b.fpext(b.bitcast(b.trunc(b.lshr(v, ir.Constant(i32, 16)), i16), half), f32))


bf16x2_to_f32 = _unpack_twin(ml_dtypes.bfloat16) if SIMULATOR else _unpack(_bf16_halves)
f16x2_to_f32 = _unpack_twin(np.float16) if SIMULATOR else _unpack(_f16_halves)


def _pack_twin(dtype):
    def pack(lo, hi):
        return np.array([lo, hi], np.float32).astype(dtype).view(np.int32)[0]

    return pack


def _pack(text):
    @intrinsic
    def pack(typingctx, lo, hi):
        def cg(ctx, b, sig, args):
            lo_, hi_ = (ctx.cast(b, a, t, types.float32) for a, t in zip(args, sig.args))
            asm = ir.InlineAsm(ir.FunctionType(i32, [f32, f32]), text, "=r,f,f")
            return b.call(asm, [hi_, lo_])  # cvt packs its first source in the high half

        return types.int32(lo, hi), cg

    return pack


pack_bf16x2 = (_pack_twin(ml_dtypes.bfloat16) if SIMULATOR
               else _pack("cvt.rn.bf16x2.f32 $0, $1, $2;"))
pack_f16x2 = _pack_twin(np.float16) if SIMULATOR else _pack("cvt.rn.f16x2.f32 $0, $1, $2;")


def _bitcast(src, dst, np_src, np_dst, py):
    """(the primitive, its twin): the ``dst`` whose bits are the ``src`` argument's (Numba
    types; the twin views through NumPy's ``np_src`` and ``np_dst`` and gives a ``py``)."""
    def twin(x):
        return py(np.array([x], np_src).view(np_dst)[0])

    ll = {types.int32: i32, types.float32: f32}[dst]

    @intrinsic_with_twin(twin)
    def bitcast(typingctx, x):
        def cg(ctx, b, sig, args):
            return b.bitcast(ctx.cast(b, args[0], sig.args[0], src), ll)

        return dst(x), cg

    return bitcast, twin


i32_as_f32, _i32_as_f32_twin = _bitcast(types.int32, types.float32, np.int32, np.float32, float)
f32_as_i32, _f32_as_i32_twin = _bitcast(types.float32, types.int32, np.float32, np.int32, int)


def _e4m3x4_to_f32_twin(w):
    values, w = _values(ml_dtypes.float8_e4m3fn), int(w)
    return values[w & 255], values[(w >> 8) & 255], values[(w >> 16) & 255], values[(w >> 24) & 255]


@intrinsic_with_twin(_e4m3x4_to_f32_twin)
def e4m3x4_to_f32(typingctx, w):
    # Each half word (two codes) to a half2 (exact: e4m3 values are float16 values), then each
    # half to float32.
    text = ("{.reg .b16 q0, q1, h0, h1, h2, h3; .reg .b32 p0, p1;"
            " mov.b32 {q0, q1}, $4;"
            " cvt.rn.f16x2.e4m3x2 p0, q0; cvt.rn.f16x2.e4m3x2 p1, q1;"
            " mov.b32 {h0, h1}, p0; mov.b32 {h2, h3}, p1;"
            " cvt.f32.f16 $0, h0; cvt.f32.f16 $1, h1; cvt.f32.f16 $2, h2; cvt.f32.f16 $3, h3;}")

    return types.UniTuple(types.float32, 4)(w), _word_to_tuple(text, f32, "f", 4)


def _word_to_tuple(text, ty, letter, n):
    """The codegen of an asm ``text`` that takes one int32 word (``$n``) and gives ``n``
    values of LLVM type ``ty`` (constraint ``letter``), returned as a tuple."""
    def cg(ctx, b, sig, args):
        v = ctx.cast(b, args[0], sig.args[0], types.int32)
        asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([ty] * n), [i32]), text,
                           ",".join([f"={letter}"] * n + ["r"]))
        r = b.call(asm, [v])
        return ctx.make_tuple(b, sig.return_type, [b.extract_value(r, k) for k in range(n)])

    return cg


def _pack_e4m3x4_twin(x0, x1, x2, x3):
    x = np.clip(np.array([x0, x1, x2, x3], np.float32), -448.0, 448.0)
    return int(x.astype(ml_dtypes.float8_e4m3fn).view(np.int32)[0])


@intrinsic_with_twin(_pack_e4m3x4_twin)
def pack_e4m3x4(typingctx, x0, x1, x2, x3):
    # cvt packs its first source in the high byte of each half word.
    text = ("{.reg .b16 lo, hi;"
            " cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;"
            " mov.b32 $0, {lo, hi};}")

    def cg(ctx, b, sig, args):
        xs = [ctx.cast(b, a, t, types.float32) for a, t in zip(args, sig.args)]
        asm = ir.InlineAsm(ir.FunctionType(i32, [f32] * 4), text, "=r,f,f,f,f")
        return b.call(asm, xs)

    return types.int32(x0, x1, x2, x3), cg


@functools.lru_cache(maxsize=None)
def _e4m3_as(dtype):
    """(Simulator) The ``dtype`` (16-bit) code of the value of every e4m3 code, by code."""
    values = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    with np.errstate(invalid="ignore"):
        return values.astype(np.float32).astype(dtype).view(np.uint16).astype(int).tolist()


def _signed32(v):
    return v - (1 << 32) if v >> 31 else v


def _e4m3x4_to_16x4_twin(dtype):
    def convert(w):
        codes, w = _e4m3_as(dtype), int(w)
        return (_signed32(codes[w & 255] | codes[(w >> 8) & 255] << 16),
                _signed32(codes[(w >> 16) & 255] | codes[(w >> 24) & 255] << 16))

    return convert


def _e4m3x4_to_16x4_text(tag):
    # Each half word (two codes) to a half2 (exact), kept (float16) or through two floats into
    # a bfloat16 pair (exact: every e4m3 value is a bfloat16 value).
    head = "{.reg .b16 q0, q1, h0, h1; .reg .b32 p; .reg .f32 f0, f1; mov.b32 {q0, q1}, $2;"
    if tag == "f16":
        return head + " cvt.rn.f16x2.e4m3x2 $0, q0; cvt.rn.f16x2.e4m3x2 $1, q1;}"
    return head + "".join(
        f" cvt.rn.f16x2.e4m3x2 p, q{k}; mov.b32 {{h0, h1}}, p; cvt.f32.f16 f0, h0;"
        f" cvt.f32.f16 f1, h1; cvt.rn.bf16x2.f32 ${k}, f1, f0;" for k in range(2)) + "}"


def _make_e4m3x4_to_16x4(tag, dtype):
    text = _e4m3x4_to_16x4_text(tag)

    @intrinsic_with_twin(_e4m3x4_to_16x4_twin(dtype))
    def convert(typingctx, w):
        return types.UniTuple(types.int32, 2)(w), _word_to_tuple(text, i32, "r", 2)

    return convert


e4m3x4_to_bf16x4 = _make_e4m3x4_to_16x4("bf16", ml_dtypes.bfloat16)
e4m3x4_to_f16x4 = _make_e4m3x4_to_16x4("f16", np.float16)
