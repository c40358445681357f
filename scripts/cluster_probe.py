"""Probe: thread-block clusters from Numba on sm_90, for a design of the FMA kernel at 16 rows
in which two multiprocessors split a tile's dims (each then has room for fp32 tiles).

Launches pairs of blocks as clusters (cuLaunchKernelEx with a cluster-dimension attribute),
reads the peer block's shared memory (mapa + ld.shared::cluster) and checks the values, and
times, in clock cycles per iteration: barrier.cluster (arrive + wait), __syncthreads, and
dependent chains of DSMEM and local shared loads (the chains include two integer remainders a
step, so compare them with each other). Usage: python scripts/cluster_probe.py [--ptx]

Measured on the H200 (2026-11-30): values right; barrier.cluster 444 cycles, __syncthreads 43,
arrive.release + wait.acquire 436, DSMEM chain 382 vs 232 local (about 150 cycles more a load).
"""
import ctypes
import sys

import numpy as np
from llvmlite import ir
from numba import cuda, int32, types
from numba.cuda.extending import intrinsic
from numba_mla import ptx

I32, I64 = ir.IntType(32), ir.IntType(64)
VOID = ir.FunctionType(ir.VoidType(), [])


def _special_register(name, reg, wide):
    """An intrinsic that reads the special register ``reg`` (64-bit where ``wide``)."""
    ty, nb_ty = (I64, types.int64) if wide else (I32, types.int32)
    text = f"mov.u{64 if wide else 32} $0, {reg};"

    def typer(typingctx):
        def cg(ctx, b, sig, args):
            f = ir.FunctionType(ty, [])
            return b.call(ir.InlineAsm(f, text, "=l" if wide else "=r", side_effect=True), [])
        return nb_ty(), cg

    typer.__name__ = name
    return intrinsic(typer)


cluster_rank = _special_register("cluster_rank", "%cluster_ctarank", False)
clock64 = _special_register("clock64", "%clock64", True)


def _barrier(name, text):
    """An intrinsic that emits the barrier instruction(s) ``text``."""

    def typer(typingctx):
        def cg(ctx, b, sig, args):
            b.call(ir.InlineAsm(VOID, text, "~{memory}", side_effect=True), [])
            return ctx.get_dummy_value()
        return types.void(), cg

    typer.__name__ = name
    return intrinsic(typer)


cluster_sync = _barrier(
    "cluster_sync", "barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;")
cluster_arrive = _barrier("cluster_arrive", "barrier.cluster.arrive.release.aligned;")
cluster_wait = _barrier("cluster_wait", "barrier.cluster.wait.acquire.aligned;")


@intrinsic
def mapa(typingctx, addr, rank):
    def cg(ctx, b, sig, args):
        a = ctx.cast(b, args[0], sig.args[0], types.uint32)
        r = ctx.cast(b, args[1], sig.args[1], types.uint32)
        text = "mapa.shared::cluster.u32 $0, $1, $2;"
        return b.call(ir.InlineAsm(ir.FunctionType(I32, [I32, I32]), text, "=r,r,r"), [a, r])
    return types.uint32(addr, rank), cg


@intrinsic
def ld_cluster(typingctx, addr):
    def cg(ctx, b, sig, args):
        a = b.trunc(ctx.cast(b, args[0], sig.args[0], types.int64), I32)
        text = "ld.shared::cluster.u32 $0, [$1];"
        asm = ir.InlineAsm(ir.FunctionType(I32, [I32]), text, "=r,r", side_effect=True)
        return b.call(asm, [a])
    return types.int32(addr), cg




@cuda.jit
def probe(out, iters):
    sm = cuda.shared.array(64, int32)
    tid = cuda.threadIdx.x
    rank = cluster_rank()
    if tid < 64:
        sm[tid] = int32((tid + 1) % 64 + 1000 * rank)
    cluster_sync()
    peer = mapa(ptx.smem_addr(sm), rank ^ 1)
    v = ld_cluster(peer + 4 * (tid % 64))
    cluster_sync()
    t0 = clock64()
    for i in range(iters):
        cluster_sync()
    t1 = clock64()
    for i in range(iters):
        cuda.syncthreads()
    t2 = clock64()
    for i in range(iters):
        cluster_arrive()
        cluster_wait()
    t3 = clock64()
    x = int32(tid % 64)
    for i in range(iters):  # dependent chain of DSMEM loads
        x = ld_cluster(peer + 4 * (x % 64)) % 1000
    t4 = clock64()
    y = int32(tid % 64)
    for i in range(iters):  # dependent chain of local shared loads
        y = ptx.lds32(sm, ptx.smem_addr(sm) + 4 * (y % 64)) % 1000
    t5 = clock64()
    cluster_sync()  # the peer's shared memory stays alive until every read of it is done
    b = cuda.blockIdx.x
    out[b, tid, 0] = v
    out[b, tid, 1] = rank
    out[b, tid, 2] = t1 - t0
    out[b, tid, 3] = t2 - t1
    out[b, tid, 4] = t3 - t2
    out[b, tid, 5] = t4 - t3
    out[b, tid, 6] = t5 - t4
    out[b, tid, 7] = x + y


if __name__ == "__main__":
    if "--ptx" in sys.argv:
        sig = (types.Array(types.int64, 3, "C"), types.int32)
        p, _ = cuda.compile_ptx(probe.py_func, sig, cc=(9, 0))
        open("cluster_probe.ptx", "w").write(p)
        print("ptx ok", len(p))
        sys.exit()
    from cuda.bindings import driver as drv
    from numba.core.typing import typeof

    from numba_mla.launch import _pack

    nb, nt, iters = 132 * 2, 256, 1000
    out = cuda.device_array((nb, nt, 8), np.int64)
    args = (out, np.int32(iters))
    sig = tuple(typeof.typeof(a, typeof.Purpose.argument) for a in args)
    k = probe.compile(sig)
    fn = k._codelibrary.get_cufunc()
    params, cvals = _pack(k, args)
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = nb, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = nt, 1, 1
    cfg.sharedMemBytes = 0
    cfg.hStream = 0
    attr = drv.CUlaunchAttribute()
    attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = 2, 1, 1
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    handle = fn.handle
    try:
        err = drv.cuLaunchKernelEx(cfg, handle, ctypes.addressof(params), 0)
    except TypeError as e:
        print("handle type", type(handle), e)
        handle = drv.CUfunction(int(handle))
        err = drv.cuLaunchKernelEx(cfg, handle, ctypes.addressof(params), 0)
    print("launch", err)
    cuda.synchronize()
    o = out.copy_to_host()
    ok = all(o[b, t, 0] == (t % 64 + 1) % 64 + 1000 * (o[b, t, 1] ^ 1)
             for b in range(nb) for t in range(nt))
    print("DSMEM values right:", ok, "ranks", sorted(set(o[:, 0, 1].tolist())))
    if not ok:
        sys.exit(1)
    for c, name in [(2, "cluster_sync"), (3, "syncthreads"), (4, "arrive.release+wait.acquire"),
                    (5, "ld.shared::cluster chain"), (6, "ld.shared chain")]:
        v = o[:, :, c] / iters
        print(f"{name:30s} cycles/iter median {np.median(v):8.1f}  max {v.max():8.1f}")
