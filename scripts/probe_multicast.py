"""Probe: at 128 heads the seesaw kernel's two row groups of a sequence are two blocks that copy
the same key tiles from L2, each on its own. Does a cluster of the two, each block copying half
of every tile's boxes into both blocks' shared memory (TMA ``.multicast::cluster``), get the
tiles to them faster?

Each block streams tiles of 64 rows x 576 16-bit values (nine boxes of 64 x 64, 128-byte
swizzle, one mbarrier a box, two stages: the seesaw kernel's copy) through its shared memory.
128 consumer threads wait for a box, read a word of it each (a checksum) and spin ``--delay``
clock cycles (standing in for the products on that box), and each warp's lane 0 marks the box
consumed by its warp (an mbarrier of four arrivals); a producer warp's lane 0 refills each consumed box with
the tile two ahead. Blocks ``2c`` and ``2c + 1`` read the same tiles.
- ``plain``: each block's producer copies all nine boxes itself (what the kernel does now).
- ``multicast``: the two blocks are a cluster; block ``r``'s producer copies the boxes
  ``j % 2 == r`` into both. A box is refilled once both blocks are done with it: each
  producer, once its consumers are done with the box, announces the box's bytes on its own
  "full" mbarrier and arrives on the owner's "empty" mbarrier (``mapa`` + ``mbarrier.arrive``
  on the ``shared::cluster`` address); the owner's producer waits for both arrivals and copies,
  two boxes later (after its own arrival for box ``j + 2``), so that it does not wait out the
  other block's arrival box by box. The consumers never wait on the other block, only the
  producers do. The blocks meet at a cluster barrier before they exit.

Both modes read the same tiles, so the checksums must agree block for block (the run fails
otherwise). Printed: the median kernel time over ``--reps`` launches and the cycles a tile
(clock64 over each block's loop, the median block), for each delay.

Usage (a GPU of compute capability 9.0): python scripts/probe_multicast.py [--pairs 64]
    [--tiles 128] [--delay 0,200,250,300] [--reps 10] [--out FILE]
"""
import argparse
import ctypes
import sys

import numpy as np
from llvmlite import ir
from numba import cuda, int32, int64, typeof
from numba.cuda import types
from numba.cuda.extending import intrinsic

from numba_mla import ptx
from numba_mla._numba import allow_dynamic_smem, cufunc, item_pointer
from numba_mla.launch import _pack
from numba_mla.ptx._codegen import addr32, i16, i32, i64, void_asm

NT = 128  # consumer threads a block (then one producer warp)
BOXES, BOX_BYTES = 9, 64 * 64 * 2
STAGE = BOXES * BOX_BYTES  # 73,728 bytes a tile
FULL = 2 * STAGE  # byte offset of the full mbarriers [stage][box], then the empty ones
EMPTY = FULL + 2 * BOXES * 8
CONSUMED = EMPTY + 2 * BOXES * 8
LAG = 2  # a block issues its box j's copy after arriving for box j + LAG
SMEM = 200 * 1024  # more than half a multiprocessor's shared memory: one block each


def _special(reg, wide):
    ty, nb = (i64, int64) if wide else (i32, int32)

    @intrinsic
    def read(typingctx):
        def cg(ctx, b, sig, args):
            f = ir.FunctionType(ty, [])
            return b.call(ir.InlineAsm(f, f"mov.u{64 if wide else 32} $0, {reg};",
                                       "=l" if wide else "=r", side_effect=True), [])
        return nb(), cg

    return read


clock64 = _special("%clock64", True)
cluster_rank = _special("%cluster_ctarank", False)
# (not .aligned: the producer warp's lane 0 may arrive after its other lanes)
cluster_sync = void_asm("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;")


@intrinsic
def arrive_at(typingctx, bar, rank):
    """Arrive on the mbarrier at ``bar`` in block ``rank``'s shared memory (this block's own
    where ``rank`` is its own)."""
    def cg(ctx, b, sig, args):
        text = ("{ .reg .b32 ra; mapa.shared::cluster.u32 ra, $0, $1; "
                "mbarrier.arrive.shared::cluster.b64 _, [ra]; }")
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i32]), text,
                           "r,r,~{memory}", side_effect=True)
        b.call(asm, [addr32(ctx, b, args[0], sig.args[0]), addr32(ctx, b, args[1], sig.args[1])])
        return ctx.get_dummy_value()
    return types.void(bar, rank), cg


