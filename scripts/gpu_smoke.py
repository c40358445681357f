"""GPU smoke run: compile, check a few configurations against the reference, time the FMA kernel,
report its resources. Usage: python scripts/gpu_smoke.py"""
import os
import time

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

import ml_dtypes
import numpy as np

import numba_mla as nm
from numba import cuda
from numba_mla import factory, heuristics, launch
from numba_mla.kernels import simt

rng = np.random.default_rng(0)
BF16 = np.dtype(ml_dtypes.bfloat16)


def problem(B, H, L, Sq=1, dtype=BF16, page=64, lengths=None):
    lengths = np.full(B, L, np.int32) if lengths is None else np.asarray(lengths, np.int32)
    maxp = -(-int(lengths.max()) // page)
    pages = (rng.standard_normal((B * maxp, page, 576))).astype(dtype)
    bt = rng.permutation(B * maxp).astype(np.int32).reshape(B, maxp)
    q = rng.standard_normal((B, Sq, H, 576)).astype(dtype)
    return q, nm.PagedKVCache(pages, bt, lengths)


def check(B, H, L, Sq, dtype, mask=None, P=None):
    q, c = problem(B, H, L, Sq, dtype, lengths=rng.integers(Sq, L + 1, B))
    o, l = nm.mla_decode(q, c, 0.1352, mask=mask, return_lse=True, num_partitions=P)
    r, rl = nm.reference.mla_decode(q, c, 0.1352, mask=mask, return_lse=True)
    err = np.abs(o.astype(np.float64) - r).max() / np.abs(r).max()
    print(f"check B={B} H={H} L={L} Sq={Sq} {np.dtype(dtype).name} {mask} P={P}: "
          f"rel err {err:.2e}, lse err {np.abs(l - rl)[np.isfinite(rl)].max():.2e}", flush=True)
    return err


def bench(B, H, L, dtype=BF16, iters=20):
    import torch

    q, c = problem(B, H, L, 1, dtype)
    tq = torch.as_tensor(q.view(np.int16)).cuda().view(torch.bfloat16)
    tp = torch.as_tensor(c.pages.view(np.int16)).cuda().view(torch.bfloat16)
    tbt = torch.as_tensor(c.block_table_host).cuda()
    tl = torch.as_tensor(c.lengths_host).cuda()
    cache = nm.PagedKVCache(tp, tbt, tl)
    from numba_mla import checks, launch

    plan = launch.Plan(checks.check_decode(tq, cache, 0.1352))
    for _ in range(3):
        plan.launch()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        plan.launch()
    e.record()
    torch.cuda.synchronize()
    us = s.elapsed_time(e) * 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        nm.mla_decode(tq, cache, 0.1352)
    torch.cuda.synchronize()
    call_us = (time.perf_counter() - t0) * 1e6 / iters
    flops = 2 * B * H * L * (576 + 512)
    gb = (B * L * 576 * 2) / us / 1e3
    print(f"bench B={B} H={H} L={L} P={plan.num_partitions} BM={plan.block_m}: {us:.0f} us GPU "
          f"({flops / us / 1e6:.1f} TFLOP/s, {gb:.0f} GB/s); {call_us:.0f} us per mla_decode call", flush=True)


if __name__ == "__main__":
    t0 = time.time()
    check(2, 16, 300, 1, BF16)
    dev = cuda.get_current_device()
    for (mask, tag, bm, H) in [(nm.NullMask(), "bf16", 16, 16), (nm.CausalMask(), "bf16", 32, 128)]:
        kern = factory.partition_kernel(mask, nm.IdentityScoreMod(), tag, nm.PagedKVCache, bm, H)
        for sig, k in kern.overloads.items():
            print(f"{tag} BLOCK_M={bm}: regs/thread", k.regs_per_thread, "local bytes", k.local_mem_per_thread,
                  "dynamic smem", simt.smem_bytes(bm, True))
    for args in [(3, 128, 1000, 2, BF16, nm.CausalMask()), (4, 16, 777, 1, np.float16, nm.SlidingWindowCausalMask(100)),
                 (2, 1, 65, 1, np.float32, None), (5, 16, 4096, 1, BF16, None)]:
        check(*args)
    check(1, 16, 5000, 1, BF16, None, P=200)
    print(f"checks done in {time.time() - t0:.0f}s", flush=True)
    bench(64, 16, 4096)
    bench(64, 128, 4096)
    bench(128, 128, 1024)
    bench(1, 128, 65536)
    heuristics.simt_block_m = lambda rows, packed: 16
    print("forcing BLOCK_M=16")
    bench(64, 128, 4096)
    bench(128, 128, 1024)
