"""Bulk tensor copies (TMA) completing on shared-memory barriers (mbarriers, barriers.py).

The copy engine moves a whole box of a 2-D tensor into shared memory from one instruction;
the threads that issue it spend no registers or load slots on it (16-byte cp.async from every
thread kept the load queue full and stalled the kernel on operand registers). Completion is
counted in bytes on an mbarrier: one thread announces the bytes (``mbar_expect_tx``) and
arrives, each copy signals its bytes, and the barrier's phase flips when both are done.

- ``tensor_map(dev, rows, box_rows, box_cols=8, swizzle=False, row_bytes=1152)`` (host): the
  128-byte tensor map (a uint8 device array) of an array of ``rows`` rows of ``row_bytes``
  bytes seen as 16-bit values (``dev``: its int32-word view; 1152: 576 16-bit values, 576:
  a row of 576 "e4m3" codes taken two at a time), cut into boxes of ``box_rows`` rows x
  ``box_cols`` values. A box lands as its rows one after another; with ``swizzle`` (box_cols 64: rows of
  128 bytes) in the 128-byte swizzled order wgmma's swizzled descriptors read.
- ``tma_load(box_rows, box_cols=8, swizzle=False, evict_first=False)`` -> ``load(arr, addr,
  tmap, src, col, row, bar)``: start copying the box at value column ``col``, row ``row`` to
  the shared ``addr`` (rows past the tensor's end read as zeros), completing on the mbarrier
  at ``bar``; ``evict_first``: with L2's evict-first policy for its lines. The box shape is
  the map's; here it serves the twin, as ``src`` (the array) does.
- ``prefetch_tensormap(tmap)``: start bringing the tensor map ``tmap`` (a uint8 device array
  of 128 bytes: ``tensor_map``'s) into the cache the copy engine reads maps from
  (``prefetch.tensormap``), so that a block's first copy does not wait a trip to memory for
  it; nothing else changes. The simulator checks the array.

- ``bulk_store(smem, saddr, arr, i0, i1, i2, i3, nbytes)``: start copying ``nbytes`` bytes
  from the shared address ``saddr`` to ``arr[i0, i1, i2, i3:]`` (a 4-D array whose last axis
  is contiguous; both addresses 16-byte aligned, ``nbytes`` a multiple of 16), in the
  thread's open bulk group; ``bulk_commit()`` closes the group, ``bulk_wait_read()`` waits
  until every committed group has read its shared memory (which may then be reused, or the
  block leave). The shared bytes must be visible to the copy engine first
  (``fence_proxy_async`` by their writers, then a barrier); ``shared.aligned16(arr)`` tells
  whether an array starts 16-byte aligned.

In the simulator a load writes ``shared.IN_FLIGHT`` words when issued and lands, counted off
its mbarrier, when a thread first tests that mbarrier (``barriers.land_later``); a bulk store
happens when issued.
"""
import ctypes

import numpy as np
from llvmlite import ir
from numba import cuda
from numba.cuda import types
from numba.cuda.extending import intrinsic

from .._compat import SIMULATOR
from .._numba import item_pointer
from ._codegen import addr32, global_window, i32, i64, void_asm
from ._twin import intrinsic_with_twin, no_op, with_twin
from .barriers import complete_tx, land_later
from .shared import IN_FLIGHT, _aligned, _x4_at
from .wgmma import swizzle128


def _tensor_map_twin(dev, rows, box_rows, box_cols=8, swizzle=False, row_bytes=1152):
    return cuda.to_device(np.zeros(128, np.uint8))  # unused: tma_load's twin reads src


