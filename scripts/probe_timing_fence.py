"""Does a provider's timed run start before the bench's start event? A check of the timer.

``time_gpu`` (numba_mla/bench/timing.py) flushes the L2 by zeroing a 256 MB buffer, records the
start event, runs the call, records the stop event. A kernel launched with programmatic stream
serialization (CUDA's programmatic dependent launch: FlashMLA launches its decode kernel so)
may begin once every block of the kernel before it has exited, before that kernel is complete;
if the event recorded between the two does not hold it back, part of the run (its blocks'
launch, its queries' copy) happens before the start event, outside the timed span.

Here each provider is timed three ways in interleaved rounds, each with the L2 flushed first:
  plain   flush, start, call, stop               (the bench's way)
  fenced  flush, start, a spin kernel, call, stop
  fence   flush, start, the spin kernel, stop     (what ``fenced`` adds)
The spin kernel (``torch.cuda._sleep``, one thread spinning on the clock; about 150 us on an
H100, longer than any provider's Python takes to enqueue its call, so the GPU never waits for
the host inside the span) is an ordinary launch after the start event: a run may overlap only
its end, inside the timed span. ``fenced - fence`` is then the run's time with nothing of it
before the start event; against ``plain`` it is about 1 for a kernel launched plainly, above
1 where the plain timing left part of a run out, and below 1 for a kernel that overlaps the
spin kernel's end (launched as its programmatic dependent).

``--follows`` adds each numba_mla provider again with ``kernels.seesaw.FOLLOWS`` the other way
(on by default: the seesaw kernel is then launched as the programmatic dependent of the kernel
before it, as FlashMLA's is), labelled ``+follows`` where it is on and ``-follows`` where off:
the two rows' ``fenced - fence`` is what it saves behind another kernel.

Usage (a GPU with torch; FlashMLA importable for ``flash_mla``):
    python scripts/probe_timing_fence.py [--shapes 64x128x4096,...] [--providers
        numba_mla:mma,flash_mla] [--follows] [--rounds 30] [--out FILE.json]
Prints one row a (provider, shape): the three medians, ``fenced - fence`` and its ratio to
``plain``.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from numba_mla.bench import configs, git_commit, providers  # noqa: E402
from numba_mla.cli import _parse_shapes  # noqa: E402
from numba_mla.bench.problems import make_problem  # noqa: E402
from numba_mla.bench.timing import Device  # noqa: E402
from numba_mla.kernels import seesaw  # noqa: E402


#: the spin kernel's length in clock cycles (about 150 us on an H100)
SPIN_CYCLES = 300_000


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="64x128x4096,128x128x1024,16x128x32768,64x16x4096")
    ap.add_argument("--providers", default="numba_mla:mma,flash_mla")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--follows", action="store_true",
                    help="numba_mla providers also with kernels.seesaw.FOLLOWS the other way")
    ap.add_argument("--out", default=None)
    ap.add_argument("--commit", default=None,
                    help="commit to record (default: the checkout's, git rev-parse)")
    args = ap.parse_args(argv)
    dev = Device()
    if dev.torch is None:
        sys.exit(f"probe_timing_fence: needs torch on a GPU ({dev.torch_reason})")
    torch = dev.torch
    settings = configs.Settings.gpu()
    rng = np.random.default_rng(0)
    rows = []
    for B, H, L in _parse_shapes(args.shapes):
        cfg = configs.Config(batch=B, heads=H, seqlen=L)
        problem = make_problem(cfg, dev, rng, settings)
        runs = [(prov, None) for prov in providers.select_providers(args.providers)]
        if args.follows:
            runs += [(prov, not seesaw.FOLLOWS) for prov, _ in runs if prov.name == "numba_mla"]
        for prov, follows in runs:
            reason = prov.unavailable(dev)
            if reason:
                print(f"{prov.key}: {reason}")
                continue
            default = seesaw.FOLLOWS
            seesaw.FOLLOWS = default if follows is None else follows  # (read by the build)
            try:
                prep = prov.prepare(problem)
            finally:
                seesaw.FOLLOWS = default
            for _ in range(3):
                prep.run()
            dev.sync()
            times = {"plain": [], "fenced": [], "fence": []}
            for _ in range(args.rounds):
                for way in times:
                    dev.flush_l2(settings.flush_bytes)
                    start, stop = dev.event(), dev.event()
                    start.record()
                    if way != "plain":
                        torch.cuda._sleep(SPIN_CYCLES)
                    if way != "fence":
                        prep.run()
                    stop.record()
                    dev.sync()
                    times[way].append(dev.elapsed_us(start, stop))
            med = {k: float(np.median(v)) for k, v in times.items()}
            alone = med["fenced"] - med["fence"]
            label = "" if follows is None else "+follows" if follows else "-follows"
            on = seesaw.FOLLOWS if follows is None else follows
            row = dict(provider=prov.key + label,
                       seesaw_follows=on if prov.name == "numba_mla" else None,
                       shape=f"{cfg.batch}x{cfg.heads}x{cfg.seqlen}", device=dev.name,
                       rounds=args.rounds, **med, fenced_minus_fence=alone,
                       over_plain=alone / med["plain"])
            rows.append(row)
            print(f"{row['provider']:22} {row['shape']:13} plain {med['plain']:7.1f}  fenced "
                  f"{med['fenced']:7.1f}  fence {med['fence']:5.1f}  fenced-fence {alone:7.1f} "
                  f"({alone / med['plain']:.3f} of plain)", flush=True)
            prep = None
            dev.release()
        del problem
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=dev.name, date=time.strftime("%Y-%m-%d"),
                           commit=args.commit or git_commit(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
