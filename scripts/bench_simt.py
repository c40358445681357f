"""Benchmark the FMA (simt) kernel on a GPU, beside torch's bmm on a contiguous cache in the
same run, and record its resources. Writes JSON rows (device, date, commit, versions).

Usage: python scripts/bench_simt.py [--out plots/simt_h200.json] [--commit SHA]

Timing (PERFORMANCE.md): inputs prepared once (a Plan), warm-up, then CUDA events around each
launch pair, median of 30, the L2 flushed before each timed launch by writing a 256 MB buffer;
fresh random data; the error of each configuration is checked against the float64 reference
on a small batch of the same shape. bf16, page size 64, scale 0.1352, shuffled block table.
"""
import argparse
import datetime
import json
import os
import subprocess
import time

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import numba_mla as nm  # noqa: E402
from numba_mla import checks, launch  # noqa: E402
from numba_mla.kernels import simt  # noqa: E402

SHAPES = [(64, 16, 4096), (128, 16, 8192), (64, 128, 4096), (128, 128, 1024), (16, 128, 32768),
          (1, 128, 65536)]
SCALE = 0.1352
PAGE = 64


def torch_bf16(a):
    return torch.as_tensor(a.view(np.int16)).cuda().view(torch.bfloat16)


def make(B, H, L, rng):
    npages = B * (-(-L // PAGE))
    pages = rng.standard_normal((npages, PAGE, 576), np.float32).astype(ml_dtypes.bfloat16)
    bt = rng.permutation(npages).astype(np.int32).reshape(B, -1)
    q = rng.standard_normal((B, 1, H, 576), np.float32).astype(ml_dtypes.bfloat16)
    return q, pages, bt


def time_gpu(fn, iters=30):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return float(np.median(times)), float(np.percentile(times, 10)), float(np.percentile(times, 90))


def reference_first(q, pages, bt, L):
    """Float64 reference for the first sequence (the error of every row is measured on it)."""
    return nm.reference.mla_decode(q[:1], nm.PagedKVCache(pages, bt[:1], np.array([L], np.int32)),
                                   SCALE)[0, 0]


def rel_err(got, want):
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def row(provider, backend, B, H, L, t, err, **extra):
    us, p10, p90 = t
    flops = 2 * B * H * L * (576 + 512)
    nbytes = B * L * 576 * 2 + B * H * 576 * 2 + B * H * 512 * 2
    return dict(provider=provider, backend=backend, batch=B, heads=H, seqlen=L, sq=1,
                dtype="bfloat16", page_size=PAGE if provider == "numba_mla" else None, us=us,
                us_p10=p10, us_p90=p90, gbps=nbytes / us / 1e3, tflops=flops / us / 1e6,
                rel_err=err, **extra)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    dev = torch.cuda.get_device_name()
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
    rows = []
    for B, H, L in SHAPES:
        q, pages, bt = make(B, H, L, rng)
        tq, tp, tbt = torch_bf16(q), torch_bf16(pages), torch.as_tensor(bt).cuda()
        cache = nm.PagedKVCache(tp, tbt, torch.full((B,), L, dtype=torch.int32, device="cuda"))
        plan = launch.Plan(checks.check_decode(tq, cache, SCALE))
        t = time_gpu(plan.launch)
        kern = plan.launches[0].kernel
        t0 = time.perf_counter()
        for _ in range(20):
            nm.mla_decode(tq, cache, SCALE)
        torch.cuda.synchronize()
        host_us = (time.perf_counter() - t0) * 1e6 / 20
        want = reference_first(q, pages, bt, L)
        got = plan.result()[0, 0].float().cpu().numpy()
        rows.append(row("numba_mla", "simt", B, H, L, t, rel_err(got, want),
                        num_partitions=plan.num_partitions, block_m=plan.block_m,
                        registers=kern.regs_per_thread, local_bytes=kern.local_mem_per_thread,
                        smem_bytes=simt.smem_bytes(plan.block_m, True), call_us=host_us,
                        device=dev))
        # torch: one bmm per product on a contiguous cache (the gather from pages left out)
        kv = tp[tbt.flatten().long()].reshape(B, -1, 576)[:, :L]
        qq = tq[:, 0]  # [B, H, 576]

        def torch_decode():
            s = torch.bmm(qq, kv.transpose(1, 2)).float() * SCALE
            return torch.bmm(torch.softmax(s, -1).to(kv.dtype), kv[..., :512])

        t = time_gpu(torch_decode)
        rows.append(row("torch_bmm", None, B, H, L, t,
                        rel_err(torch_decode()[0].float().cpu().numpy(), want), device=dev))
        a, b = rows[-2], rows[-1]
        print(f"B={B:4d} H={H:4d} L={L:6d}  simt {a['us']:8.0f} us {a['tflops']:6.1f} TFLOP/s "
              f"{a['gbps']:6.0f} GB/s (P={a['num_partitions']}, BM={a['block_m']}, "
              f"{a['registers']} regs, call {a['call_us']:.0f} us) | torch bmm {b['us']:7.0f} us "
              f"{b['tflops']:6.1f} TFLOP/s | simt/torch time x{a['us'] / b['us']:.2f}", flush=True)
    meta = dict(device=dev, date=datetime.date.today().isoformat(), commit=commit,
                numba_mla=nm.__version__, torch=torch.__version__, numpy=np.__version__,
                numba=__import__("numba").__version__,
                numba_cuda=__import__("importlib.metadata").metadata.version("numba-cuda"),
                timing="CUDA events, median of 30 after 3 warm-ups, L2 flushed (256 MB) before each")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