@with_twin(_tensor_map_twin)
def tensor_map(dev, rows, box_rows, box_cols=8, swizzle=False, row_bytes=1152):
    from cuda.bindings import driver as cu

    ptr = dev.__cuda_array_interface__["data"][0]
    u32, u64 = cu.cuuint32_t, cu.cuuint64_t
    err, tmap = cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16, u32(2), ptr,
        [u64(row_bytes // 2), u64(rows)], [u64(row_bytes)], [u32(box_cols), u32(box_rows)],
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


def _tma_load_twin(box_rows, box_cols=8, swizzle=False, evict_first=False):
    words = box_cols // 2
    rows = np.arange(box_rows)[:, None]
    offsets = 2 * box_cols * rows + 4 * np.arange(words)[None, :]  # bytes from addr

    def load(arr, addr, tmap, src, col, row, bar):
        flat = np.asarray(getattr(src, "_ary", src)).reshape(-1, src.shape[2])  # [rows, 288]
        box = np.zeros((box_rows, words), np.int32)  # rows past the end read as zeros
        n = max(0, min(box_rows, flat.shape[0] - row))
        box[:n] = flat[row:row + n, col // 2:col // 2 + words]
        byte = addr + offsets
        at = (swizzle128(byte) if swizzle else byte) // 4
        dst = np.asarray(arr)
        dst[at] = IN_FLIGHT  # (until a thread tests the mbarrier: land_later)

        def land():
            dst[at] = box
            complete_tx(arr, bar, 2 * box_cols * box_rows)

        land_later(arr, bar, land)

    return load


@with_twin(_tma_load_twin)
def tma_load(box_rows, box_cols=8, swizzle=False, evict_first=False):
    # evict_first: the copy's lines are the first L2 gives up (an L2 cache policy made in
    # place: createpolicy), so a stream read once leaves the rest of L2 alone
    copy = "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    text = ("{ .reg .b64 p; createpolicy.fractional.L2::evict_first.b64 p, 1.0; "
            f"{copy}.L2::cache_hint [$0], [$1, {{$2, $3}}], [$4], p; }}" if evict_first
            else f"{copy} [$0], [$1, {{$2, $3}}], [$4];")

    @intrinsic
    def load(typingctx, arr, addr, tmap, src, col, row, bar):
        sig = types.void(arr, addr, tmap, src, col, row, bar)

        def cg(ctx, b, s, args):
            mp = item_pointer(ctx, b, s.args[2], args[2], [ir.Constant(i64, 0)], [types.int64])
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i64, i32, i32, i32]), text,
                               "r,l,r,r,r,~{memory}", side_effect=True)
            b.call(asm, [addr32(ctx, b, args[1], s.args[1]), b.ptrtoint(mp, i64),
                         addr32(ctx, b, args[4], s.args[4]),
                         addr32(ctx, b, args[5], s.args[5]),
                         addr32(ctx, b, args[6], s.args[6])])
            return ctx.get_dummy_value()

        return sig, cg

    return load


def _prefetch_tensormap_twin(tmap):
    ary = np.asarray(getattr(tmap, "_ary", tmap))
    if ary.dtype != np.uint8 or ary.ndim != 1 or ary.size < 128:
        raise RuntimeError(f"prefetch_tensormap: not a tensor map ({ary.dtype}, {ary.shape})")


@intrinsic_with_twin(_prefetch_tensormap_twin)
def prefetch_tensormap(typingctx, tmap):
    def cg(ctx, b, s, args):
        mp = item_pointer(ctx, b, s.args[0], args[0], [ir.Constant(i64, 0)], [types.int64])
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i64]), "prefetch.tensormap [$0];",
                           "l", side_effect=True)
        b.call(asm, [b.ptrtoint(mp, i64)])
        return ctx.get_dummy_value()

    return types.void(tmap), cg


def _bulk_store_twin(smem, saddr, arr, i0, i1, i2, i3, nbytes):
    ary = getattr(arr, "_ary", arr)
    _aligned(saddr, 16, "bulk_store")
    at = _x4_at(ary, i0, i1, i2, i3, "bulk_store", 16 // ary.dtype.itemsize)
    if nbytes % 16:
        raise RuntimeError(f"bulk_store: size {nbytes} is not a multiple of 16")
    if ary.strides[3] != ary.dtype.itemsize:
        raise RuntimeError(f"bulk_store: the destination's last axis has stride {ary.strides[3]}")
    n = nbytes // ary.dtype.itemsize
    if at[3] + n > ary.shape[3]:
        raise RuntimeError(f"bulk_store: {n} elements from {at[3]} pass the row's end")
    ary[at[0], at[1], at[2], at[3]:at[3] + n] = (
        np.asarray(smem).view(np.uint8)[saddr:saddr + nbytes].view(ary.dtype))


@intrinsic_with_twin(_bulk_store_twin)
def bulk_store(typingctx, smem, saddr, arr, i0, i1, i2, i3, nbytes):
    sig = types.void(smem, saddr, arr, i0, i1, i2, i3, nbytes)

    def cg(ctx, b, s, args):
        ptr = item_pointer(ctx, b, s.args[2], args[2], args[3:7], s.args[3:7])
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i64, i32, i32]),
                           "cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;",
                           "l,r,r,~{memory}", side_effect=True)
        b.call(asm, [global_window(b, ptr), addr32(ctx, b, args[1], s.args[1]),
                     addr32(ctx, b, args[7], s.args[7])])
        return ctx.get_dummy_value()

    return sig, cg


bulk_commit = no_op if SIMULATOR else void_asm("cp.async.bulk.commit_group;")
bulk_wait_read = no_op if SIMULATOR else void_asm("cp.async.bulk.wait_group.read 0;")
