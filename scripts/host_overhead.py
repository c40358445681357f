"""What one Python call costs on the host, path by path, on a tiny decode (1 x 16 x 64 by
default: the GPU work is a few microseconds, so the host's share is what shows).

Paths, all on the same inputs (torch bf16 tensors on a GPU; Numba device arrays without torch):
- ``mla_decode``: the plain call, the same cache object every call;
- ``mla_decode_lengths_in_place``: the step whose lengths changed, the cache's device lengths
  tensor updated in place before each call (a device-to-device copy of the next lengths, then
  the plain call on the same cache object: what the README calls the fastest idiom; on a GPU
  only: the simulator's lengths are host arrays, which a cache copies);
- ``mla_decode_new_lengths``: the step whose lengths changed, host lengths given each call:
  ``cache.with_lengths(host_lengths)`` (the block table is not copied back or checked again);
- ``mla_decode_new_cache``: a new ``PagedKVCache`` over the same pages and block table every
  call, its lengths a device array (construction copies lengths and block table to the host
  to check them: what a decode loop that rebuilds its cache object pays);
- ``mla_decode_ragged_device_offsets``: ``mla_decode_ragged`` with q as a ragged [B, H, 576]
  (one row a sequence) and its B + 1 row offsets an int32 device array: the offsets are not
  read on the host (GPU only: on the simulator q is a host array, and host offsets are read);
- ``prepare``: ``numba_mla.prepare`` once, then ``step()`` each call;
- ``flash_mla`` (when importable; metadata made once) and ``torch`` (softmax(q K^T) V with two
  ``bmm`` on a contiguous cache), when torch sees a GPU.

Each path: ``warmup`` untimed calls, then ``calls`` calls timed as "call + synchronize"
(``call_sync_us``) and ``calls`` timed as "enqueue only" (``enqueue_us``: the call alone, the
synchronize after the clock stops); medians (``numba_mla.bench.host_costs``). ``gpu_us`` is
the GPU time of one call (``numba_mla.bench.time_gpu``, no L2 flush: the inputs are tiny).
On a GPU the context spins while it synchronizes (CU_CTX_SCHED_SPIN, set before the context
exists): otherwise a thread that waited yields the processor and the operating system's
wake-up (5-15 us) would count as the call's.

Writes JSON (meta: device, date, commit, versions, shape, counts; one row per path) and prints
a table. On the CUDA simulator it runs the same code (use tiny counts); the times mean nothing.

Usage: python scripts/host_overhead.py [--out plots/host_overhead_h200.json] [--calls 200]
                                       [--warmup 20] [--shape 1x16x64] [--page-size 64]
"""
import argparse
import os
import sys

PATHS = ("mla_decode", "mla_decode_lengths_in_place", "mla_decode_new_lengths",
         "mla_decode_new_cache", "mla_decode_ragged_device_offsets", "prepare", "flash_mla",
         "torch")


