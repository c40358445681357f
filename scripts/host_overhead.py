"""The Python cost of one prepared decode call (``numba_mla.prepare``) on torch tensors, beside
the GPU time: enqueue time per call (perf_counter around the call, no synchronize, the launch
queue kept short) and the wall time of call + synchronize minus the GPU time (CUDA events).
Usage: python scripts/host_overhead.py"""
import time

import ml_dtypes
import numpy as np
import torch

import numba_mla as nm

SHAPES = [(64, 16, 4096, "mma"), (64, 128, 4096, "mma"), (1, 128, 65536, "mma"), (64, 16, 4096, "simt")]
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
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    enqueue, wall, gpu = [], [], []
    for _ in range(50):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        t1 = time.perf_counter()
        step()
        t2 = time.perf_counter()
        e.record()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        enqueue.append((t2 - t1) * 1e6)
        wall.append((t3 - t0) * 1e6)
        gpu.append(s.elapsed_time(e) * 1e3)
    med = lambda x: float(np.median(x))  # noqa: E731
    print(f"{backend} {B}x{H}x{L} P={step.plan.num_partitions} launches={len(step.plan.launches)}: "
          f"enqueue {med(enqueue):.1f} us/call, GPU {med(gpu):.1f} us, call+sync wall "
          f"{med(wall):.1f} us (beyond GPU {med(wall) - med(gpu):.1f} us)", flush=True)
