"""Hopper warpgroup tensor cores: ``wgmma.mma_async``, its descriptors, fences and waits.

A warpgroup (4 warps, 128 threads) issues ``wgmma.mma_async`` together: D[64 x N] (fp32, in
registers, laid out as accumulators.py says) (+)= A[64 x 16] . B[16 x N], A and B 16-bit in
shared memory, read through *descriptors*. Without swizzle the operand is cut into core
matrices of 8 rows x 16 bytes, each 128 contiguous bytes, placed at
    K-major (A, and B = K^T):  byte(r, k) = (r//8)*SBO + (k//8)*LBO + (r%8)*16 + (k%8)*2
    MN-major (B = V, "trans-b"): byte(k, n) = (n//8)*SBO + (k//8)*LBO + (k%8)*16 + (n%8)*2
(r: row of A or column n of B; LBO steps along K, SBO along M or N).

- ``wgmma_desc(lbo, sbo, swizzle=False)`` -> ``desc(addr)``: the 64-bit descriptor of an
  operand at the 32-bit shared address ``addr`` (LBO, SBO compile-time). ``swizzle``: the
  128-byte swizzled layout TMA writes (rows of 64 values, 128 bytes; 16-byte chunk j of
  row r at j ^ (r % 8)): K-major, atoms of 8 rows SBO apart (LBO unused; a K step of 16
  moves the start 32 bytes); MN-major, N in 64-value atoms LBO apart, K in 8-row groups SBO
  apart. ``desc_advance(desc, nbytes)``: the descriptor of the operand ``nbytes`` further
  on (one 64-bit add: the address field, addr >> 4 in the low 14 bits, never carries within
  shared memory's 228 KB), so a loop of products builds its descriptors once;
  ``desc_advance_lo(desc, nbytes)`` the same as a 32-bit add to the low word.
- ``wgmma(n, tag, trans_b)`` -> ``mma(acc, arr, desc_a, desc_b, accumulate, wtid)``: issue one
  m64n{n}k16 product (tag "bf16" or "f16") into ``acc[:n//2]``; ``accumulate`` 0 overwrites.
  ``arr`` (the shared array) and ``wtid`` (thread index in the warpgroup) serve the twin.
- ``wgmma_rs(n, tag, trans_b, start=0)`` -> ``mma(acc, a0, a1, a2, a3, arr, desc_b,
  accumulate, tid)``: the same product into ``acc[start:start + n//2]`` with A from
  registers: the thread's four int32 words of A [64 x 16] (16-bit pairs) in mma.sync's A
  layout over its warp's 16 rows (r = 16*(warp % 4) + lane//4, t = lane % 4): a0 = A[r,
  2t:2t+2], a1 = A[r+8, 2t:2t+2], a2 = A[r, 2t+8:2t+10], a3 = A[r+8, 2t+8:2t+10]. That is
  an accumulator's layout: words packed from a score fragment (keys 16j..16j+15: elements
  8j..8j+7, in pairs) are A for P V, no shared memory in between. ``tid`` is the thread's
  index in its block (the twin exchanges within a warp).
- ``wgmma_fence()`` before the first wgmma of a batch (orders register writes to the
  accumulators), ``wgmma_commit()`` closes the batch; ``wgmma_wait(nacc)`` -> ``wait(acc)``
  waits for every committed batch, with ``acc[:nacc]`` tied through so no read of it moves
  above the wait; ``wgmma_wait2(n1, n2)`` -> ``wait(acc1, acc2)`` ties two accumulators
  (a wait that also covers an earlier batch into another accumulator);
  ``wgmma_wait_pending(n1, n2, k)`` -> ``wait(acc1, acc2)`` the same, but leaves the last
  ``k`` batches running (``wgmma.wait_group k``).
- ``fence_proxy_async()``: shared-memory writes by ordinary stores and cp.async become
  visible to wgmma (the async proxy); then a barrier.

The twins decode the descriptors' bits to find the operands in the shared array and compute the
thread's part of the product in float64, when a wait of the thread completes the product's
group (``_twin.AsyncGroups``): the GPU may read the operands and write the accumulators any
time up to then, so an operand overwritten, or an accumulator read, before that wait shows as
a wrong result in the simulator too. The fences have nothing to do.
"""
import functools

import numpy as np
from llvmlite import ir
from numba import uint64
from numba.cuda import types
from numba.cuda.extending import intrinsic

