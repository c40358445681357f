"""Shared memory through 32-bit addresses, and asynchronous copies from global memory into it.

- ``smem_addr(arr)``: the 32-bit shared-memory address of a shared array (0 in the simulator).
  The accesses below take ``addr = smem_addr(arr) + byte offset``: 32-bit address arithmetic
  that folds into the instruction's immediate offset, instead of Numba's 64-bit indexing.
  The simulator's twins check that each access is aligned to its size (a GPU faults).
- ``lds32(arr, addr)``: one 4-byte element of the shared array ``arr`` (its dtype);
  ``sts32(arr, addr, v)`` stores one.
- ``lds64(arr, addr)``, ``lds128(arr, addr)``: two or four consecutive elements of ``arr``
  (float32 or int32) in one 8- or 16-byte load (``ld.shared.v2``/``.v4``; addr aligned to
  the load's size). Lanes at one address share a broadcast. ``sts128(arr, addr, v0, v1,
  v2, v3)`` stores four floats (or four int32 words) at a 16-byte aligned ``addr``;
  ``sts64(arr, addr, v0, v1)`` two int32 values at an 8-byte aligned ``addr`` of an int32 one.
- ``global_addr(src, i0, i1, i2)``: the global address of ``src[i0, i1, i2]`` (an int64 on
  the GPU). ``cp_async16_at(arr, addr, gaddr, valid)`` starts copying the 16 bytes at
  ``gaddr`` (an address plus a byte offset: a row's address computed once serves all its
  chunks, and the offsets fold into the instruction; the row's last axis must be contiguous)
  into the shared ``arr`` at ``addr`` without passing through registers (``cp.async``, L2
  only); zeros when not ``valid`` (nothing is read). ``cp_async16_ca_at`` the same through
  L1 (``.ca``); ``cp_async4_at`` the same for 4 bytes (through L1).
- ``aligned_x4(arr)``: whether ``arr`` starts aligned for ``st_global_x4`` (4 elements'
  bytes); ``aligned16(arr)``: whether it starts 16-byte aligned (a bulk copy's need:
  ``tma.bulk_store``). ``st_global_x4(arr, i0, i1, i2, i3, x0, x1, x2, x3)`` stores x0..x3 (converted to
  ``arr``'s dtype) at ``arr[i0, i1, i2, i3 .. i3 + 3]`` (a 4-D array whose last axis is
  contiguous) in one 8- or 16-byte store, which must be aligned to its size (the twin checks
  the element's real address: a caller's array may start anywhere); ``st_global_x2(arr, i0,
  i1, i2, i3, x0, x1)`` the same for two elements (a 4- or 8-byte store).
  ``ld_global_x4(arr, i0, i1, i2, i3)`` loads ``arr[i0, i1, i2, i3 .. i3 + 3]`` the same way
  (a tuple of four), aligned likewise.
- ``prefetch_l2(arr, i0, i1)``: starts bringing the line of ``arr[i0, i1]`` (a 2-D array;
  the indices must be in bounds) into the L2 cache (``prefetch.global.L2``): nothing waits
  for it and nothing changes but where a later load finds the line. The simulator does
  nothing, after checking the indices.
- ``prefetch_l2_3d(arr, i0, i1, i2)``: the same for the line of ``arr[i0, i1, i2]`` (a 3-D
  array, e.g. a cache's storage: a warpgroup's threads each bring a line of a tile; tried so
  in the seesaw kernel, and slower: docs/kernels/mma.md).
- ``prefetch_bulk_l2(arr, i0, i1, nbytes)``: the same for ``nbytes`` bytes (a multiple of
  16) from ``arr[i0, i1, 0, ...]`` on (a C-contiguous array of two or more axes, 16-byte
  aligned there), in one instruction (``cp.async.bulk.prefetch.L2``): e.g. a tile of a
  cache's rows, ahead of its copy into shared memory (tried so in the seesaw kernel, and
  slower: docs/kernels/mma.md). The simulator checks the indices, the alignment and that the
  bytes lie inside the array.
- ``cp_async_commit()`` closes a group of copies, ``cp_async_wait_all()`` waits for this
  thread's groups (``cp_async_wait_one()``: all but its most recent one;
  ``cp_async_wait_two()``: all but its two most recent ones); a barrier then
  publishes them (and ``fence_proxy_async``, in wgmma.py, to tensor-core reads).

In the simulator a copy writes NaN words (``IN_FLIGHT``) when issued and its source when a
wait of its thread completes its group (``_twin.AsyncGroups``): on the GPU what the
destination holds is undefined in between, so a wait too few, a read before it, or a read of
the old contents after the copy is issued finds NaN.
"""
import numpy as np
from llvmlite import ir
from numba.cuda import types
from numba.cuda.extending import intrinsic

