"""The run: every configuration x every provider, timed, checked against the reference, rows
and metadata returned.

For each configuration the inputs are drawn once and every provider runs on them. A row's GPU
time is ``time_gpu`` around ``Prepared.run`` (L2 flushed before each run); its error is
measured against the float64 reference on the first ``Settings.ref_seqs`` sequences, all
heads; its host cost comes from whole Python calls (``host_call``):

- ``host_us``: wall time per call over ``host_calls`` calls with one synchronize at the end
  (calls pipeline: it is max(Python cost, GPU time) per call);
- ``host_sync_us``: the median of one call followed by a synchronize (what a caller that
  waits pays);
- ``overhead_us = host_sync_us - us_warm`` (``us_warm``: the GPU time without the L2 flush,
  as in the host loop): the cost beyond the GPU time; None where ``us_warm`` is not measured
  (the simulator).

On Numba's CUDA simulator the code path is the same and the timings are meaningless.
"""
from dataclasses import asdict

import numpy as np

from .. import _compat
from ..arrays import to_host
from .configs import SCALE, TOLERANCE, Settings
from .problems import make_problem
from .providers import Skip, select_providers
from .report import COUNTING, make_row, rel_err, stamp, versions
from .timing import Device, time_gpu, time_host


def run(configs, providers=None, settings=None, seed=0, commit=None, progress=True,
        sweep=None, use_torch=True, log=print):
    """Run ``configs`` x ``providers``; returns ``{"meta": ..., "rows": [...]}``."""
    from tqdm import tqdm

    settings = settings or (Settings.simulator() if _compat.SIMULATOR else Settings.gpu())
    providers = select_providers(providers) if providers is None or isinstance(providers, str) \
        else list(providers)
    dev = Device(use_torch=use_torch)
    rng = np.random.default_rng(seed)
    log(f"numba-mla bench: {len(configs)} configurations x {len(providers)} providers on "
        f"{dev.name}")
    copy_gbps = dev.copy_bandwidth(settings.copy_bytes)
    dense = dev.matmul_tflops(settings.matmul_n)
    log(f"  copy bandwidth {copy_gbps:.0f} GB/s (device-to-device, read + written); dense bf16 "
        f"{'%.0f TFLOP/s' % dense if dense else 'not measured (needs torch on a GPU)'}")
    meta = stamp(dev, commit)
    meta.update(
        sweep=sweep, copy_gbps=copy_gbps, matmul_tflops=dense, settings=asdict(settings),
        seed=seed, scale=SCALE, tolerance=TOLERANCE,
        timing=(f"{'wall clock (simulator)' if dev.simulator else 'CUDA events'} around "
                f"run(), median and p10/p90 of {settings.iters} after {settings.warmup} warm-ups, "
                f"{settings.flush_bytes >> 20} MB written before each to flush the L2"),
        host_timing=(f"host_us: wall time per call over {settings.host_calls} whole Python "
                     "calls, one synchronize at the end; host_sync_us: median of one call + "
                     "synchronize; overhead_us = host_sync_us - us_warm (GPU time, L2 not "
                     "flushed; absent where us_warm is not measured)"),
        lengths=("spread s > 0: each length uniform over the integers in [L(1-s), L(1+s)], "
                 f"drawn from a generator seeded by (seed={seed}, B, H, L, s)"),
        counting=COUNTING, skipped=[], errors=[])
    rows, skipped = [], {}

    def skip(prov, cfg, reason):
        key = (prov.name, prov.backend, reason)
        if key not in skipped:
            skipped[key] = dict(provider=prov.name, backend=prov.backend, reason=reason,
                                first=cfg.label, count=0)
        skipped[key]["count"] += 1

    unavailable = {p.key: p.unavailable(dev) for p in providers}
    bar = tqdm(total=len(configs) * len(providers), unit="run", disable=not progress,
               leave=False)
    for cfg in configs:
        bar.set_description(cfg.label)
        problem = make_problem(cfg, dev, rng, settings, seed)
        for prov in providers:
            bar.update(1)
            if unavailable[prov.key]:
                skip(prov, cfg, unavailable[prov.key])
                continue
            if cfg.kv != "same" and prov.name != "numba_mla":
                skip(prov, cfg, "reads 16-bit caches only (rows with an FP8 cache)")
                continue
            if cfg.num_partitions is not None and not prov.splits:
                skip(prov, cfg, "no split-K factor to set (rows with a forced num_partitions)")
                continue
            prep = out = None
            try:
                prep = prov.prepare(problem)
                info = dict(prep.info)
                timing = time_gpu(dev, prep.run, settings.iters, settings.warmup,
                                  settings.flush_bytes)
                out = prep.result()
                err = rel_err(to_host(out[:problem.n_ref]), problem.reference())
                warm_us = None
                if settings.warm_iters:
                    warm_us = time_gpu(dev, prep.run, settings.warm_iters, 0, 0)[0]
                host = time_host(dev, prep.host_call or prep.run, settings.host_calls,
                                 warm=settings.warmup > 0)
            except Skip as e:
                skip(prov, cfg, str(e))
                continue
            except Exception as e:  # reported; a failure when the provider is numba_mla
                meta["errors"].append(dict(provider=prov.name, backend=prov.backend,
                                           config=cfg.label, error=f"{type(e).__name__}: {e}"))
                log(f"  {prov.key} {cfg.label}: {type(e).__name__}: {e}")
                continue
            finally:
                prep = out = None  # free the provider's buffers before the next one
                dev.release()
            rows.append(make_row(prov, problem, timing, err, info, dev.name,
                                 (copy_gbps, dense), host, warm_us))
        del problem
        dev.release()
    bar.close()
    meta["skipped"] = list(skipped.values())
    meta["versions"] = versions(dev)  # again: peers imported by their runs now show theirs
    return dict(meta=meta, rows=rows)
