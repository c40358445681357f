"""The Python cost of one prepared decode call (``numba_mla.prepare``) on torch tensors, beside
the GPU time: enqueue time per call (perf_counter around the call, no synchronize, the launch
queue kept short) and the wall time of call + synchronize minus the GPU time (CUDA events).
A prepared call is one raw cuLaunchKernel per kernel over parameters packed once; for
comparison the same kernels are also enqueued through Numba's ``kernel.launch`` (which packs
every argument again on every call).
The CUDA context spins while synchronizing (CU_CTX_SCHED_SPIN, set before the context
exists): with the default, a thread that waited long on a kernel yields the processor and
its wake-up (the operating system's, 5-15 us) would count as the call's.
Usage: python scripts/host_overhead.py"""
import time

from cuda.bindings import driver

driver.cuInit(0)
driver.cuDevicePrimaryCtxSetFlags(driver.cuDeviceGet(0)[1], driver.CUctx_flags.CU_CTX_SCHED_SPIN)

import ml_dtypes
import numpy as np
import torch

import numba_mla as nm
from numba_mla import launch

SHAPES = [(64, 16, 4096, "mma"), (64, 128, 4096, "mma"), (1, 128, 65536, "mma"),
          (4, 16, 1024, "mma"), (64, 16, 4096, "simt"), (4, 16, 1024, "simt")]
med = lambda x: float(np.median(x))  # noqa: E731


def measure(call, n=50):
    """Median enqueue time, GPU time and call+sync wall time of ``call``, in microseconds."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    enqueue, wall, gpu = [], [], []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        t1 = time.perf_counter()
        call()
        t2 = time.perf_counter()
        e.record()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        enqueue.append((t2 - t1) * 1e6)
        wall.append((t3 - t0) * 1e6)
        gpu.append(s.elapsed_time(e) * 1e3)
    return med(enqueue), med(gpu), med(wall)


rng = np.random.default_rng(0)
for B, H, L, backend in SHAPES:
    page = 64
    npages = B * (-(-L // page))
    as_t = lambda a: torch.as_tensor(a.view(np.int16)).cuda().view(torch.bfloat16)  # noqa: E731
    pages = as_t(rng.standard_normal((npages, page, 576), np.float32).astype(ml_dtypes.bfloat16))
    q = as_t(rng.standard_normal((B, 1, H, 576), np.float32).astype(ml_dtypes.bfloat16))
    bt = torch.as_tensor(rng.permutation(npages).astype(np.int32).reshape(B, -1)).cuda()
    cache = nm.PagedKVCache(pages, bt, torch.full((B,), L, dtype=torch.int32).cuda())
    step = nm.prepare(q, cache, 0.1352, backend=backend)
    thin = all(x._params is not None for x in step.plan.launches)

    def numba_launch():
        stream = launch._core_stream(launch.current_stream(q))
        for x in step.plan.launches:
            x.kernel.launch(x.args, x.grid, x.block, stream, x.smem)

    enqueue, gpu, wall = measure(step)
    old = measure(numba_launch)[0]
    print(f"{backend} {B}x{H}x{L} P={step.plan.num_partitions} launches={len(step.plan.launches)}"
          f"{'' if thin else ' (NOT the thin path)'}: enqueue {enqueue:.1f} us/call "
          f"(Numba's kernel.launch: {old:.1f}), GPU {gpu:.1f} us, call+sync wall {wall:.1f} us "
          f"(beyond GPU {wall - gpu:.1f} us)", flush=True)