from .._compat import SIMULATOR
from .._numba import array_data, item_pointer
from ._codegen import addr32, f32, global_window, i32, i64, shared_window, void_asm
from ._twin import AsyncGroups, intrinsic_with_twin, with_twin


def _aligned(addr, nbytes, what, space="shared address"):
    """(Simulator) The 4-byte element index of byte address ``addr``. A GPU faults on an
    access not aligned to its size; here, with the base at 0 (shared memory) or aligned (the
    arrays), the offset shows it, so the simulator fails where the GPU would."""
    if addr % nbytes:
        raise RuntimeError(f"{what}: {space} {addr} is not {nbytes}-byte aligned")
    return addr // 4


# -- addresses and loads/stores ----------------------------------------------------------------

def _smem_addr_twin(arr):
    return 0


@intrinsic_with_twin(_smem_addr_twin)
def smem_addr(typingctx, arr):
    def cg(ctx, b, sig, args):
        return shared_window(b, array_data(ctx, b, sig.args[0], args[0]))

    return types.uint32(arr), cg


# Loads are side_effect asm: they stay on their side of the barriers that order the
# stores they read.

def _lds32_twin(arr, addr):
    return arr[_aligned(addr, 4, "lds32")]


@intrinsic_with_twin(_lds32_twin)
def lds32(typingctx, arr, addr):
    def cg(ctx, b, sig, args):
        asm = ir.InlineAsm(ir.FunctionType(i32, [i32]), "ld.shared.b32 $0, [$1];", "=r,r",
                           side_effect=True)
        r = b.call(asm, [addr32(ctx, b, args[1], sig.args[1])])
        return b.bitcast(r, f32) if sig.return_type == types.float32 else r

    return arr.dtype(arr, addr), cg


def _sts32_twin(arr, addr, v):
    arr[_aligned(addr, 4, "sts32")] = v


@intrinsic_with_twin(_sts32_twin)
def sts32(typingctx, arr, addr, v):
    def cg(ctx, b, sig, args):
        x = ctx.cast(b, args[2], sig.args[2], sig.args[0].dtype)
        if x.type != i32:
            x = b.bitcast(x, i32)
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i32]),
                           "st.shared.b32 [$0], $1;", "r,r,~{memory}", side_effect=True)
        b.call(asm, [addr32(ctx, b, args[1], sig.args[1]), x])
        return ctx.get_dummy_value()

    return types.void(arr, addr, v), cg


def _lds_vector_twin(n):
    what = f"lds{32 * n}"
    if n == 2:  # (written out: these two are most of an FMA kernel's simulated loads)
        def load(arr, addr):
            i = _aligned(addr, 8, what)
            return arr[i], arr[i + 1]
    elif n == 4:
        def load(arr, addr):
            i = _aligned(addr, 16, what)
            return arr[i], arr[i + 1], arr[i + 2], arr[i + 3]
    else:
        def load(arr, addr):
            i = _aligned(addr, 4 * n, what)
            return tuple(arr[i + k] for k in range(n))

    return load


