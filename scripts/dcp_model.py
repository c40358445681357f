"""Decode context parallel on one GPU: the per-rank work for N = 2, 4, 8 ranks, timed against
the unsharded decode, and a MODEL of N GPUs built from it.

For each problem (batch B, global length L, Sq query tokens, H heads, bf16, paged cache):

- ``whole_us``: the unsharded decode (``launch.Plan`` of ``mla_decode``, return_lse);
- per N, ``rank_us``: the decode of the largest shard (rank 0 of the interleaved layout holds
  ceil(L / N) keys), with the split-K factor the heuristic picks for a cache of that many keys
  (``num_partitions``; the default call sizes it by the global length), and ``merge_us``: the
  combine kernel over N partial results of every row ([T, H, N, 512] fp32 -> [T, H, 512]);
- per N, the modelled communication: the all-gather of the partial outputs (q's dtype) and
  LSEs (fp32) to every rank (``out_heads="all"``: each rank receives (N - 1) x its bytes), or
  the all-to-all of the reduce-scatter form (``out_heads="local"``: (N - 1) / N of them), plus
  with ``--local-q`` the all-gather of q's heads. Each collective costs
  ``latency + bytes received / bus bandwidth``: ``--latency-us`` and ``--busbw-gbs`` are the
  model's parameters, NOT measurements; their defaults (15 us, 360 GB/s) are round values of
  the order nccl-tests reports for 8-GPU NVLink/NVSwitch hosts at megabyte sizes: replace them
  with ``all_gather_perf`` / ``alltoall_perf`` numbers of the machine in question.
- ``model_us = rank_us + merge_us + communication``; ``speedup = whole_us / model_us``. Not
  modelled: the reshuffle of the gathered results before the merge (a torch copy and cast),
  overlap of communication with other work, and what N GPUs' combined L2 changes.

GPU times: ``numba_mla.bench.time_gpu`` (CUDA events, warm-up, L2 flushed before each run,
median). On the CUDA simulator the script runs (use ``--tiny``) but the times mean nothing.

Usage: python scripts/dcp_model.py [--shapes 1x131072,1x1048576,8x65536] [--heads 128] [--sq 1]
       [--worlds 2,4,8] [--iters 20] [--latency-us 15] [--busbw-gbs 360] [--local-q]
       [--out plots/dcp_model_h200.json] [--tiny]
"""
import argparse
import datetime
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

D_QK, D_V = 576, 512


def make_arrays(dev, rng):
    """``randn(shape)`` (bf16) and ``ints(x)`` (int32) on the GPU as torch tensors when torch
    sees one (the large caches are drawn there), else NumPy host arrays (the simulator)."""
    from numba_mla.testing import BF16

    if dev.torch is not None:
        torch = dev.torch
        g = torch.Generator(device="cuda")
        g.manual_seed(0)
        return (lambda shape: torch.randn(shape, dtype=torch.bfloat16, device="cuda", generator=g),
                lambda x: torch.as_tensor(np.asarray(x, np.int32), device="cuda"))
    return (lambda shape: rng.standard_normal(shape, dtype=np.float32).astype(BF16),
            lambda x: np.asarray(x, np.int32))


def paged_cache(nm, randn, ints, batch, length, page_size):
    """A paged cache of ``batch`` sequences of ``length`` keys (pages in order)."""
    per_seq = max(1, math.ceil(length / page_size))
    pages = randn((per_seq * batch, page_size, D_QK))
    table = np.arange(per_seq * batch, dtype=np.int32).reshape(batch, per_seq)
    return nm.PagedKVCache(pages, ints(table), ints(np.full(batch, length)))


def plan_for(nm, q, cache, scale, mask, num_partitions=None):
    from numba_mla import checks, launch

    call = checks.check_decode(q, cache, scale, mask, None, num_partitions, True, None, "auto")
    return launch.Plan(call)


