"""The Python cost of one prepared decode call (``numba_mla.prepare``) on torch tensors, beside
the GPU time, for a paged and a contiguous cache:
- enqueue: perf_counter around the call alone (no synchronize; the queue kept short);
- beyond GPU: the wall time of one call + ``torch.cuda.synchronize()`` (perf_counter only, no
  event recorded inside the window), less the kernels' GPU time, which is measured apart:
  CUDA events around ``N`` calls enqueued back to back (the GPU never waits for the host
  there, since each call enqueues faster than its kernels run), divided by ``N``.
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

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import numba_mla as nm  # noqa: E402
from numba_mla import launch  # noqa: E402

SHAPES = [(64, 16, 4096, "mma"), (64, 128, 4096, "mma"), (1, 128, 65536, "mma"),
          (4, 16, 1024, "mma"), (64, 16, 4096, "simt"), (4, 16, 1024, "simt")]
N = 50
med = lambda x: float(np.median(x))  # noqa: E731


def measure(call):
    """Median enqueue time, GPU time per call and one call + synchronize wall time, in us."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for _ in range(5):
        s.record()
        for _ in range(N):
            call()
        e.record()
        torch.cuda.synchronize()
        gpu.append(s.elapsed_time(e) * 1e3 / N)
    enqueue, wall = [], []
    for _ in range(N):
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        enqueue.append((t1 - t0) * 1e6)
    for _ in range(N):
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e6)
    return med(enqueue), med(gpu), med(wall)


def problem(B, H, L, kind, rng):
    as_t = lambda a: torch.as_tensor(a.view(np.int16)).cuda().view(torch.bfloat16)  # noqa: E731
    q = as_t(rng.standard_normal((B, 1, H, 576), np.float32).astype(ml_dtypes.bfloat16))
    lengths = torch.full((B,), L, dtype=torch.int32).cuda()
    if kind == "contiguous":
        kv = as_t(rng.standard_normal((B, L, 576), np.float32).astype(ml_dtypes.bfloat16))
        return q, nm.ContiguousKVCache(kv, lengths)
    page = 64
    npages = B * (-(-L // page))
    pages = as_t(rng.standard_normal((npages, page, 576), np.float32).astype(ml_dtypes.bfloat16))
    bt = torch.as_tensor(rng.permutation(npages).astype(np.int32).reshape(B, -1)).cuda()
    return q, nm.PagedKVCache(pages, bt, lengths)


rng = np.random.default_rng(0)
for kind in ("paged", "contiguous"):
    for B, H, L, backend in SHAPES:
        q, cache = problem(B, H, L, kind, rng)
        step = nm.prepare(q, cache, 0.1352, backend=backend)
        thin = all(x._params is not None for x in step.plan.launches)

        def numba_launch():
            stream = launch._core_stream(launch.current_stream(q))
            for x in step.plan.launches:
                x.kernel.launch(x.args, x.grid, x.block, stream, x.smem)

        enqueue, gpu, wall = measure(step)
        old = measure(numba_launch)[0]
        print(f"{backend} {kind} {B}x{H}x{L} P={step.plan.num_partitions} "
              f"launches={len(step.plan.launches)}{'' if thin else ' (NOT the thin path)'}: "
              f"enqueue {enqueue:.1f} us (Numba's kernel.launch: {old:.1f}), GPU {gpu:.1f} us, "
              f"call+sync {wall:.1f} us: beyond GPU {wall - gpu:.1f} us", flush=True)
