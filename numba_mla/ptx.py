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
  The simulator's twins check that each access is aligned to its size (a GPU faults).
- ``lds32(arr, addr)``: one 4-byte element of the shared array ``arr`` (its dtype);
  ``sts32(arr, addr, v)`` stores one.
- ``lds64(arr, addr)``, ``lds128(arr, addr)``: two or four consecutive elements of ``arr``
  (float32 or int32) in one 8- or 16-byte load (``ld.shared.v2``/``.v4``; addr aligned to
  the load's size). Lanes at one address share a broadcast. ``sts128(arr, addr, v0, v1,
  v2, v3)`` stores four floats at a 16-byte aligned ``addr`` of a float32 shared array.
- ``cp_async4(arr, addr, src, i0, i1, i2, valid)``: start copying the 4-byte ``src[i0, i1, i2]``
  into the shared ``arr`` at ``addr`` without passing through registers (``cp.async``); zeros
  when not ``valid`` (nothing is read). ``cp_async_commit()`` closes a group of copies,
  ``cp_async_wait_all()`` waits for this thread's groups; a barrier then publishes them.
- ``shfl_xor(v, mask, tid)``: the float32 ``v`` of lane ``lane ^ mask`` (full warp). ``tid`` is
  the thread's index in its block (the simulator needs it to find the warp).
- ``warp_uniform(v, tid)``: ``v``, which the caller knows is the same in every lane, read
  from lane 0, so ptxas knows it too: values derived from it (e.g. wgmma descriptors that
  depend on the warpgroup) then live in uniform registers, not moved there one by one.
- ``syncwarp(tid)``: the warp's barrier: shared-memory accesses before it are seen by every
  lane after it.