def _spin_while_synchronizing():
    """CU_CTX_SCHED_SPIN on device 0's primary context; must run before the context exists."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return False
    driver.cuInit(0)
    dev = driver.cuDeviceGet(0)[1]
    driver.cuDevicePrimaryCtxSetFlags(dev, driver.CUctx_flags.CU_CTX_SCHED_SPIN)
    return True


def _on_device(p, dev):
    """(q, pages, block_table, lengths) on the device: torch's tensors as they are; on a GPU
    without torch, NumPy arrays copied into Numba device arrays (``prepare`` takes device
    arrays only); on the simulator, the NumPy arrays (its device arrays are no CUDA memory)."""
    arrays = (p.q, p.pages, p.block_table, p.lengths)
    if dev.torch is not None or dev.simulator:
        return arrays
    return tuple(dev.cuda.to_device(a) for a in arrays)


def calls_by_path(p, dev, backend="auto"):
    """{path: zero-argument call} for every path that can run here, and {path: why not};
    numba_mla's calls run ``backend``."""
    import numpy as np

    import numba_mla as nm
    from numba_mla import bench

    q, pages, block_table, lengths = _on_device(p, dev)
    cache = nm.PagedKVCache(pages, block_table, lengths)
    # Two length vectors, alternated: each call's cache has lengths the previous one had not.
    shorter = np.maximum(p.lengths_host - 1, 1).astype(np.int32)
    if dev.torch is not None:
        other = dev.torch.as_tensor(shorter, device="cuda")
    else:
        other = shorter if dev.simulator else dev.cuda.to_device(shorter)
    both, turn = (lengths, other), [0]

    hosts = (p.lengths_host, shorter)

    def new_lengths():  # the fast idiom: the same cache with new (host) lengths
        turn[0] ^= 1
        return nm.mla_decode(q, cache.with_lengths(hosts[turn[0]]), p.scale, backend=backend)

    def new_cache():  # a new cache object over the same arrays (checks copy device data)
        turn[0] ^= 1
        return nm.mla_decode(q, nm.PagedKVCache(pages, block_table, both[turn[0]]), p.scale,
                             backend=backend)

    calls = {"mla_decode": lambda: nm.mla_decode(q, cache, p.scale, backend=backend),
             "mla_decode_new_lengths": new_lengths, "mla_decode_new_cache": new_cache}
    missing = {}
    if dev.simulator:
        missing["mla_decode_lengths_in_place"] = "needs device lengths (not the simulator's)"
    else:  # a cache of its own over a copy of the lengths, which each call overwrites
        if dev.torch is not None:
            own = lengths.clone()
        else:
            own = dev.cuda.device_array_like(lengths)
            own.copy_to_device(lengths)
        in_place = nm.PagedKVCache(pages, block_table, own)

        def lengths_in_place():
            turn[0] ^= 1
            src = both[turn[0]]
            if dev.torch is not None:
                own.copy_(src)
            else:
                own.copy_to_device(src)
            return nm.mla_decode(q, in_place, p.scale, backend=backend)

        calls["mla_decode_lengths_in_place"] = lengths_in_place
    if dev.simulator:
        missing["mla_decode_ragged_device_offsets"] = "q is a host array on the simulator"
    else:  # q's B rows as a ragged batch of one row a sequence, offsets 0..B on the device
        B = int(p.lengths_host.shape[0])
        rows = q.reshape(B, q.shape[2], q.shape[3])
        starts = np.arange(B + 1, dtype=np.int32)
        offsets = (dev.torch.as_tensor(starts, device="cuda") if dev.torch is not None
                   else dev.cuda.to_device(starts))
        calls["mla_decode_ragged_device_offsets"] = (
            lambda: nm.mla_decode_ragged(rows, offsets, cache, p.scale, backend=backend))
    try:
        calls["prepare"] = nm.prepare(q, cache, p.scale, backend=backend)
    except TypeError as e:  # host arrays (the simulator)
        missing["prepare"] = str(e)
    peers = {"flash_mla": (bench.providers.flash_mla, bench.providers._needs("flash_mla")),
             "torch": (bench.providers.torch_bmm, bench.providers._needs_torch)}
    for name, (prepare, unavailable) in peers.items():
        why = unavailable(dev)
        if why is None:
            try:
                calls[name] = prepare(p).host_call
            except bench.Skip as e:
                why = str(e)
        if why is not None:
            missing[name] = why
    return calls, missing


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None,
                    help="JSON output (default: plots/host_overhead_<device>.json)")
    ap.add_argument("--calls", type=int, default=200, help="timed calls per path and measure")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls first")
    ap.add_argument("--shape", default="1x16x64", help="B x H x L (default 1x16x64)")
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--commit", default=None, help="commit to record (default: git's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="auto",
                    help="numba_mla's backend (default auto; the tests take the quick 'simple' "
                         "in the simulator: the paths' host costs are what is measured)")
    args = ap.parse_args(argv)

    from numba_mla import _compat

    spin = not _compat.SIMULATOR and _spin_while_synchronizing()
    import numpy as np

    from numba_mla import bench

    B, H, L = (int(x) for x in args.shape.lower().split("x"))
    dev = bench.Device()
    cfg = bench.Config(B, H, L, page_size=args.page_size, sweep="host_overhead")
    settings = bench.Settings.simulator() if dev.simulator else bench.Settings.gpu()
    p = bench.make_problem(cfg, dev, np.random.default_rng(args.seed), settings, args.seed)
    calls, missing = calls_by_path(p, dev, args.backend)

    rows = []
    for path in PATHS:
        if path not in calls:
            continue
        call = calls[path]
        call_sync_us, enqueue_us = bench.host_costs(dev, call, args.calls, args.warmup)
        gpu_us = bench.time_gpu(dev, call, max(1, args.calls // 10), 0, 0)[0]
        rows.append(dict(path=path, call_sync_us=call_sync_us, enqueue_us=enqueue_us,
                         gpu_us=gpu_us))
    meta = bench.stamp(dev, args.commit)
    meta.update(
        shape=dict(batch=B, heads=H, seqlen=L, sq=1, page_size=args.page_size,
                   dtype="bfloat16"),
        calls=args.calls, warmup=args.warmup, context_spins=bool(spin), backend=args.backend,
        inputs=("torch tensors" if dev.torch is not None else
                "NumPy arrays (simulator)" if dev.simulator else "Numba device arrays"),
        timing=("call_sync_us: median wall time of one call + synchronize; enqueue_us: median "
                "wall time of the call alone (synchronized after the clock stops); gpu_us: "
                "events around one call, median, no L2 flush"),
        skipped=[dict(path=k, reason=v) for k, v in missing.items()])
    out = args.out or os.path.join("plots", f"host_overhead_{bench.device_slug(dev.name)}.json")
    bench.write_json(dict(meta=meta, rows=rows), out)
    lines = bench.report.text_table(
        ["path", "call + sync us", "enqueue us", "GPU us"],
        [[r["path"], f"{r['call_sync_us']:.1f}", f"{r['enqueue_us']:.1f}", f"{r['gpu_us']:.1f}"]
         for r in rows], left=("path",))
    print(f"host cost per call on {dev.name}, {B}x{H}x{L}, {args.calls} calls after "
          f"{args.warmup} warm-ups")
    print("\n".join(lines))
    for k, v in missing.items():
        print(f"skipped {k}: {v}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