@intrinsic
def arrive_local(typingctx, bar):
    """Arrive (release, block scope) on this block's mbarrier at ``bar``."""
    def cg(ctx, b, sig, args):
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32]),
                           "mbarrier.arrive.shared::cta.b64 _, [$0];", "r,~{memory}",
                           side_effect=True)
        b.call(asm, [addr32(ctx, b, args[0], sig.args[0])])
        return ctx.get_dummy_value()
    return types.void(bar), cg


@intrinsic
def tma_multicast(typingctx, addr, tmap, col, row, bar, mask):
    """The box at (``col``, ``row``) into shared ``addr`` of every block of the cluster in
    ``mask``, each completing on its own mbarrier at ``bar``."""
    text = ("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
            ".multicast::cluster [$0], [$1, {$2, $3}], [$4], $5;")

    def cg(ctx, b, s, args):
        mp = item_pointer(ctx, b, s.args[1], args[1], [ir.Constant(i64, 0)], [types.int64])
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i64, i32, i32, i32, i16]),
                           text, "r,l,r,r,r,h,~{memory}", side_effect=True)
        b.call(asm, [addr32(ctx, b, args[0], s.args[0]), b.ptrtoint(mp, i64),
                     addr32(ctx, b, args[2], s.args[2]), addr32(ctx, b, args[3], s.args[3]),
                     addr32(ctx, b, args[4], s.args[4]),
                     b.trunc(addr32(ctx, b, args[5], s.args[5]), i16)])
        return ctx.get_dummy_value()
    return types.void(addr, tmap, col, row, bar, mask), cg


tma_load = ptx.tma_load(64, 64, swizzle=True)