- ``bar_sync(barrier_id, nthreads)``: named barrier ``barrier_id`` (1..15; 0 is the block's)
  for the ``nthreads`` threads (whole warps) that use it, e.g. one warpgroup.
  ``bar_arrive(barrier_id, nthreads)`` counts the calling warp's arrival without waiting: a
  producer signals "written" (its shared-memory writes before it are seen by the threads
  that ``bar_sync`` on the same barrier), and moves on; the waiters' ``bar_sync`` counts too.
- ``rcp(x)``: 1/x to within an ulp (``rcp.approx``: an IEEE division is a subroutine call).
- ``divmod_u32(a, b)``: ``(a // b, a % b)`` for 0 <= a, 0 < b < 2**31, in 32-bit arithmetic
  (Python's ints make Numba divide in 64 bits, which ptxas turns into a subroutine call; any
  call in a kernel serialises its wgmma instructions).
"""
import ctypes
import threading

import ml_dtypes
import numpy as np

from ._compat import SIMULATOR
from numba import cuda, uint64

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

    def _aligned(addr, nbytes, what, space="shared address"):
        """The 4-byte element index of byte address ``addr``. A GPU faults on an access not
        aligned to its size; here, with the base at 0 (shared memory) or aligned (the
        arrays), the offset shows it, so the simulator fails where the GPU would."""
        if addr % nbytes:
            raise RuntimeError(f"{what}: {space} {addr} is not {nbytes}-byte aligned")
        return addr // 4

    def lds32(arr, addr):
        return arr[_aligned(addr, 4, "lds32")]

    def sts32(arr, addr, v):
        arr[_aligned(addr, 4, "sts32")] = v

    def lds64(arr, addr):
        i = _aligned(addr, 8, "lds64")
        return arr[i], arr[i + 1]

    def lds128(arr, addr):
        i = _aligned(addr, 16, "lds128")
        return arr[i], arr[i + 1], arr[i + 2], arr[i + 3]

    def sts128(arr, addr, v0, v1, v2, v3):
        i = _aligned(addr, 16, "sts128")
        arr[i], arr[i + 1], arr[i + 2], arr[i + 3] = v0, v1, v2, v3

    def _cp_async(words):
        def copy(arr, addr, src, i0, i1, i2, valid):
            i = _aligned(addr, 4 * words, "cp_async")
            for j in range(words):
                arr[i + j] = src[i0, i1, i2 + j] if valid else 0

        return copy

    cp_async4 = _cp_async(1)

    class _GlobalAddr:
        """The simulator's global address: an array and a byte offset into its C-order data."""

        def __init__(self, src, byte):
            self.src, self.byte = src, byte

        def __add__(self, nbytes):
            return _GlobalAddr(self.src, self.byte + int(nbytes))

        def word(self, j):
            i = self.byte // self.src.dtype.itemsize + j
            return self.src[np.unravel_index(i, self.src.shape)]

    def global_addr(src, i0, i1, i2):
        return _GlobalAddr(src, int(np.ravel_multi_index((i0, i1, i2), src.shape))
                           * src.dtype.itemsize)

    def _cp_async_at(words):
        def copy(arr, addr, gaddr, valid):
            i = _aligned(addr, 4 * words, "cp_async")
            _aligned(gaddr.byte, 4 * words, "cp_async", "global offset")
            for j in range(words):
                arr[i + j] = gaddr.word(j) if valid else 0

        return copy

    def cp_async_commit():
        pass

    def divmod_u32(a, b):
        return divmod(int(a), int(b))

    def rcp(x):
        return np.float32(1.0) / np.float32(x)

    def cp_async_wait_all():
        pass

    # Warp exchange: the simulator runs a block's threads as Python threads, one block at a
    # time; the 32 threads of a warp meet at a barrier, publish their values, read a partner's.
    # Two slot buffers used in turn make one barrier per exchange enough: a lane writes a
    # buffer again only two exchanges later, after a barrier every lane passes having read it.
    # Each lane counts its exchanges (all lanes of a warp make the same ones, so they agree on
    # the buffer).
    _warps = {}
    _warps_lock = threading.Lock()

    def _warp(tid):
        with _warps_lock:
            if tid // 32 not in _warps:
                _warps[tid // 32] = (threading.Barrier(32), ([None] * 32, [None] * 32), [0] * 32)
            return _warps[tid // 32]

    def syncwarp(tid):
        _warp(tid)[0].wait()

    class _Named:
        """A named barrier: ``nthreads`` arrivals complete a phase; ``sync`` arrives and waits
        for its phase to complete, ``arrive`` only counts."""

        def __init__(self, nthreads):
            self.n, self.count, self.phase = nthreads, 0, 0
            self.cv = threading.Condition()

        def _arrive(self):
            self.count += 1
            if self.count == self.n:
                self.count, self.phase = 0, self.phase + 1
                self.cv.notify_all()

        def arrive(self):
            with self.cv:
                self._arrive()

        def sync(self):
            with self.cv:
                phase = self.phase
                self._arrive()
                self.cv.wait_for(lambda: self.phase != phase)

    _named = {}

    def _named_barrier(barrier_id, nthreads):
        with _warps_lock:  # (the simulator runs one block at a time)
            key = barrier_id, nthreads
            if key not in _named:
                _named[key] = _Named(nthreads)
            return _named[key]

    def bar_sync(barrier_id, nthreads):
        _named_barrier(barrier_id, nthreads).sync()

    def bar_arrive(barrier_id, nthreads):
        _named_barrier(barrier_id, nthreads).arrive()

    def warp_uniform(v, tid):
        return v  # the same in every lane, by the caller's word

    def shfl_xor(v, mask, tid):
        lane = tid % 32
        barrier, buffers, turns = _warp(tid)
        slots = buffers[turns[lane] % 2]
        turns[lane] += 1
        slots[lane] = v
        barrier.wait()
        return slots[lane ^ mask]

else:
    from llvmlite import ir
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

    def _lds_vector(n):
        """``ld.shared.v<n>``: n consecutive 4-byte elements of the shared array (its dtype,
        float32 or int32) in one load."""
        regs = ",".join(f"${k}" for k in range(n))

        def typer(typingctx, arr, addr):
            sig = types.UniTuple(arr.dtype, n)(arr, addr)
            f = arr.dtype == types.float32
            ty, c = (_f32, "f") if f else (_i32, "r")
            text = f"ld.shared.v{n}.{'f32' if f else 'b32'} {{{regs}}}, [${n}];"

            def cg(ctx, b, s, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([ty] * n), [_i32]),
                                   text, ",".join([f"={c}"] * n + ["r"]), side_effect=True)
                r = b.call(asm, [_addr32(ctx, b, args[1], s.args[1])])
                return ctx.make_tuple(b, s.return_type, [b.extract_value(r, k) for k in range(n)])

            return sig, cg

        typer.__name__ = f"lds{32 * n}"
        return intrinsic(typer)

    lds64 = _lds_vector(2)
    lds128 = _lds_vector(4)

    @intrinsic
    def sts128(typingctx, arr, addr, v0, v1, v2, v3):
        def cg(ctx, b, sig, args):
            xs = [ctx.cast(b, x, t, types.float32) for x, t in zip(args[2:], sig.args[2:])]
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_i32] + [_f32] * 4),
                               "st.shared.v4.f32 [$0], {$1, $2, $3, $4};",
                               "r,f,f,f,f,~{memory}", side_effect=True)
            b.call(asm, [_addr32(ctx, b, args[1], sig.args[1])] + xs)
            return ctx.get_dummy_value()

        return types.void(arr, addr, v0, v1, v2, v3), cg

    def _to_global(b, ptr):
        """The global-window address (64-bit integer) of a generic pointer."""
        cvta = ir.InlineAsm(ir.FunctionType(_i64, [_i64]), "cvta.to.global.u64 $0, $1;", "=l,l")
        return b.call(cvta, [b.ptrtoint(ptr, _i64)])

    def _emit_cp_async(ctx, b, nbytes, cache_op, addr, gaddr, ok):
        """``cp.async`` of ``nbytes`` from global ``gaddr`` to shared ``addr`` (LLVM values);
        a source size of 0 (``ok`` false) zero-fills and reads nothing."""
        size = b.select(ok, ir.Constant(_i32, nbytes), ir.Constant(_i32, 0))
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_i32, _i64, _i32]),
                           f"cp.async.{cache_op}.shared.global [$0], [$1], {nbytes}, $2;",
                           "r,l,r,~{memory}", side_effect=True)
        b.call(asm, [addr, gaddr, size])

    def _cp_async(nbytes, cache_op):
        """The ``cp.async`` of ``nbytes`` from ``src[i0, i1, i2]`` to the shared ``addr``
        (``cache_op``: "ca" through L1, "cg" L2 only)."""

        @intrinsic
        def copy(typingctx, arr, addr, src, i0, i1, i2, valid):
            sig = types.void(arr, addr, src, i0, i1, i2, valid)

            def cg(ctx, b, s, args):
                gptr = _item_ptr(ctx, b, s.args[2], args[2], args[3:6], s.args[3:6])
                _emit_cp_async(ctx, b, nbytes, cache_op, _addr32(ctx, b, args[1], s.args[1]),
                               _to_global(b, gptr), ctx.cast(b, args[6], s.args[6], types.boolean))
                return ctx.get_dummy_value()

            return sig, cg

        return copy

    @intrinsic
    def global_addr(typingctx, src, i0, i1, i2):
        sig = types.int64(src, i0, i1, i2)

        def cg(ctx, b, s, args):
            return _to_global(b, _item_ptr(ctx, b, s.args[0], args[0], args[1:4], s.args[1:4]))

        return sig, cg

    def _cp_async_at(nbytes, cache_op):
        """The ``cp.async`` of ``nbytes`` from the global address ``gaddr``."""

        @intrinsic
        def copy(typingctx, arr, addr, gaddr, valid):
            sig = types.void(arr, addr, gaddr, valid)

            def cg(ctx, b, s, args):
                _emit_cp_async(ctx, b, nbytes, cache_op, _addr32(ctx, b, args[1], s.args[1]),
                               ctx.cast(b, args[2], s.args[2], types.int64),
                               ctx.cast(b, args[3], s.args[3], types.boolean))
                return ctx.get_dummy_value()

            return sig, cg

        return copy

    cp_async4 = _cp_async(4, "ca")

    def _void_asm(text):
        @intrinsic
        def _impl(typingctx):
            def cg(ctx, b, sig, args):
                b.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}",
                                    side_effect=True), [])
                return ctx.get_dummy_value()

            return types.void(), cg

        return _impl

    @intrinsic
    def divmod_u32(typingctx, a, b):
        sig = types.UniTuple(types.int32, 2)(a, b)

        def cg(ctx, bld, s, args):
            x, y = (bld.trunc(ctx.cast(bld, v, t, types.int64), _i32) for v, t in zip(args, s.args))
            quo = bld.udiv(x, y)
            return _pair(ctx, bld, s, quo, bld.sub(x, bld.mul(quo, y)))

        return sig, cg

    @intrinsic
    def rcp(typingctx, x):
        def cg(ctx, b, sig, args):
            v = ctx.cast(b, args[0], sig.args[0], types.float32)
            asm = ir.InlineAsm(ir.FunctionType(_f32, [_f32]), "rcp.approx.f32 $0, $1;", "=f,f")
            return b.call(asm, [v])

        return types.float32(x), cg

    cp_async_commit = _void_asm("cp.async.commit_group;")
    cp_async_wait_all = _void_asm("cp.async.wait_group 0;")

    @cuda.jit(device=True)
    def shfl_xor(v, mask, tid):
        return cuda.shfl_xor_sync(0xFFFFFFFF, v, mask)

    @cuda.jit(device=True)
    def warp_uniform(v, tid):
        return cuda.shfl_sync(0xFFFFFFFF, v, 0)

    @cuda.jit(device=True)
    def syncwarp(tid):
        cuda.syncwarp(0xFFFFFFFF)

    def _barrier_asm(text):
        @intrinsic
        def barrier(typingctx, barrier_id, nthreads):
            def cg(ctx, b, sig, args):
                ids = [_addr32(ctx, b, v, t) for v, t in zip(args, sig.args)]
                b.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_i32, _i32]),
                                    text, "r,r,~{memory}", side_effect=True), ids)
                return ctx.get_dummy_value()

            return types.void(barrier_id, nthreads), cg

        return barrier

    bar_sync = _barrier_asm("bar.sync $0, $1;")
    bar_arrive = _barrier_asm("bar.arrive $0, $1;")


