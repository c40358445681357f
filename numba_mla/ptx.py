"""GPU-only primitives and their plain-Python twins for the CUDA simulator.

On a GPU each primitive is a Numba ``@intrinsic`` that emits LLVM IR or inline PTX and is
inlined at its call site. In the simulator (``NUMBA_ENABLE_CUDASIM=1``) ``@intrinsic`` and warp
functions do not exist, so the same names are bound to Python functions with the same results;
the kernels call these names and run unchanged in both places.

16-bit storage (bfloat16, float16) reaches the kernels as int16 views (single elements) or
int32 views (packed pairs, "x2") of the same memory: every array library can make one (torch
has no bf16 in ``__cuda_array_interface__``), and the kernels convert with the primitives here.

Primitives
----------
- ``bf16_to_f32(x)``, ``f16_to_f32(x)``: int16 bits -> float32.
- ``f32_to_bf16(x)``, ``f32_to_f16(x)``: float32 -> int16 bits, round to nearest even.
- ``bf16x2_to_f32(w)``, ``f16x2_to_f32(w)``: int32 word (element 2i low, 2i+1 high) -> 2 floats.
- ``smem_addr(arr)``: the 32-bit shared-memory address of a shared array (0 in the simulator).
  The loads below take ``addr = smem_addr(arr) + byte offset``: 32-bit address arithmetic
  that folds into the instruction's immediate offset, instead of Numba's 64-bit indexing.
- ``lds32(arr, addr)``: one 4-byte element of the shared array ``arr`` (its dtype);
  ``sts32(arr, addr, v)`` stores one.
- ``lds128(arr, addr)``: four float32 in one 16-byte load (``ld.shared.v4``; addr 16-byte
  aligned). With every lane at one address it is a broadcast.
- ``cp_async4(arr, addr, src, i0, i1, i2, valid)``: start copying the 4-byte ``src[i0, i1, i2]``
  into the shared ``arr`` at ``addr`` without passing through registers (``cp.async``); zeros
  when not ``valid`` (nothing is read). ``cp_async_commit()`` closes a group of copies,
  ``cp_async_wait_all()`` waits for this thread's groups; a barrier then publishes them.
- ``shfl_xor(v, mask, tid)``: the float32 ``v`` of lane ``lane ^ mask`` (full warp). ``tid`` is
  the thread's index in its block (the simulator needs it to find the warp).
- ``syncwarp(tid)``: the warp's barrier: shared-memory accesses before it are seen by every
  lane after it.
"""
import threading

import ml_dtypes
import numpy as np

from ._compat import SIMULATOR