@with_twin(_lds_vector_twin)
def _lds_vector(n):
    """``ld.shared.v<n>``: n consecutive 4-byte elements of the shared array (its dtype,
    float32 or int32) in one load."""
    regs = ",".join(f"${k}" for k in range(n))

    def typer(typingctx, arr, addr):
        sig = types.UniTuple(arr.dtype, n)(arr, addr)
        f = arr.dtype == types.float32
        ty, c = (f32, "f") if f else (i32, "r")
        text = f"ld.shared.v{n}.{'f32' if f else 'b32'} {{{regs}}}, [${n}];"

        def cg(ctx, b, s, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([ty] * n), [i32]),
                               text, ",".join([f"={c}"] * n + ["r"]), side_effect=True)
            r = b.call(asm, [addr32(ctx, b, args[1], s.args[1])])
            return ctx.make_tuple(b, s.return_type, [b.extract_value(r, k) for k in range(n)])

        return sig, cg

    typer.__name__ = f"lds{32 * n}"
    return intrinsic(typer)


lds64 = _lds_vector(2)
lds128 = _lds_vector(4)


def _sts128_twin(arr, addr, v0, v1, v2, v3):
    i = _aligned(addr, 16, "sts128")
    arr[i], arr[i + 1], arr[i + 2], arr[i + 3] = v0, v1, v2, v3


@intrinsic_with_twin(_sts128_twin)
def sts128(typingctx, arr, addr, v0, v1, v2, v3):
    # four floats, or four int32 words (their bits, as they are) where v0 is an integer
    integer = isinstance(v0, types.Integer)
    ty, nty, c = (i32, types.int32, "r") if integer else (f32, types.float32, "f")

    def cg(ctx, b, sig, args):
        xs = [ctx.cast(b, x, t, nty) for x, t in zip(args[2:], sig.args[2:])]
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32] + [ty] * 4),
                           f"st.shared.v4.{'b32' if integer else 'f32'} [$0], {{$1, $2, $3, $4}};",
                           f"r,{c},{c},{c},{c},~{{memory}}", side_effect=True)
        b.call(asm, [addr32(ctx, b, args[1], sig.args[1])] + xs)
        return ctx.get_dummy_value()

    return types.void(arr, addr, v0, v1, v2, v3), cg


def _sts64_twin(arr, addr, v0, v1):
    i = _aligned(addr, 8, "sts64")
    arr[i], arr[i + 1] = v0, v1


@intrinsic_with_twin(_sts64_twin)
def sts64(typingctx, arr, addr, v0, v1):
    def cg(ctx, b, sig, args):
        xs = [ctx.cast(b, x, t, types.int32) for x, t in zip(args[2:], sig.args[2:])]
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32] * 3),
                           "st.shared.v2.b32 [$0], {$1, $2};", "r,r,r,~{memory}",
                           side_effect=True)
        b.call(asm, [addr32(ctx, b, args[1], sig.args[1])] + xs)
        return ctx.get_dummy_value()

    return types.void(arr, addr, v0, v1), cg


# -- vector stores to global memory -----------------------------------------------------------

def _address(arr):
    return arr.__array_interface__["data"][0]