from .._compat import SIMULATOR
from ._codegen import acc_pointers, i32, i64, tied_asm, void_asm
from ._twin import AsyncGroups, device_with_twin, intrinsic_with_twin, no_op, with_twin
from .accumulators import _acc_col, _acc_row
from .mma_sync import DTYPES, a_fragment, halves
from .warp import warp_once

# -- descriptors -------------------------------------------------------------------------------


def swizzle128(byte):
    """The 128-byte swizzle (TMA's and wgmma's): 16-byte chunk j of a 128-byte row r sits at
    chunk j ^ (r % 8); address bits 4-6 take bits 7-9 (buffers 1024-byte aligned)."""
    return byte ^ (((byte >> 7) & 7) << 4)


def _wgmma_desc_twin(lbo, sbo, swizzle=False):
    def desc(addr):
        return (((int(addr) >> 4) & 0x3FFF) | (((lbo >> 4) & 0x3FFF) << 16)
                | (((sbo >> 4) & 0x3FFF) << 32) | (int(swizzle) << 62))

    return desc


@with_twin(_wgmma_desc_twin)
def wgmma_desc(lbo, sbo, swizzle=False):
    # Built inside an intrinsic: mixing uint64 and int64 in Numba code promotes to float64.
    # The address is masked to its 14 bits (ptxas folds the CTA id into the bits above 24).
    hi = ((lbo >> 4) & 0x3FFF) << 16 | ((sbo >> 4) & 0x3FFF) << 32 | int(swizzle) << 62

    @intrinsic
    def desc(typingctx, addr):
        def cg(ctx, b, sig, args):
            a = b.zext(ctx.cast(b, args[0], sig.args[0], types.uint32), i64)
            a = b.and_(b.lshr(a, ir.Constant(i64, 4)), ir.Constant(i64, 0x3FFF))
            return b.or_(a, ir.Constant(i64, hi))

        return types.uint64(addr), cg

    return desc


def _desc_advance_twin(desc, nbytes):
    return desc + (int(nbytes) >> 4)


@device_with_twin(_desc_advance_twin)
def desc_advance(desc, nbytes):
    return desc + uint64(nbytes >> 4)


def _desc_advance_lo_twin(desc, nbytes):
    desc, step = int(desc), int(nbytes) >> 4
    assert (desc & 0x3FFF) + step < 0x4000, "the address field would carry"
    return (desc & ~0xFFFFFFFF) | ((desc + step) & 0xFFFFFFFF)


@intrinsic_with_twin(_desc_advance_lo_twin)
def desc_advance_lo(typingctx, desc, nbytes):
    """``desc_advance`` as a 32-bit add to the descriptor's low word, its high word kept:
    the same value (the address field, in the low 14 bits, never carries within shared
    memory), but ptxas, which cannot know that of a 64-bit add, then adds one word where it
    added two with the carry between them."""
    def cg(ctx, b, sig, args):
        d = ctx.cast(b, args[0], sig.args[0], types.uint64)
        n = ctx.cast(b, args[1], sig.args[1], types.int64)
        step = b.trunc(b.lshr(n, ir.Constant(i64, 4)), i32)
        # (in PTX: LLVM, seeing the disjoint bits, would make the word's add a 64-bit one)
        asm = ir.InlineAsm(ir.FunctionType(i64, [i64, i32]),
                           "{ .reg .b32 lo, hi; mov.b64 {lo, hi}, $1; add.u32 lo, lo, $2; "
                           "mov.b64 $0, {lo, hi}; }", "=l,l,r")
        return b.call(asm, [d, step])

    return types.uint64(desc, nbytes), cg


def _read_only(*arrays):
    """(Simulator) ``arrays``, made read-only: the cached index arrays below are shared by
    every thread."""
    for a in arrays:
        a.flags.writeable = False
    return arrays