if SIMULATOR:

    def bf16_to_f32(x):
        return float(np.int16(x).view(ml_dtypes.bfloat16))

    def f16_to_f32(x):
        return float(np.int16(x).view(np.float16))

    def f32_to_bf16(x):
        return np.float32(x).astype(ml_dtypes.bfloat16).view(np.int16)

    def f32_to_f16(x):
        return np.float32(x).astype(np.float16).view(np.int16)

    def bf16x2_to_f32(w):
        lo, hi = np.array([w], np.int32).view(ml_dtypes.bfloat16)
        return float(lo), float(hi)

    def f16x2_to_f32(w):
        lo, hi = np.array([w], np.int32).view(np.float16)
        return float(lo), float(hi)

    def smem_addr(arr):
        return 0

    def lds32(arr, addr):
        return arr[addr // 4]

    def sts32(arr, addr, v):
        arr[addr // 4] = v

    def lds128(arr, addr):
        i = addr // 4
        return arr[i], arr[i + 1], arr[i + 2], arr[i + 3]

    def cp_async4(arr, addr, src, i0, i1, i2, valid):
        arr[addr // 4] = src[i0, i1, i2] if valid else 0

    def cp_async_commit():
        pass

    def cp_async_wait_all():
        pass

    # Warp exchange: the simulator runs a block's threads as Python threads, one block at a
    # time; the 32 threads of a warp meet at a barrier, publish their values, read a partner's.
    _warps = {}
    _warps_lock = threading.Lock()

    def _warp(tid):
        with _warps_lock:
            if tid // 32 not in _warps:
                _warps[tid // 32] = (threading.Barrier(32), [None] * 32)
            return _warps[tid // 32]

    def syncwarp(tid):
        _warp(tid)[0].wait()

    def shfl_xor(v, mask, tid):
        lane = tid % 32
        barrier, slots = _warp(tid)
        slots[lane] = v
        barrier.wait()
        r = slots[lane ^ mask]
        barrier.wait()  # nobody overwrites a slot before every lane has read
        return r

else:
    from llvmlite import ir
    from numba import cuda
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    _i16, _i32, _i64, _f32 = ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()

    def _to_i16(b, v):
        return b.trunc(v, _i16) if v.type != _i16 else v

    @intrinsic
    def bf16_to_f32(typingctx, x):
        # bfloat16 is the top half of a float32: zero-extend, shift up 16, reinterpret.
        def cg(ctx, b, sig, args):
            return b.bitcast(b.shl(b.zext(_to_i16(b, args[0]), _i32), ir.Constant(_i32, 16)), _f32)

        return types.float32(x), cg

    @intrinsic
    def f16_to_f32(typingctx, x):
        def cg(ctx, b, sig, args):
            return b.fpext(b.bitcast(_to_i16(b, args[0]), ir.HalfType()), _f32)

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

    def _pair(ctx, b, sig, lo, hi):
        return ctx.make_tuple(b, sig.return_type, [lo, hi])

    @intrinsic
    def bf16x2_to_f32(typingctx, w):
        def cg(ctx, b, sig, args):
            v = ctx.cast(b, args[0], sig.args[0], types.int32)
            lo = b.bitcast(b.shl(v, ir.Constant(_i32, 16)), _f32)
            hi = b.bitcast(b.and_(v, ir.Constant(_i32, -65536)), _f32)
            return _pair(ctx, b, sig, lo, hi)

        return types.UniTuple(types.float32, 2)(w), cg

    @intrinsic
    def f16x2_to_f32(typingctx, w):
        def cg(ctx, b, sig, args):
            v = ctx.cast(b, args[0], sig.args[0], types.int32)
            half = ir.HalfType()
            lo = b.fpext(b.bitcast(b.trunc(v, _i16), half), _f32)
            hi = b.fpext(b.bitcast(b.trunc(b.lshr(v, ir.Constant(_i32, 16)), _i16), half), _f32)
            return _pair(ctx, b, sig, lo, hi)

        return types.UniTuple(types.float32, 2)(w), cg

    def _shared_addr(b, ptr):
        """32-bit shared-window address of a generic pointer into shared memory."""
        g = b.ptrtoint(ptr, _i64)
        cvta = ir.InlineAsm(ir.FunctionType(_i64, [_i64]), "cvta.to.shared.u64 $0, $1;", "=l,l")
        return b.trunc(b.call(cvta, [g]), _i32)

    def _item_ptr(ctx, b, aryty, ary, idx_vals, idx_types):
        arr = ctx.make_array(aryty)(ctx, b, value=ary)
        inds = [ctx.cast(b, v, t, types.intp) for v, t in zip(idx_vals, idx_types)]
        return cgutils.get_item_pointer(ctx, b, aryty, arr, inds)

    @intrinsic
    def smem_addr(typingctx, arr):
        def cg(ctx, b, sig, args):
            data = ctx.make_array(sig.args[0])(ctx, b, value=args[0]).data
            return _shared_addr(b, data)

        return types.uint32(arr), cg

    def _addr32(ctx, b, v, ty):
        return b.trunc(ctx.cast(b, v, ty, types.int64), _i32)

    # Loads are side_effect asm: they stay on their side of the barriers that order the
    # stores they read.
    @intrinsic
    def lds32(typingctx, arr, addr):
        def cg(ctx, b, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(_i32, [_i32]), "ld.shared.b32 $0, [$1];", "=r,r",
                               side_effect=True)
            r = b.call(asm, [_addr32(ctx, b, args[1], sig.args[1])])
            return b.bitcast(r, _f32) if sig.return_type == types.float32 else r

        return arr.dtype(arr, addr), cg

    @intrinsic
    def sts32(typingctx, arr, addr, v):
        def cg(ctx, b, sig, args):
            x = ctx.cast(b, args[2], sig.args[2], sig.args[0].dtype)
            if x.type != _i32:
                x = b.bitcast(x, _i32)
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_i32, _i32]),
                               "st.shared.b32 [$0], $1;", "r,r,~{memory}", side_effect=True)
            b.call(asm, [_addr32(ctx, b, args[1], sig.args[1]), x])
            return ctx.get_dummy_value()

        return types.void(arr, addr, v), cg

    @intrinsic
    def lds128(typingctx, arr, addr):
        sig = types.UniTuple(types.float32, 4)(arr, addr)

        def cg(ctx, b, s, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([_f32] * 4), [_i32]),
                               "ld.shared.v4.f32 {$0,$1,$2,$3}, [$4];", "=f,=f,=f,=f,r",
                               side_effect=True)
            r = b.call(asm, [_addr32(ctx, b, args[1], s.args[1])])
            return ctx.make_tuple(b, s.return_type, [b.extract_value(r, k) for k in range(4)])

        return sig, cg

    @intrinsic
    def cp_async4(typingctx, arr, addr, src, i0, i1, i2, valid):
        sig = types.void(arr, addr, src, i0, i1, i2, valid)

        def cg(ctx, b, s, args):
            gptr = _item_ptr(ctx, b, s.args[2], args[2], args[3:6], s.args[3:6])
            cvta = ir.InlineAsm(ir.FunctionType(_i64, [_i64]), "cvta.to.global.u64 $0, $1;", "=l,l")
            gaddr = b.call(cvta, [b.ptrtoint(gptr, _i64)])
            ok = ctx.cast(b, args[6], s.args[6], types.boolean)
            nbytes = b.select(ok, ir.Constant(_i32, 4), ir.Constant(_i32, 0))  # 0: zero-fill
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_i32, _i64, _i32]),
                               "cp.async.ca.shared.global [$0], [$1], 4, $2;", "r,l,r,~{memory}",
                               side_effect=True)
            b.call(asm, [_addr32(ctx, b, args[1], s.args[1]), gaddr, nbytes])
            return ctx.get_dummy_value()

        return sig, cg

    def _void_asm(text):
        @intrinsic
        def _impl(typingctx):
            def cg(ctx, b, sig, args):
                b.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}",
                                    side_effect=True), [])
                return ctx.get_dummy_value()

            return types.void(), cg

        return _impl

    cp_async_commit = _void_asm("cp.async.commit_group;")
    cp_async_wait_all = _void_asm("cp.async.wait_group 0;")

    @cuda.jit(device=True)
    def shfl_xor(v, mask, tid):
        return cuda.shfl_xor_sync(0xFFFFFFFF, v, mask)

    @cuda.jit(device=True)
    def syncwarp(tid):
        cuda.syncwarp(0xFFFFFFFF)
