import os, sys, time
import numpy as np, ml_dtypes, torch
import numba_mla as nm
from numba_mla import checks, launch
sys.path.insert(0, "scripts")
from bench_simt import make, SCALE, PAGE

def timeit(fn, iters=20, flush=True):
    buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        if flush:
            buf.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return float(np.median(ts))

rng = np.random.default_rng(0)
shapes = [(64, 16, 4096), (128, 16, 8192), (64, 128, 4096), (128, 128, 1024), (16, 128, 32768), (1, 128, 65536)]
for (B, H, L) in shapes:
    q, pages, bt = make(B, H, L, rng)
    tq = torch.as_tensor(q.view(np.int16)).cuda().view(torch.bfloat16)
    tp = torch.as_tensor(pages.view(np.int16)).cuda().view(torch.bfloat16)
    cache = nm.PagedKVCache(tp, torch.as_tensor(bt).cuda(), torch.full((B,), L, dtype=torch.int32).cuda())
    for be in sys.argv[1:]:
        call = checks.check_decode(tq, cache, SCALE, None, None, None, True, None, be)
        plan = launch.Plan(call)
        us = timeit(plan.launch)
        part = timeit(plan.launches[0])
        comb = timeit(plan.launches[1]) if len(plan.launches) > 1 else 0.0
        warm = timeit(plan.launch, flush=False)
        fl = 2 * B * H * L * 1088
        by = B * L * 576 * 2
        print(f"{be} {B}x{H}x{L} P={plan.num_partitions} {us:.1f} us (partition {part:.1f}, combine {comb:.1f}, no flush {warm:.1f})  {fl/us/1e6:.0f} TFLOP/s  {by/us/1e3:.0f} GB/s", flush=True)