@functools.lru_cache(maxsize=4096)
def _operand_halves(desc, rows, kmajor):
    """(Simulator) Where the 16-bit operand a descriptor describes lies in shared memory: the
    indices of its 16-bit elements [rows, 16] (A: rows = M; B: rows = N, so the product is
    A @ B_op.T), decoded from the descriptor's bits. Computed once for each descriptor a
    kernel uses (by every thread of a warpgroup, on every tile) and kept read-only."""
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
        byte = swizzle128(byte)
    elif kmajor:
        byte = addr + (r // 8) * sbo + (k // 8) * lbo + (r % 8) * 16 + (k % 8) * 2
    else:
        byte = addr + (r // 8) * sbo + (k // 8) * lbo + (k % 8) * 16 + (r % 8) * 2
    return _read_only((byte // 2).astype(np.int32))[0]


# -- products ----------------------------------------------------------------------------------

def _store(acc, d, accumulate, start=0):
    """(Simulator) The thread's accumulators ``acc[start + i] (+)= d[i]`` (``accumulate`` 0
    overwrites); ``d`` (float64) is not changed."""
    if accumulate:
        d = d + acc[start:start + len(d)]
    acc[start:start + len(d)] = d


@functools.lru_cache(maxsize=None)
def _thread_cells(n, wtid):
    """(Simulator) The rows and columns of a m64n{n} product that thread ``wtid`` of the
    warpgroup holds, as (its 2 rows, its n/4 columns, each accumulator's index into those
    rows, ... into those columns): the twins gather only these from shared memory."""
    idx = np.arange(n // 2)
    rows, row_of = np.unique(_acc_row(idx, wtid), return_inverse=True)
    cols, col_of = np.unique(_acc_col(idx, wtid), return_inverse=True)
    return _read_only(rows, cols, row_of.ravel(), col_of.ravel())


def _gather(arr, halves, dtype):
    """(Simulator) The 16-bit values of ``arr`` at the 16-bit element indices ``halves``, as
    float64."""
    return np.asarray(arr).view(np.uint16)[halves].view(dtype).astype(np.float64)


#: The LLVM type and the inline-asm constraint of an integer operand, by its Numba type.
_ASM_OPERAND = {types.uint64: (i64, "l"), types.uint32: (i32, "r"), types.int32: (i32, "r")}


def _product_asm(n, tag, trans_b, a_in_registers):
    """The inline PTX of one m64n{n}k16 product. Operands: the n/2 accumulators, A (its
    descriptor, or ``a_in_registers``: four 32-bit words, and then no transpose flag for A),
    B's descriptor, the accumulate flag (0: overwrite)."""
    nacc = n // 2
    acc = ",".join(f"${i}" for i in range(nacc))
    if a_in_registers:
        a = "{" + ",".join(f"${nacc + i}" for i in range(4)) + "}"
        desc_b, trans = nacc + 4, f"{int(trans_b)}"
    else:
        a, desc_b, trans = f"${nacc}", nacc + 1, f"0, {int(trans_b)}"
    return (f"{{ .reg .pred p; setp.ne.b32 p, ${desc_b + 1}, 0; "
            f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{tag}.{tag} {{{acc}}}, {a}, "
            f"${desc_b}, p, 1, 1, {trans}; }}")


def _product_cg(nacc, text, operands, start=0):
    """Codegen of ``text`` with accumulator argument 0's values ``start .. start + nacc - 1``
    tied through, then the arguments ``operands`` lists as (argument index, Numba type it is
    cast to); the arguments not listed serve only the twin."""
    lltypes, cons = zip(*(_ASM_OPERAND[ty] for _, ty in operands))

    def cg(ctx, b, sig, args):
        ptrs = acc_pointers(ctx, b, sig.args[0], args[0], nacc, start)
        ins = [ctx.cast(b, args[k], sig.args[k], ty) for k, ty in operands]
        tied_asm(b, ptrs, text, list(lltypes), list(cons), ins)
        return ctx.get_dummy_value()

    return cg


def _wgmma_twin(n, tag, trans_b):
    dtype = DTYPES[tag]

    def mma(acc, arr, desc_a, desc_b, accumulate, wtid):
        rows, cols, row_of, col_of = _thread_cells(n, int(wtid))
        desc_a, desc_b = int(desc_a), int(desc_b)

        def complete():  # (at the wait: the operands as shared memory holds them then)
            a = _gather(arr, _operand_halves(desc_a, 64, True)[rows], dtype)
            bt = _gather(arr, _operand_halves(desc_b, n, not trans_b)[cols], dtype)
            _store(acc, (a @ bt.T)[row_of, col_of], accumulate)  # a[row_of[i]] . bt[col_of[i]]

        AsyncGroups.issue("wgmma", complete)

    return mma


@with_twin(_wgmma_twin)
def wgmma(n, tag, trans_b):
    cg = _product_cg(n // 2, _product_asm(n, tag, trans_b, False),
                     [(2, types.uint64), (3, types.uint64), (4, types.uint32)])

    @intrinsic
    def mma(typingctx, acc, arr, desc_a, desc_b, accumulate, wtid):
        return types.void(acc, arr, desc_a, desc_b, accumulate, wtid), cg

    return mma


@functools.lru_cache(maxsize=None)
def _lane_cells(n):
    """(Simulator) Where each lane's accumulators lie in its warp's 16 x n rows of a m64n{n}
    product: (row in the warp's 16, column) of each, [32 lanes, n/2], read-only (the same in
    every warp of the warpgroup)."""
    cells = [_thread_cells(n, lane) for lane in range(32)]
    return _read_only(np.stack([rows[row_of] % 16 for rows, _, row_of, _ in cells]),
                      np.stack([cols[col_of] for _, cols, _, col_of in cells]))


def _wgmma_rs_twin(n, tag, trans_b, start=0):
    dtype = DTYPES[tag]

    def mma(acc, a0, a1, a2, a3, arr, desc_b, accumulate, tid):
        def product(words):  # once a warp: its 16 rows of A (its lanes' words) times B, the
            # first time one of its lanes waits for it (B as shared memory holds it then)
            a = a_fragment(halves(words, dtype))
            done = []

            def lanes():
                if not done:
                    bt = _gather(arr, _operand_halves(int(desc_b), n, not trans_b), dtype)
                    d = a @ bt.T  # [16, n], float64 (each product exact)
                    done.append(d[_lane_cells(n)])  # [lane, n/2]: each lane's accumulators
                return done[0]

            return lanes

        lanes = warp_once((a0, a1, a2, a3), product, tid)
        lane = int(tid) % 32
        AsyncGroups.issue("wgmma", lambda: _store(acc, lanes()[lane], accumulate, start))

    return mma


@with_twin(_wgmma_rs_twin)
def wgmma_rs(n, tag, trans_b, start=0):
    cg = _product_cg(n // 2, _product_asm(n, tag, trans_b, True),
                     [(k, types.int32) for k in range(1, 5)]
                     + [(6, types.uint64), (7, types.uint32)], start)

    @intrinsic
    def mma(typingctx, acc, a0, a1, a2, a3, arr, desc_b, accumulate, tid):
        return types.void(acc, a0, a1, a2, a3, arr, desc_b, accumulate, tid), cg

    return mma


# -- fences, commits, waits --------------------------------------------------------------------

def _wgmma_commit_twin():
    AsyncGroups.commit("wgmma")


wgmma_fence = no_op if SIMULATOR else void_asm("wgmma.fence.sync.aligned;")
wgmma_commit = _wgmma_commit_twin if SIMULATOR else void_asm("wgmma.commit_group.sync.aligned;")
fence_proxy_async = no_op if SIMULATOR else void_asm("fence.proxy.async.shared::cta;")


def _wait_all(counts, pending=0):
    """Codegen of ``wgmma.wait_group pending`` with the first ``counts[i]`` values of
    accumulator argument i tied through."""

    def cg(ctx, b, sig, args):
        ptrs = [ptr for ty, acc, n in zip(sig.args, args, counts)
                for ptr in acc_pointers(ctx, b, ty, acc, n)]
        tied_asm(b, ptrs, f"wgmma.wait_group.sync.aligned {pending};", [], [], [])
        return ctx.get_dummy_value()

    return cg


def _wgmma_wait_twin(nacc):
    def wait(acc):
        AsyncGroups.wait("wgmma", 0)

    return wait


@with_twin(_wgmma_wait_twin)
def wgmma_wait(nacc):
    @intrinsic
    def wait(typingctx, acc):
        return types.void(acc), _wait_all((nacc,))

    return wait


def _wgmma_wait_pending_twin(n1, n2, pending):
    def wait(acc1, acc2):
        AsyncGroups.wait("wgmma", pending)

    return wait


@with_twin(_wgmma_wait_pending_twin)
def wgmma_wait_pending(n1, n2, pending):
    """``wait(acc1, acc2)``: ``wgmma.wait_group pending``: every committed group but the last
    ``pending`` is done (groups complete in order). ptxas then knows which products' register
    A fragments are free again: a kernel that converts each group's fragments just before
    issuing it needs registers for ``pending + 1`` groups, not for every product in flight
    (nor serialised products)."""

    @intrinsic
    def wait(typingctx, acc1, acc2):
        return types.void(acc1, acc2), _wait_all((n1, n2), pending)

    return wait


def wgmma_wait2(n1, n2):
    """``wait(acc1, acc2)``: ``wgmma.wait_group 0`` with two accumulators tied through."""
    return wgmma_wait_pending(n1, n2, 0)