def _first_aligned(nbytes):
    """``aligned(arr)``: whether the array's first element is aligned to ``nbytes(itemsize)``
    bytes (a power of two), on the GPU and in the simulator."""

    def twin(arr):
        return _address(arr) % nbytes(arr.dtype.itemsize) == 0

    @intrinsic_with_twin(twin)
    def aligned(typingctx, arr):
        n = nbytes(arr.dtype.bitwidth // 8)

        def cg(ctx, b, s, args):
            addr = b.ptrtoint(array_data(ctx, b, s.args[0], args[0]), i64)
            return b.icmp_unsigned("==", b.and_(addr, ir.Constant(i64, n - 1)),
                                   ir.Constant(i64, 0))

        return types.boolean(arr), cg

    return aligned


aligned_x4 = _first_aligned(lambda itemsize: 4 * itemsize)  # four elements' bytes
aligned16 = _first_aligned(lambda itemsize: 16)  # a bulk copy's (tma.bulk_store)


def _x4_at(arr, i0, i1, i2, i3, name, n=4):
    """(Simulator) The indices of an x4 access (or of ``n`` elements), checked as the GPU
    would: its element's real address aligned to the elements' bytes."""
    at = (int(i0), int(i1), int(i2), int(i3))
    _aligned(_address(arr) + sum(i * st for i, st in zip(at, arr.strides)),
             n * arr.dtype.itemsize, name, "global address")
    return at


def _st_global_twin(name, n):
    def twin(arr, i0, i1, i2, i3, *xs):
        at = _x4_at(arr, i0, i1, i2, i3, name, n)
        for k, x in enumerate(xs):
            arr[at[0], at[1], at[2], at[3] + k] = x

    return twin


def _st_global_cg(n):
    """The GPU form of ``st_global_x4`` / ``st_global_x2``: one vector store of ``n``
    elements."""
    def cg(ctx, b, s, args):
        ptr = item_pointer(ctx, b, s.args[0], args[0], args[1:5], s.args[1:5])
        elt = ctx.get_data_type(s.args[0].dtype)
        vec = ir.VectorType(elt, n)
        v = ir.Constant(vec, ir.Undefined)
        for k in range(n):
            x = ctx.cast(b, args[5 + k], s.args[5 + k], s.args[0].dtype)
            v = b.insert_element(v, x, ir.Constant(i32, k))
        st = b.store(v, b.bitcast(ptr, vec.as_pointer()))
        st.align = n * s.args[0].dtype.bitwidth // 8
        return ctx.get_dummy_value()

    return cg


@intrinsic_with_twin(_st_global_twin("st_global_x4", 4))
def st_global_x4(typingctx, arr, i0, i1, i2, i3, x0, x1, x2, x3):
    return types.void(arr, i0, i1, i2, i3, x0, x1, x2, x3), _st_global_cg(4)


@intrinsic_with_twin(_st_global_twin("st_global_x2", 2))
def st_global_x2(typingctx, arr, i0, i1, i2, i3, x0, x1):
    return types.void(arr, i0, i1, i2, i3, x0, x1), _st_global_cg(2)


def _ld_global_x4_twin(arr, i0, i1, i2, i3):
    at = _x4_at(arr, i0, i1, i2, i3, "ld_global_x4")
    return tuple(arr[at[0], at[1], at[2], at[3] + k] for k in range(4))


@intrinsic_with_twin(_ld_global_x4_twin)
def ld_global_x4(typingctx, arr, i0, i1, i2, i3):
    sig = types.UniTuple(arr.dtype, 4)(arr, i0, i1, i2, i3)

    def cg(ctx, b, s, args):
        ptr = item_pointer(ctx, b, s.args[0], args[0], args[1:5], s.args[1:5])
        elt = ctx.get_data_type(s.args[0].dtype)
        vec = ir.VectorType(elt, 4)
        ld = b.load(b.bitcast(ptr, vec.as_pointer()))
        ld.align = 4 * s.args[0].dtype.bitwidth // 8
        return ctx.make_tuple(b, s.return_type,
                              [b.extract_element(ld, ir.Constant(i32, k)) for k in range(4)])

    return sig, cg


# -- asynchronous copies (cp.async) ------------------------------------------------------------

class _GlobalAddr:
    """The simulator's global address: an array and a byte offset into its C-order data
    (``flat``: that data as a 1-D view, where the array is C-contiguous)."""

    def __init__(self, src, byte, flat, itemsize):
        self.src, self.byte, self.flat, self.itemsize = src, byte, flat, itemsize

    def __add__(self, nbytes):
        return _GlobalAddr(self.src, self.byte + int(nbytes), self.flat, self.itemsize)

    def word(self, j):
        i = self.byte // self.itemsize + j
        if self.flat is not None and 0 <= i < len(self.flat):
            return self.flat[i]
        return self.src[np.unravel_index(i, self.src.shape)]  # (past the end: an error)


def _global_addr_twin(src, i0, i1, i2):
    data = np.asarray(getattr(src, "_ary", src))  # (the simulator's array inside its wrapper)
    return _GlobalAddr(src, int(np.ravel_multi_index((i0, i1, i2), data.shape)) * data.itemsize,
                       data.reshape(-1) if data.flags.c_contiguous else None, data.itemsize)


@intrinsic_with_twin(_global_addr_twin)
def global_addr(typingctx, src, i0, i1, i2):
    sig = types.int64(src, i0, i1, i2)

    def cg(ctx, b, s, args):
        return global_window(b, item_pointer(ctx, b, s.args[0], args[0], args[1:4], s.args[1:4]))

    return sig, cg


def _check_line(name, arr, at):
    # (an index out of bounds fails here, as a GPU might fault; NumPy would take a negative
    # one from the end)
    at = tuple(int(i) for i in at)
    if not all(0 <= i < n for i, n in zip(at, arr.shape)):
        raise IndexError(f"{name}: index {at} out of bounds for an array of shape "
                         f"{tuple(arr.shape)}")


def _prefetch_line_cg(nidx):
    """The code of a ``prefetch.global.L2`` of the line of ``arr[i0, .., i{nidx - 1}]``."""
    def cg(ctx, b, s, args):
        idx, tys = args[1:1 + nidx], s.args[1:1 + nidx]
        addr = global_window(b, item_pointer(ctx, b, s.args[0], args[0], idx, tys))
        fnty = ir.FunctionType(ir.VoidType(), [i64])
        b.call(ir.InlineAsm(fnty, "prefetch.global.L2 [$0];", "l", side_effect=True), [addr])
        return ctx.get_dummy_value()

    return cg


@intrinsic_with_twin(lambda arr, i0, i1: _check_line("prefetch_l2", arr, (i0, i1)))
def prefetch_l2(typingctx, arr, i0, i1):
    return types.void(arr, i0, i1), _prefetch_line_cg(2)


@intrinsic_with_twin(lambda arr, i0, i1, i2: _check_line("prefetch_l2_3d", arr, (i0, i1, i2)))
def prefetch_l2_3d(typingctx, arr, i0, i1, i2):
    return types.void(arr, i0, i1, i2), _prefetch_line_cg(3)


def _prefetch_bulk_l2_twin(arr, i0, i1, nbytes):
    # (what the GPU would fault on, or silently read past, fails here)
    data = np.asarray(getattr(arr, "_ary", arr))
    _check_line("prefetch_bulk_l2", data, (i0, i1))
    if not data.flags.c_contiguous:
        raise RuntimeError("prefetch_bulk_l2: the array is not C-contiguous")
    start = int(np.ravel_multi_index((int(i0), int(i1)) + (0,) * (data.ndim - 2), data.shape))
    start *= data.itemsize
    _aligned(_address(data) + start, 16, "prefetch_bulk_l2", "global address")
    if nbytes % 16 or nbytes <= 0:
        raise RuntimeError(f"prefetch_bulk_l2: size {nbytes} is not a positive multiple of 16")
    if start + nbytes > data.nbytes:
        raise IndexError(f"prefetch_bulk_l2: {nbytes} bytes from byte {start} pass the end of "
                         f"an array of {data.nbytes} bytes")


@intrinsic_with_twin(_prefetch_bulk_l2_twin)
def prefetch_bulk_l2(typingctx, arr, i0, i1, nbytes):
    sig = types.void(arr, i0, i1, nbytes)

    def cg(ctx, b, s, args):
        zero = ctx.get_constant(types.intp, 0)
        idx = [args[1], args[2]] + [zero] * (s.args[0].ndim - 2)
        tys = [s.args[1], s.args[2]] + [types.intp] * (s.args[0].ndim - 2)
        addr = global_window(b, item_pointer(ctx, b, s.args[0], args[0], idx, tys))
        fnty = ir.FunctionType(ir.VoidType(), [i64, i32])
        b.call(ir.InlineAsm(fnty, "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r",
                            side_effect=True), [addr, addr32(ctx, b, args[3], s.args[3])])
        return ctx.get_dummy_value()

    return sig, cg


#: (Simulator) What a copy's words hold from its issue to its wait: NaN as fp32, as each
#: 16-bit half (bf16 and fp16) and as each byte (e4m3 codes 0xFF and 0x7F).
IN_FLIGHT = 0x7FFF7FFF


def _land(copy):
    """(Simulator) An issued ``cp.async`` lands: its words into shared memory (read from the
    source now: nothing writes the cache during a kernel)."""
    arr, i, gaddr, valid, words = copy
    for j in range(words):
        arr[i + j] = gaddr.word(j) if valid else 0


def _cp_async_at_twin(nbytes, cache_op):
    words = nbytes // 4

    def copy(arr, addr, gaddr, valid):
        i = _aligned(addr, nbytes, "cp_async")
        _aligned(gaddr.byte, nbytes, "cp_async", "global offset")
        # Until its wait the destination holds neither what was there nor the copy: a
        # reader that is not ordered after the wait, or one still reading what was there
        # when the copy is issued, finds NaN.
        view = arr.view(np.int32)
        for j in range(words):
            view[i + j] = IN_FLIGHT
        AsyncGroups.issue("cp.async", (arr, i, gaddr, valid, words), _land)

    return copy


@with_twin(_cp_async_at_twin)
def _cp_async_at(nbytes, cache_op):
    """The ``cp.async`` of ``nbytes`` from the global address ``gaddr`` to the shared ``addr``
    (``cache_op``: "ca" through L1, "cg" L2 only); a source size of 0 (``valid`` false)
    zero-fills and reads nothing."""
    text = f"cp.async.{cache_op}.shared.global [$0], [$1], {nbytes}, $2;"

    @intrinsic
    def copy(typingctx, arr, addr, gaddr, valid):
        sig = types.void(arr, addr, gaddr, valid)

        def cg(ctx, b, s, args):
            addr = addr32(ctx, b, args[1], s.args[1])
            gaddr = ctx.cast(b, args[2], s.args[2], types.int64)
            ok = ctx.cast(b, args[3], s.args[3], types.boolean)
            size = b.select(ok, ir.Constant(i32, nbytes), ir.Constant(i32, 0))
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i64, i32]), text,
                               "r,l,r,~{memory}", side_effect=True)
            b.call(asm, [addr, gaddr, size])
            return ctx.get_dummy_value()

        return sig, cg

    return copy


cp_async4_at = _cp_async_at(4, "ca")
cp_async16_at = _cp_async_at(16, "cg")
cp_async16_ca_at = _cp_async_at(16, "ca")


def _cp_async_commit_twin():
    AsyncGroups.commit("cp.async")


def _cp_async_wait_twin(pending):
    def wait():
        AsyncGroups.wait("cp.async", pending, _land)

    return wait


cp_async_commit = (_cp_async_commit_twin if SIMULATOR else
                   void_asm("cp.async.commit_group;"))
cp_async_wait_all = _cp_async_wait_twin(0) if SIMULATOR else void_asm("cp.async.wait_group 0;")
cp_async_wait_one = _cp_async_wait_twin(1) if SIMULATOR else void_asm("cp.async.wait_group 1;")
cp_async_wait_two = _cp_async_wait_twin(2) if SIMULATOR else void_asm("cp.async.wait_group 2;")