# ---------------------------------------------------------------------------------------------
# Tensor cores (Hopper wgmma) and 16-byte asynchronous copies
# ---------------------------------------------------------------------------------------------
# A warpgroup (4 warps, 128 threads) issues ``wgmma.mma_async`` together: D[64 x N] (fp32, in
# registers) (+)= A[64 x 16] . B[16 x N], A and B 16-bit in shared memory, read through
# *descriptors*. Layouts here are the "no swizzle" ones: the operand is cut into core matrices
# of 8 rows x 16 bytes, each 128 contiguous bytes, placed at
#     K-major (A, and B = K^T):  byte(r, k) = (r//8)*SBO + (k//8)*LBO + (r%8)*16 + (k%8)*2
#     MN-major (B = V, "trans-b"): byte(k, n) = (n//8)*SBO + (k//8)*LBO + (k%8)*16 + (n%8)*2
# (r: row of A or column n of B; LBO steps along K, SBO along M or N).
#
# Accumulator fragment of thread t of the warpgroup (w = t // 32, lane = t % 32): element i of
# its N/2 floats is D[row, col] with
#     row = 16*w + lane//4 + 8*((i//2) % 2),   col = 8*(i//4) + 2*(lane % 4) + i % 2
# (``acc_row``/``acc_col`` below). The kernels hold accumulators in ``cuda.local.array``s whose
# every index is a compile-time constant, so they live in registers.
#
# Primitives
# - ``wgmma_desc(lbo, sbo, swizzle=False)`` -> ``desc(addr)``: the 64-bit descriptor of an
#   operand at the 32-bit shared address ``addr`` (LBO, SBO compile-time). ``swizzle``: the
#   128-byte swizzled layout TMA writes (rows of 64 values, 128 bytes; 16-byte chunk j of
#   row r at j ^ (r % 8)): K-major, atoms of 8 rows SBO apart (LBO unused; a K step of 16
#   moves the start 32 bytes); MN-major, N in 64-value atoms LBO apart, K in 8-row groups SBO
#   apart. ``desc_advance(desc, nbytes)``: the descriptor of the operand ``nbytes`` further
#   on (one 64-bit add: the address field, addr >> 4 in the low 14 bits, never carries within
#   shared memory's 228 KB), so a loop of products builds its descriptors once.
# - ``wgmma(n, tag, trans_b)`` -> ``mma(acc, arr, desc_a, desc_b, accumulate, wtid)``: issue one
#   m64n{n}k16 product (tag "bf16" or "f16") into ``acc[:n//2]``; ``accumulate`` 0 overwrites.
#   ``arr`` (the shared array) and ``wtid`` (thread index in the warpgroup) serve the twin.
# - ``wgmma_rs(n, tag, trans_b)`` -> ``mma(acc, a0, a1, a2, a3, arr, desc_b, accumulate, tid)``:
#   the same product with A from registers: the thread's four int32 words of A [64 x 16]
#   (16-bit pairs) in mma.sync's A layout over its warp's 16 rows (r = 16*(warp % 4) +
#   lane//4, t = lane % 4): a0 = A[r, 2t:2t+2], a1 = A[r+8, 2t:2t+2], a2 = A[r, 2t+8:2t+10],
#   a3 = A[r+8, 2t+8:2t+10]. That is an accumulator's layout: words packed from a score
#   fragment (keys 16j..16j+15: elements 8j..8j+7, in pairs) are A for P V, no shared memory
#   in between. ``tid`` is the thread's index in its block (the twin exchanges within a warp).
# - ``wgmma_fence()`` before the first wgmma of a batch (orders register writes to the
#   accumulators), ``wgmma_commit()`` closes the batch; ``wgmma_wait(nacc)`` -> ``wait(acc)``
#   waits for every committed batch, with ``acc[:nacc]`` tied through so no read of it moves
#   above the wait; ``wgmma_wait2(n1, n2)`` -> ``wait(acc1, acc2)`` ties two accumulators
#   (a wait that also covers an earlier batch into another accumulator).
# - ``acc_zero(n)`` -> ``zero(acc)``, ``acc_scale(n)`` -> ``scale(acc, a0, a1)`` (rows of the
#   fragment's upper and lower 8 times a0 and a1), ``acc_store(n)`` -> ``store(acc, arr, addr,
#   row_bytes)`` (element i to ``addr + 8*((i//2)%2)*row_bytes + 4*(8*(i//4) + i%2)``, i.e. the
#   fragment into a float32 row-major shared array whose thread-dependent origin is ``addr``):
#   whole-accumulator operations written out element by element, so every index is a constant
#   (a 128-iteration loop is not always unrolled, and the array would then live in memory).
# - ``fence_proxy_async()``: shared-memory writes by ordinary stores and cp.async become
#   visible to wgmma (the async proxy); then a barrier.
# - ``global_addr(src, i0, i1, i2)``: the global address of ``src[i0, i1, i2]`` (an int64 on
#   the GPU); ``cp_async16_at(arr, addr, gaddr, valid)`` copies the 16 bytes at ``gaddr`` (an
#   address plus a byte offset: a row's address computed once serves all its chunks, and
#   the offsets fold into the instruction; the row's last axis must be contiguous), zeros
#   when not ``valid``; ``cp_async4_at`` the same for 4 bytes. Same groups as ``cp_async4``.
# - ``pack_bf16x2(lo, hi)``, ``pack_f16x2(lo, hi)``: two floats -> one int32 word of 16-bit pairs.