def comm_us(n, out_bytes, lse_bytes, q_bytes, local_out, local_q, latency_us, busbw):
    """The modelled communication of one decode step on n ranks (microseconds)."""
    if n == 1:
        return 0.0
    if local_out:  # all-to-all: each rank receives (n-1)/n of every rank's result
        t = 2 * latency_us + (n - 1) / n * (out_bytes + lse_bytes) / busbw * 1e6
    else:  # all-gather: each rank receives the n-1 other ranks' results
        t = 2 * latency_us + (n - 1) * (out_bytes + lse_bytes) / busbw * 1e6
    if local_q:  # all-gather of q: each rank holds 1/n of the heads
        t += latency_us + (n - 1) / n * q_bytes / busbw * 1e6
    return t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x131072,1x1048576,8x65536",
                    help="BxL problems, comma separated")
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--sq", type=int, default=1)
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--mask", default="causal", choices=("none", "causal"))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--latency-us", type=float, default=15.0,
                    help="model: fixed cost of one collective")
    ap.add_argument("--busbw-gbs", type=float, default=360.0,
                    help="model: NCCL bus bandwidth, GB/s")
    ap.add_argument("--local-out", action="store_true",
                    help="model the reduce-scatter form (out_heads='local')")
    ap.add_argument("--local-q", action="store_true",
                    help="model q's all-gather (q_heads='local')")
    ap.add_argument("--out", default=None, help="JSON file for the rows")
    ap.add_argument("--commit", default=None, help="commit to record (default: git's)")
    ap.add_argument("--tiny", action="store_true", help="a tiny sweep (the simulator)")
    args = ap.parse_args(argv)

    import numba_mla as nm
    from numba import cuda
    from numba_mla import factory, heuristics
    from numba_mla.bench import report
    from numba_mla.bench.timing import Device, time_gpu
    from numba_mla.kernels import combine
    from numba_mla.positions import PositionMap
    from numba_mla.sharding import shard_cache
    from numba_mla.testing import DEEPSEEK_SCALE

    if args.tiny:
        args.shapes, args.heads, args.worlds, args.iters, args.warmup = "1x40", 2, "2", 1, 0
        args.page_size = 16
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    worlds = [int(n) for n in args.worlds.split(",")]
    dev = Device()
    flush = 0 if dev.simulator else 256 << 20
    randn, ints = make_arrays(dev, np.random.default_rng(0))
    mask = nm.CausalMask() if args.mask == "causal" else nm.NullMask()
    busbw = args.busbw_gbs * 1e9
    rows = []
    print(f"{'B':>3} {'L':>8} {'N':>2} {'whole_us':>9} {'rank_us':>8} {'merge_us':>8} "
          f"{'comm_us*':>8} {'model_us*':>9} {'speedup*':>8}   (* = model)")
    for B, L in shapes:
        H, Sq = args.heads, args.sq
        q = randn((B, Sq, H, D_QK))
        whole = paged_cache(nm, randn, ints, B, L, args.page_size)
        plan = plan_for(nm, q, whole, DEEPSEEK_SCALE, mask)
        whole_us = time_gpu(dev, plan.launch, args.iters, args.warmup, flush)[0]
        T = B * Sq
        out_bytes, lse_bytes, q_bytes = T * H * D_V * 2, T * H * 4, T * H * D_QK * 2
        for n in worlds:
            pm = PositionMap.interleaved(0, n)
            n_loc = pm.local_count(L)
            local = paged_cache(nm, randn, ints, B, n_loc, args.page_size)
            # The split-K factor for the shard's own keys (the default would size it by L)
            parts = plan_for(nm, q, local, DEEPSEEK_SCALE, mask).num_partitions
            shard = shard_cache(local, ints(np.full(B, L)), pm)
            splan = plan_for(nm, q, shard, DEEPSEEK_SCALE, mask, parts)
            rank_us = time_gpu(dev, splan.launch, args.iters, args.warmup, flush)[0]
            part_out = cuda.device_array((T, H, n, D_V), np.float32)
            part_lse = cuda.to_device(np.zeros((T, H, n), np.float32))
            out = cuda.device_array((T, H, D_V), np.int16)
            lse = cuda.device_array((T, H), np.float32)
            few, groups = combine.variant(T * H, n, heuristics.sm_count())
            kern = factory.combine_kernel("bf16", few=few)

            def merge():
                kern[(T, H), (combine.NTHREADS, groups)](part_out, part_lse, out, lse)

            merge_us = time_gpu(dev, merge, args.iters, args.warmup, flush)[0]
            c_us = comm_us(n, out_bytes, lse_bytes, q_bytes, args.local_out, args.local_q,
                           args.latency_us, busbw)
            model_us = rank_us + merge_us + c_us
            row = dict(batch=B, length=L, sq=Sq, heads=H, world=n, local_keys=int(n_loc),
                       num_partitions=int(parts), whole_us=whole_us, rank_us=rank_us,
                       merge_us=merge_us, comm_us_model=c_us, model_us=model_us,
                       speedup_model=whole_us / model_us,
                       compute_speedup=whole_us / (rank_us + merge_us))
            rows.append(row)
            print(f"{B:>3} {L:>8} {n:>2} {whole_us:>9.1f} {rank_us:>8.1f} {merge_us:>8.1f} "
                  f"{c_us:>8.1f} {model_us:>9.1f} {row['speedup_model']:>8.2f}")
    meta = dict(device=dev.name,
                date=datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
                commit=args.commit or report.git_commit(), mask=args.mask,
                page_size=args.page_size,
                model=dict(latency_us=args.latency_us, busbw_gbs=args.busbw_gbs,
                           out_heads="local" if args.local_out else "all",
                           q_heads="local" if args.local_q else "all",
                           note="communication is a model, not a measurement"))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        print(f"wrote {args.out}")
    return rows


if __name__ == "__main__":
    main()