def make_kernel(multicast):
    @cuda.jit
    def stream(tmap, src, out, tiles, delay):
        sm = cuda.shared.array(0, int32)
        base = ptx.smem_addr(sm)
        tid = cuda.threadIdx.x
        blk = cuda.blockIdx.x
        rank = cluster_rank()  # 0 outside a cluster
        row0 = (blk // 2) * tiles * 64
        if tid == 0:
            for k in range(2 * BOXES):
                ptx.mbar_init(sm, base + FULL + 8 * k, 1)
                ptx.mbar_init(sm, base + EMPTY + 8 * k, 2)
                ptx.mbar_init(sm, base + CONSUMED + 8 * k, NT // 32)
            ptx.mbar_fence_init()
        if multicast:
            cluster_sync()
        else:
            cuda.syncthreads()
        if tid == NT:  # the producer: the first two tiles, then each box once it is free
            for t in range(min(2, tiles)):
                for j in range(BOXES):
                    bar = base + FULL + 8 * (t * BOXES + j)
                    ptx.mbar_expect_tx(sm, bar, BOX_BYTES)
                    dst = base + t * STAGE + j * BOX_BYTES
                    if not multicast:
                        tma_load(sm, dst, tmap, src, 64 * j, row0 + 64 * t, bar)
                    elif j % 2 == rank:
                        tma_multicast(dst, tmap, 64 * j, row0 + 64 * t, bar, 3)
            for t in range(2, tiles):
                s = t % 2
                parity = (t // 2 - 1) % 2  # of the phase the consumers finished
                for j in range(BOXES + LAG):
                    if j < BOXES:
                        k = s * BOXES + j
                        while not ptx.mbar_try_wait(sm, base + CONSUMED + 8 * k, parity):
                            pass
                        bar = base + FULL + 8 * k
                        ptx.mbar_expect_tx(sm, bar, BOX_BYTES)
                        if not multicast:
                            tma_load(sm, base + s * STAGE + j * BOX_BYTES, tmap, src, 64 * j,
                                     row0 + 64 * t, bar)
                        else:
                            arrive_at(base + EMPTY + 8 * k, j % 2)
                    i = j - LAG  # the box whose copy this block may issue now
                    if multicast and i >= 0 and i % 2 == rank:
                        k = s * BOXES + i
                        while not ptx.mbar_try_wait(sm, base + EMPTY + 8 * k, parity):
                            pass
                        tma_multicast(base + s * STAGE + i * BOX_BYTES, tmap, 64 * i,
                                      row0 + 64 * t, base + FULL + 8 * k, 3)
        acc = int64(0)
        t0 = clock64()
        if tid < NT:  # the consumers
            for t in range(tiles):
                s = t % 2
                parity = (t // 2) % 2
                for j in range(BOXES):
                    k = s * BOXES + j
                    while not ptx.mbar_try_wait(sm, base + FULL + 8 * k, parity):
                        pass
                    acc += sm[k * BOX_BYTES // 4 + 16 * tid + j]  # a word of each row's 16
                    c0 = clock64()
                    while clock64() - c0 < delay:
                        pass
                    cuda.syncwarp()  # the warp is done with the box: its lane 0 says so
                    if tid % 32 == 0:
                        arrive_local(base + CONSUMED + 8 * k)
        t1 = clock64()
        if multicast:
            cluster_sync()  # no block leaves while the other may still copy into it
        else:
            cuda.syncthreads()
        if tid < NT:
            out[blk, tid] = acc  # the thread's checksum
        if tid == 0:
            out[blk, NT] = t1 - t0

    return stream


def launch(kernel, args, blocks, cluster, stream=0):
    from cuda.bindings import driver as drv

    params, cvals, _ = _pack(kernel, args)
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = blocks, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = NT + 32, 1, 1
    cfg.sharedMemBytes = SMEM
    cfg.hStream = stream
    attrs = []
    if cluster:
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = 2, 1, 1
        attrs.append(attr)
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    fn = cufunc(kernel)
    err, = drv.cuLaunchKernelEx(cfg, drv.CUfunction(int(fn.handle)), ctypes.addressof(params), 0)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"launch failed: {err!r}")
    return cvals  # (kept alive until the launch has read them)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=64, help="clusters (pairs of blocks)")
    ap.add_argument("--tiles", type=int, default=128, help="64-row tiles a pair reads")
    ap.add_argument("--delay", default="0,200,250,300", help="cycles spun on each box")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None, help="also write the table here")
    a = ap.parse_args()
    rows = a.pairs * a.tiles * 64
    words = cuda.to_device(
        np.random.default_rng(0).integers(-2**20, 2**20, (rows, 288), dtype=np.int32))
    tmap = ptx.tensor_map(words, rows, 64, 64, swizzle=True)
    blocks = 2 * a.pairs
    out = cuda.device_array((blocks, NT + 1), np.int64)
    name = cuda.get_current_device().name
    name = name.decode() if isinstance(name, bytes) else name
    lines = [f"# probe_multicast: {name}, {a.pairs} pairs x "
             f"{a.tiles} tiles of 64 x 576 bf16 ({rows * 1152 / 1e6:.0f} MB in all, each tile "
             f"read by both blocks of its pair), {a.reps} launches a row",
             f"{'mode':10s} {'delay/box':>9s} {'median us':>10s} {'cycles/tile':>12s} "
             f"{'L2->SM TB/s':>12s}"]
    sums = {}
    for delay in [int(d) for d in a.delay.split(",")]:
        for mode in ("plain", "multicast"):
            k = make_kernel(mode == "multicast")
            args = (tmap, words, out, np.int32(a.tiles), np.int64(delay))
            kern = k.compile(tuple(typeof(x) for x in args))
            allow_dynamic_smem(cufunc(kern), SMEM)
            times, cyc = [], []
            for _ in range(a.reps + 1):
                e0, e1 = cuda.event(), cuda.event()
                e0.record()
                keep = launch(kern, args, blocks, mode == "multicast")
                e1.record()
                e1.synchronize()
                del keep
                times.append(cuda.event_elapsed_time(e0, e1) * 1e3)
                o = out.copy_to_host()
                cyc.append(np.median(o[:, NT]) / a.tiles)
            chk = o[:, :NT].sum(axis=1)
            if np.any(chk[0::2] != chk[1::2]):
                sys.exit(f"{mode}: the two blocks of a pair read different tiles")
            sums.setdefault(delay, chk)
            if np.any(sums[delay] != chk):
                sys.exit(f"{mode}: checksums differ from the plain copy's")
            us = float(np.median(times[1:]))
            tb = blocks * a.tiles * STAGE / us / 1e6
            lines.append(f"{mode:10s} {delay:9d} {us:10.1f} {np.median(cyc[1:]):12.0f} {tb:12.2f}")
            print(lines[-1], flush=True)
    print("checksums agree (both blocks of every pair, both modes)")
    if a.out:
        open(a.out, "w").write("\n".join(lines) + "\nchecksums agree\n")


if __name__ == "__main__":
    main()