def _acc_row(i, wtid):
    return 16 * (wtid // 32) + (wtid % 32) // 4 + 8 * ((i // 2) % 2)


def _acc_col(i, wtid):
    return 8 * (i // 4) + 2 * (wtid % 4) + i % 2


acc_row = cuda.jit(device=True)(_acc_row)
acc_col = cuda.jit(device=True)(_acc_col)


if SIMULATOR:

    def desc_advance(desc, nbytes):
        return desc + (int(nbytes) >> 4)

else:

    @cuda.jit(device=True)
    def desc_advance(desc, nbytes):
        return desc + uint64(nbytes >> 4)


def _desc_value(addr, lbo, sbo, swizzle=False):
    return (((addr >> 4) & 0x3FFF) | (((lbo >> 4) & 0x3FFF) << 16)
            | (((sbo >> 4) & 0x3FFF) << 32) | (int(swizzle) << 62))


def _swizzle128(byte):
    """The 128-byte swizzle (TMA's and wgmma's): 16-byte chunk j of a 128-byte row r sits at
    chunk j ^ (r % 8); address bits 4-6 take bits 7-9 (buffers 1024-byte aligned)."""
    return byte ^ (((byte >> 7) & 7) << 4)


def _acc_offset(i, row_bytes):
    return 8 * ((i // 2) % 2) * row_bytes + 4 * (8 * (i // 4) + i % 2)


if SIMULATOR:

    def acc_zero(n):
        def zero(acc):
            acc[:n] = 0

        return zero

    def acc_scale(n):
        def scale(acc, a0, a1):
            for i in range(n):
                acc[i] *= a0 if (i // 2) % 2 == 0 else a1

        return scale

    def acc_store(n):
        def store(acc, arr, addr, row_bytes):
            for i in range(n):
                arr[(addr + _acc_offset(i, row_bytes)) // 4] = acc[i]

        return store

    def wgmma_desc(lbo, sbo, swizzle=False):
        def desc(addr):
            return _desc_value(int(addr), lbo, sbo, swizzle)

        return desc

    def _operand(arr, desc, rows, kmajor, dtype):
        """The 16-bit operand a descriptor describes, as float64 [rows, 16] (A: rows = M;
        B: rows = N, so the product is A @ B_op.T), decoded from the descriptor's bits."""
        addr = (desc & 0x3FFF) << 4
        lbo = ((desc >> 16) & 0x3FFF) << 4
        sbo = ((desc >> 32) & 0x3FFF) << 4
        r = np.arange(rows)[:, None]
        k = np.arange(16)[None, :]
        if (desc >> 62) & 3 == 1:  # 128-byte swizzle: rows of 64 values, 8-row atoms
            if kmajor:  # atoms SBO apart along M/N (K steps move the start by 32 bytes)
                byte = addr + (r // 8) * sbo + (r % 8) * 128 + k * 2
            else:  # N in 64-value atoms LBO apart, K in 8-row groups SBO apart
                byte = addr + (r // 64) * lbo + (k // 8) * sbo + (k % 8) * 128 + (r % 64) * 2
            byte = _swizzle128(byte)
        elif kmajor:
            byte = addr + (r // 8) * sbo + (k // 8) * lbo + (r % 8) * 16 + (k % 8) * 2
        else:
            byte = addr + (r // 8) * sbo + (k // 8) * lbo + (k % 8) * 16 + (r % 8) * 2
        return np.asarray(arr).view(np.uint16)[byte // 2].view(dtype).astype(np.float64)

    def wgmma(n, tag, trans_b):
        dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}[tag]
        idx = np.arange(n // 2)

        def mma(acc, arr, desc_a, desc_b, accumulate, wtid):
            a = _operand(arr, desc_a, 64, True, dtype)
            bt = _operand(arr, desc_b, n, not trans_b, dtype)
            d = (a[_acc_row(idx, wtid)] * bt[_acc_col(idx, wtid)]).sum(axis=1)
            if accumulate:
                d += acc[:n // 2]
            acc[:n // 2] = d

        return mma

    def wgmma_rs(n, tag, trans_b):
        dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}[tag]
        idx = np.arange(n // 2)

        def mma(acc, a0, a1, a2, a3, arr, desc_b, accumulate, tid):
            # The warp's 16 rows of A from its lanes' words (one warp exchange), then the
            # thread's fragment as for the shared-memory form.
            h = _halves(_warp_gather((a0, a1, a2, a3), tid), dtype)  # [lane, word, half]
            a = np.empty((16, 16))
            for e in range(2):
                for w in range(4):  # rows +8 in a1, a3; columns +8 in a2, a3
                    a[_G + 8 * (w % 2), 2 * _T + 8 * (w // 2) + e] = h[:, w, e]
            wtid = tid % 128
            bt = _operand(arr, desc_b, n, not trans_b, dtype)
            d = (a[_acc_row(idx, wtid) % 16] * bt[_acc_col(idx, wtid)]).sum(axis=1)
            if accumulate:
                d += acc[:n // 2]
            acc[:n // 2] = d

        return mma

    def wgmma_fence():
        pass

    def wgmma_commit():
        pass

    def wgmma_wait(nacc):
        def wait(acc):
            pass

        return wait

    def wgmma_wait2(n1, n2):
        def wait(acc1, acc2):
            pass

        return wait

    def fence_proxy_async():
        pass

    cp_async4_at = _cp_async_at(1)
    cp_async16_at = _cp_async_at(4)

    def pack_bf16x2(lo, hi):
        return np.array([lo, hi], np.float32).astype(ml_dtypes.bfloat16).view(np.int32)[0]

    def pack_f16x2(lo, hi):
        return np.array([lo, hi], np.float32).astype(np.float16).view(np.int32)[0]

else:

    def wgmma_desc(lbo, sbo, swizzle=False):
        hi = ((lbo >> 4) & 0x3FFF) << 16 | ((sbo >> 4) & 0x3FFF) << 32 | int(swizzle) << 62

        @intrinsic
        def desc(typingctx, addr):
            def cg(ctx, b, sig, args):
                a = b.zext(ctx.cast(b, args[0], sig.args[0], types.uint32), _i64)
                a = b.and_(b.lshr(a, ir.Constant(_i64, 4)), ir.Constant(_i64, 0x3FFF))
                return b.or_(a, ir.Constant(_i64, hi))

            return types.uint64(addr), cg

        return desc

    def _acc_ptrs(ctx, b, aryty, ary, n):
        data = ctx.make_array(aryty)(ctx, b, value=ary).data
        return [cgutils.gep(b, data, i) for i in range(n)]

    def acc_zero(n):
        @intrinsic
        def zero(typingctx, acc):
            def cg(ctx, b, sig, args):
                for p in _acc_ptrs(ctx, b, sig.args[0], args[0], n):
                    b.store(ir.Constant(_f32, 0.0), p)
                return ctx.get_dummy_value()

            return types.void(acc), cg

        return zero

    def acc_scale(n):
        @intrinsic
        def scale(typingctx, acc, a0, a1):
            def cg(ctx, b, sig, args):
                a = [ctx.cast(b, v, t, types.float32) for v, t in zip(args[1:], sig.args[1:])]
                for i, p in enumerate(_acc_ptrs(ctx, b, sig.args[0], args[0], n)):
                    b.store(b.fmul(b.load(p), a[(i // 2) % 2]), p)
                return ctx.get_dummy_value()

            return types.void(acc, a0, a1), cg

        return scale

    def acc_store(n):
        @intrinsic
        def store(typingctx, acc, arr, addr, row_bytes):
            def cg(ctx, b, sig, args):
                base = _addr32(ctx, b, args[2], sig.args[2])
                rb = _addr32(ctx, b, args[3], sig.args[3])
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_i32, _f32]),
                                   "st.shared.f32 [$0], $1;", "r,f,~{memory}", side_effect=True)
                for i, p in enumerate(_acc_ptrs(ctx, b, sig.args[0], args[0], n)):
                    row = b.mul(rb, ir.Constant(_i32, 8 * ((i // 2) % 2)))
                    off = b.add(row, ir.Constant(_i32, 4 * (8 * (i // 4) + i % 2)))
                    b.call(asm, [b.add(base, off), b.load(p)])
                return ctx.get_dummy_value()

            return types.void(acc, arr, addr, row_bytes), cg

        return store

    def _tied_asm(b, ptrs, text, in_types, in_cons, ins):
        """Call asm whose first len(ptrs) operands are the accumulators (read-write, "+f"
        written as outputs tied to inputs), then ``ins``; store the results back."""
        n = len(ptrs)
        cons = ",".join(["=f"] * n + in_cons + [str(i) for i in range(n)] + ["~{memory}"])
        fty = ir.FunctionType(ir.LiteralStructType([_f32] * n), in_types + [_f32] * n)
        r = b.call(ir.InlineAsm(fty, text, cons, side_effect=True),
                   ins + [b.load(p) for p in ptrs])
        for i, p in enumerate(ptrs):
            b.store(b.extract_value(r, i), p)

    def wgmma(n, tag, trans_b):
        nacc = n // 2
        regs = ",".join(f"${i}" for i in range(nacc))
        text = ("{ .reg .pred p; setp.ne.b32 p, $%d, 0; "
                "wgmma.mma_async.sync.aligned.m64n%dk16.f32.%s.%s {%s}, $%d, $%d, p, 1, 1, 0, %d; }"
                % (nacc + 2, n, tag, tag, regs, nacc, nacc + 1, int(trans_b)))

        @intrinsic
        def mma(typingctx, acc, arr, desc_a, desc_b, accumulate, wtid):
            sig = types.void(acc, arr, desc_a, desc_b, accumulate, wtid)

            def cg(ctx, b, s, args):
                ptrs = _acc_ptrs(ctx, b, s.args[0], args[0], nacc)
                ins = [ctx.cast(b, args[2], s.args[2], types.uint64),
                       ctx.cast(b, args[3], s.args[3], types.uint64),
                       ctx.cast(b, args[4], s.args[4], types.uint32)]
                _tied_asm(b, ptrs, text, [_i64, _i64, _i32], ["l", "l", "r"], ins)
                return ctx.get_dummy_value()

            return sig, cg

        return mma

    def wgmma_rs(n, tag, trans_b):
        nacc = n // 2
        regs = ",".join(f"${i}" for i in range(nacc))
        text = ("{ .reg .pred p; setp.ne.b32 p, $%d, 0; "
                "wgmma.mma_async.sync.aligned.m64n%dk16.f32.%s.%s {%s}, {$%d,$%d,$%d,$%d}, $%d, "
                "p, 1, 1, %d; }"
                % (nacc + 5, n, tag, tag, regs, nacc, nacc + 1, nacc + 2, nacc + 3, nacc + 4,
                   int(trans_b)))

        @intrinsic
        def mma(typingctx, acc, a0, a1, a2, a3, arr, desc_b, accumulate, tid):
            sig = types.void(acc, a0, a1, a2, a3, arr, desc_b, accumulate, tid)

            def cg(ctx, b, s, args):
                ptrs = _acc_ptrs(ctx, b, s.args[0], args[0], nacc)
                ins = [ctx.cast(b, args[k], s.args[k], types.int32) for k in range(1, 5)]
                ins += [ctx.cast(b, args[6], s.args[6], types.uint64),
                        ctx.cast(b, args[7], s.args[7], types.uint32)]
                _tied_asm(b, ptrs, text, [_i32] * 4 + [_i64, _i32], ["r"] * 4 + ["l", "r"], ins)
                return ctx.get_dummy_value()

            return sig, cg

        return mma

    wgmma_fence = _void_asm("wgmma.fence.sync.aligned;")
    wgmma_commit = _void_asm("wgmma.commit_group.sync.aligned;")
    fence_proxy_async = _void_asm("fence.proxy.async.shared::cta;")

    def _wait_all(counts):
        """Codegen of ``wgmma.wait_group 0`` with the first ``counts[i]`` values of accumulator
        argument i tied through."""

        def cg(ctx, b, sig, args):
            ptrs = [ptr for ty, acc, n in zip(sig.args, args, counts)
                    for ptr in _acc_ptrs(ctx, b, ty, acc, n)]
            _tied_asm(b, ptrs, "wgmma.wait_group.sync.aligned 0;", [], [], [])
            return ctx.get_dummy_value()

        return cg

    def wgmma_wait(nacc):
        @intrinsic
        def wait(typingctx, acc):
            return types.void(acc), _wait_all((nacc,))

        return wait

    def wgmma_wait2(n1, n2):
        @intrinsic
        def wait(typingctx, acc1, acc2):
            return types.void(acc1, acc2), _wait_all((n1, n2))

        return wait

    cp_async4_at = _cp_async_at(4, "ca")
    cp_async16_at = _cp_async_at(16, "cg")

    def _pack(text):
        @intrinsic
        def pack(typingctx, lo, hi):
            def cg(ctx, b, sig, args):
                lo_, hi_ = (ctx.cast(b, a, t, types.float32) for a, t in zip(args, sig.args))
                asm = ir.InlineAsm(ir.FunctionType(_i32, [_f32, _f32]), text, "=r,f,f")
                return b.call(asm, [hi_, lo_])  # cvt packs its first source in the high half

            return types.int32(lo, hi), cg

        return pack

    pack_bf16x2 = _pack("cvt.rn.bf16x2.f32 $0, $1, $2;")
    pack_f16x2 = _pack("cvt.rn.f16x2.f32 $0, $1, $2;")



# ---------------------------------------------------------------------------------------------
# Bulk tensor copies (TMA) completing on shared-memory barriers (mbarrier)
# ---------------------------------------------------------------------------------------------
# The copy engine moves a whole box of a 2-D tensor into shared memory from one instruction;
# the threads that issue it spend no registers or load slots on it (16-byte cp.async from every
# thread kept the load queue full and stalled the kernel on operand registers). Completion is
# counted in bytes on an mbarrier: one thread announces the bytes (``expect_tx``) and arrives,
# each copy signals its bytes, and the barrier's phase flips when both are done.
#
# Primitives
# - ``tensor_map(dev, rows, box_rows, box_cols=8, swizzle=False)`` (host): the 128-byte
#   tensor map (a uint8 device array) of a 16-bit array seen as ``[rows, 576]`` (``dev``: its
#   int32-word view, rows of 288 words), cut into boxes of ``box_rows`` rows x ``box_cols``
#   values. A box lands as its rows one after another; with ``swizzle`` (box_cols 64: rows of
#   128 bytes) in the 128-byte swizzled order wgmma's swizzled descriptors read.
# - ``tma_load(box_rows, box_cols=8, swizzle=False)`` -> ``load(arr, addr, tmap, src, col,
#   row, bar)``: start copying the box at value column ``col``, row ``row`` to the shared
#   ``addr`` (rows past the tensor's end read as zeros), completing on the mbarrier at
#   ``bar``. The box shape is the map's; here it serves the twin, as ``src`` (the array) does.
# - ``mbar_init(arr, bar, count)``, then ``mbar_fence_init()`` and a block barrier;
#   ``mbar_expect_tx(arr, bar, nbytes)``: arrive, announcing nbytes of copies;
#   ``mbar_try_wait(arr, bar, parity)``: True once the phase of that parity completed.
# In the simulator a copy happens when issued and counts its bytes off the mbarrier, which
# keeps its completed phases and expected bytes in its own 8 bytes: a waiter spins until the
# issuing lane has copied, as on the GPU.
if SIMULATOR:

    def tensor_map(dev, rows, box_rows, box_cols=8, swizzle=False):
        return cuda.to_device(np.zeros(128, np.uint8))

    # An mbarrier's 8 bytes hold [phases completed, bytes still expected]; a condition keeps
    # the lanes' updates whole and wakes the waiters when a phase completes.
    _mbar_cond = threading.Condition()

    def _mbar_complete_tx(arr, bar, nbytes):
        with _mbar_cond:
            arr[bar // 4 + 1] -= nbytes
            if arr[bar // 4 + 1] == 0:
                arr[bar // 4] += 1
                _mbar_cond.notify_all()

    def tma_load(box_rows, box_cols=8, swizzle=False):
        words = box_cols // 2
        rows = np.arange(box_rows)[:, None]
        offsets = 2 * box_cols * rows + 4 * np.arange(words)[None, :]  # bytes from addr

        def load(arr, addr, tmap, src, col, row, bar):
            flat = np.asarray(getattr(src, "_ary", src)).reshape(-1, src.shape[2])  # [rows, 288]
            box = np.zeros((box_rows, words), np.int32)  # rows past the end read as zeros
            n = max(0, min(box_rows, flat.shape[0] - row))
            box[:n] = flat[row:row + n, col // 2:col // 2 + words]
            byte = addr + offsets
            np.asarray(arr)[(_swizzle128(byte) if swizzle else byte) // 4] = box
            _mbar_complete_tx(arr, bar, 2 * box_cols * box_rows)

        return load

    def mbar_init(arr, bar, count):
        assert count == 1, "the twin models one arrival per phase"
        arr[bar // 4] = 0
        arr[bar // 4 + 1] = 0

    def mbar_fence_init():
        pass

    def mbar_expect_tx(arr, bar, nbytes):
        _mbar_complete_tx(arr, bar, -nbytes)

    def mbar_try_wait(arr, bar, parity):
        # Like the instruction, waits a while for the phase and then says whether it completed
        # (sleeping, so the copying lanes get the interpreter).
        with _mbar_cond:
            return _mbar_cond.wait_for(lambda: arr[bar // 4] % 2 != parity, timeout=1.0)

else:

    def tensor_map(dev, rows, box_rows, box_cols=8, swizzle=False):
        from cuda.bindings import driver as cu

        ptr = dev.__cuda_array_interface__["data"][0]
        u32, u64 = cu.cuuint32_t, cu.cuuint64_t
        err, tmap = cu.cuTensorMapEncodeTiled(
            cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16, u32(2), ptr,
            [u64(576), u64(rows)], [u64(1152)], [u32(box_cols), u32(box_rows)],
            [u32(1), u32(1)],
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            (cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B if swizzle
             else cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE),
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuTensorMapEncodeTiled failed: {err!r} (rows {rows})")
        raw = ctypes.string_at(tmap.getPtr(), 128)  # the opaque 128 bytes
        return cuda.to_device(np.frombuffer(raw, np.uint8).copy())

    def tma_load(box_rows, box_cols=8, swizzle=False):
        @intrinsic
        def load(typingctx, arr, addr, tmap, src, col, row, bar):
            sig = types.void(arr, addr, tmap, src, col, row, bar)

            def cg(ctx, b, s, args):
                mp = _item_ptr(ctx, b, s.args[2], args[2], [ir.Constant(_i64, 0)], [types.int64])
                asm = ir.InlineAsm(
                    ir.FunctionType(ir.VoidType(), [_i32, _i64, _i32, _i32, _i32]),
                    "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx"
                    "::bytes [$0], [$1, {$2, $3}], [$4];", "r,l,r,r,r,~{memory}",
                    side_effect=True)
                b.call(asm, [_addr32(ctx, b, args[1], s.args[1]), b.ptrtoint(mp, _i64),
                             _addr32(ctx, b, args[4], s.args[4]),
                             _addr32(ctx, b, args[5], s.args[5]),
                             _addr32(ctx, b, args[6], s.args[6])])
                return ctx.get_dummy_value()

            return sig, cg

        return load

    def _bar_op(text):
        @intrinsic
        def op(typingctx, arr, bar, value):
            sig = types.void(arr, bar, value)

            def cg(ctx, b, s, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_i32, _i32]), text,
                                   "r,r,~{memory}", side_effect=True)
                b.call(asm, [_addr32(ctx, b, args[1], s.args[1]),
                             _addr32(ctx, b, args[2], s.args[2])])
                return ctx.get_dummy_value()

            return sig, cg

        return op

    mbar_init = _bar_op("mbarrier.init.shared::cta.b64 [$0], $1;")
    mbar_expect_tx = _bar_op("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;")
    mbar_fence_init = _void_asm("fence.mbarrier_init.release.cluster;")

    @intrinsic
    def mbar_try_wait(typingctx, arr, bar, parity):
        sig = types.boolean(arr, bar, parity)

        def cg(ctx, b, s, args):
            asm = ir.InlineAsm(
                ir.FunctionType(_i32, [_i32, _i32]),
                "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; "
                "selp.b32 $0, 1, 0, p; }", "=r,r,r,~{memory}", side_effect=True)
            r = b.call(asm, [_addr32(ctx, b, args[1], s.args[1]),
                             _addr32(ctx, b, args[2], s.args[2])])
            return b.icmp_unsigned("!=", r, ir.Constant(_i32, 0))

        return sig, cg


# ---------------------------------------------------------------------------------------------
# Warp tensor cores (Ampere/Hopper mma.sync) and ldmatrix
# ---------------------------------------------------------------------------------------------
# One warp computes D[16 x 8] (fp32) = A[16 x 16] . B[16 x 8] + C with ``mma.sync.aligned.
# m16n8k16.row.col.f32``, every operand in registers: unlike wgmma, no descriptor, fence or
# warpgroup, so one warp can take any tile and any shared layout with 16-byte rows.
#
# Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), lane
# l = 4g + t (g = l // 4, t = l % 4). A word holds two 16-bit elements, the first in its low
# half; ``X[r, c:c+2]`` below is such a pair:
#     A (16 x 16):  a0 = A[g, 2t:2t+2]    a1 = A[g+8, 2t:2t+2]
#                   a2 = A[g, 2t+8:2t+10] a3 = A[g+8, 2t+8:2t+10]
#     B (16 x 8):   b0 = B[2t:2t+2, g]    b1 = B[2t+8:2t+10, g]      (pairs along K)
#     C, D:         acc[i+k] = D[g + 8*(k//2), 2t + k%2],  k = 0..3
# so an ``acc`` holding n8 tiles at i = 0, 4, 8, ... has wgmma's accumulator layout (warp 0 of
# ``acc_row``/``acc_col``), and ``acc_scale``/``acc_store`` serve it too.
#
# ldmatrix (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): 8 x 8 matrices of 16-bit
# elements whose rows are 16 contiguous bytes each, anywhere (16-byte aligned): lane l gives the
# address of row l % 8 of matrix l // 8. Word j of lane l is then matrix j's [g, 2t:2t+2],
# which is an A word (matrices = A's quarters, K contiguous) or a B word (B stored N x K, K
# contiguous). With ``.trans`` it is the column pair [2t, g], [2t+1, g]: B stored K x N (N
# contiguous, V) loads straight into its fragment.
#
# Primitives
# - ``mma_m16n8k16(tag)`` -> ``mma(acc, i, a0, a1, a2, a3, b0, b1, tid)``: acc[i:i+4] = A . B +
#   acc[i:i+4] (tag "bf16" or "f16"; fragments as int32 words). ``i`` must be a compile-time
#   constant (a literal or a global: typing refuses anything else), so acc stays in registers.
# - ``ldmatrix_x4(arr, addr, tid)``, ``ldmatrix_x4_trans`` -> 4 int32 words; ``ldmatrix_x2``,
#   ``ldmatrix_x2_trans`` -> 2 (only lanes 0-15's addresses are read; pass valid ones in every
#   lane all the same, as sm_75 and below require). ``addr = smem_addr(arr) + byte offset``.
# The twins gather the warp's fragments or addresses through the warp exchange and give each
# lane its share as the hardware distributes it. The mma twin sums in float64 and rounds once to
# float32: the products of 16-bit values are exact, but the hardware's order and rounding of the
# fp32 sum are not specified, so exact is the one unambiguous choice (the GPU differs by a few
# fp32 ulps of the largest term).
if SIMULATOR:

    def _warp_gather(v, tid):
        """Every lane's ``v``, in lane order: one warp exchange (see ``shfl_xor``)."""
        lane = tid % 32
        barrier, buffers, turns = _warp(tid)
        slots = buffers[turns[lane] % 2]
        turns[lane] += 1
        slots[lane] = v
        barrier.wait()
        return list(slots)

    def _halves(words, dtype):
        """int32 words [...] -> their 16-bit elements as float64 [..., 2] (low half first)."""
        w = (np.asarray(words, np.int64) & 0xFFFFFFFF).astype(np.uint32)
        return w.view(np.uint16).view(dtype).astype(np.float64).reshape(w.shape + (2,))

    _G, _T = np.arange(32) // 4, np.arange(32) % 4

    def mma_m16n8k16(tag):
        dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}[tag]

        def mma(acc, i, a0, a1, a2, a3, b0, b1, tid):
            h = _halves(_warp_gather((a0, a1, a2, a3, b0, b1), tid), dtype)  # [lane, word, half]
            a, b = np.empty((16, 16)), np.empty((16, 8))
            for e in range(2):
                for w in range(4):  # rows +8 in a1, a3; columns +8 in a2, a3
                    a[_G + 8 * (w % 2), 2 * _T + 8 * (w // 2) + e] = h[:, w, e]
                for w in range(2):
                    b[2 * _T + 8 * w + e, _G] = h[:, 4 + w, e]
            g, t = tid % 32 // 4, tid % 4
            rows, cols = [g, g, g + 8, g + 8], [2 * t, 2 * t + 1, 2 * t, 2 * t + 1]
            acc[i:i + 4] = (a[rows] * b[:, cols].T).sum(axis=1) + acc[i:i + 4]

        return mma

    def _ldmatrix(num, trans):
        def load(arr, addr, tid):
            rows = _warp_gather(int(addr), tid)[:8 * num]  # rows[8j + r]: row r of matrix j
            assert all(r % 16 == 0 for r in rows), "ldmatrix rows must be 16-byte aligned"
            g, t = tid % 32 // 4, tid % 4
            h = np.asarray(arr).view(np.uint16)
            if trans:  # column g, rows 2t and 2t+1
                pairs = [(h[(rows[8 * j + 2 * t] + 2 * g) // 2],
                          h[(rows[8 * j + 2 * t + 1] + 2 * g) // 2]) for j in range(num)]
            else:  # row g, columns 2t and 2t+1
                pairs = [(h[(rows[8 * j + g] + 4 * t) // 2],
                          h[(rows[8 * j + g] + 4 * t) // 2 + 1]) for j in range(num)]
            return tuple(np.array(pairs, np.uint16).view(np.int32).ravel())

        return load

else:
    from numba.cuda.core import errors

    def mma_m16n8k16(tag):
        text = ("mma.sync.aligned.m16n8k16.row.col.f32.%s.%s.f32 {$0,$1,$2,$3}, "
                "{$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};" % (tag, tag))

        @intrinsic
        def mma(typingctx, acc, i, a0, a1, a2, a3, b0, b1, tid):
            # Tried first with non-literal types, then with literals: refusing a non-literal i
            # makes Numba come back with i's value.
            if not isinstance(i, types.IntegerLiteral):
                raise errors.TypingError("mma: the accumulator offset i must be a compile-time "
                                         "constant (the accumulators then stay in registers)")
            frags = (a0, a1, a2, a3, b0, b1)
            sig = types.void(acc, i, *(types.unliteral(f) for f in frags), types.unliteral(tid))
            n = i.literal_value

            def cg(ctx, b, s, args):
                data = ctx.make_array(s.args[0])(ctx, b, value=args[0]).data
                ptrs = [cgutils.gep(b, data, n + k) for k in range(4)]
                ins = [ctx.cast(b, v, t, types.int32) for v, t in zip(args[2:8], s.args[2:8])]
                fty = ir.FunctionType(ir.LiteralStructType([_f32] * 4), [_i32] * 6 + [_f32] * 4)
                # side_effect: a .sync.aligned instruction must not be moved into divergent
                # code (nor dropped); the accumulators go in and out tied (0,1,2,3).
                asm = ir.InlineAsm(fty, text, "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3",
                                   side_effect=True)
                r = b.call(asm, ins + [b.load(p) for p in ptrs])
                for k, p in enumerate(ptrs):
                    b.store(b.extract_value(r, k), p)
                return ctx.get_dummy_value()

            return sig, cg

        return mma

    def _ldmatrix(num, trans):
        regs = ",".join(f"${k}" for k in range(num))
        text = (f"ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16 "
                f"{{{regs}}}, [${num}];")

        @intrinsic
        def load(typingctx, arr, addr, tid):
            sig = types.UniTuple(types.int32, num)(arr, addr, tid)

            def cg(ctx, b, s, args):
                # side_effect, as lds32: the load stays between the barriers around it.
                asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([_i32] * num), [_i32]),
                                   text, ",".join(["=r"] * num + ["r"]), side_effect=True)
                r = b.call(asm, [_addr32(ctx, b, args[1], s.args[1])])
                words = [b.extract_value(r, k) for k in range(num)]
                return ctx.make_tuple(b, s.return_type, words)

            return sig, cg

        return load

ldmatrix_x2, ldmatrix_x2_trans = _ldmatrix(2, False), _ldmatrix(2, True)
ldmatrix_x4, ldmatrix_x4_trans = _ldmatrix(4, False), _ldmatrix(4, True)
