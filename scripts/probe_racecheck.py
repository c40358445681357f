"""Probe: does compute-sanitizer's racecheck report a hazard across a block barrier once the
two warpgroups of a block have used named barriers as the seesaw kernel does
(kernels/seesaw.py)?

On one H = 128 sequence of several tiles racecheck reports read-after-write hazards in the
seesaw kernel's epilogue, on the rows' reciprocal sums that one thread stores and another
loads after the block barrier (``plots/sanitize_seesaw8_14db059_h200.txt``). Before that,
each pair of tiles has the warpgroups hand off through named barriers 1 and 2 (256 threads:
one warpgroup arrives, the other waits) and sync on barriers 3 and 4 (one warpgroup's 128
threads), a different number of times in each warpgroup. This kernel does only that: the
same handoffs (a value written before each arrival, read after the wait), ``pairs`` times,
then the epilogue's store, block barrier and load. A hazard here is racecheck's, not a race.

Also the one-way handoff of the mma_sync kernel's split-role form (kernels/mma_sync_roles.py):
one warp stores, then ``bar.arrive``; another ``bar.sync``s on the same barrier, then loads.
The PTX ISA orders those (an arrive guarantees that the thread's earlier accesses are
performed relative to the barrier's threads when it completes). ``--handoffs`` runs that
kernel ("arrive"), the same with ``bar.sync`` on both sides ("sync"), a real race, the
store after the arrival ("racy"), the form's whole protocol of named barriers over several
sub-tiles in the in-turn order ("ring": ``make_ring``) and in ``S_AHEAD``'s, the default's
("ring_ahead"), and the in-turn ring with the values' handoff (PREADY) synced on both sides
("ring_sync"), each under racecheck. On an H100 (2026-12-05, d6d96a2):
arrive 0 hazards, sync 0, racy 1, ring 224 read-after-write errors on the handed-over values
with the result right; at d3dfe31 (a sanitizer that groups an instruction pair's hazards
into one error) ring 3, ring_ahead 4, ring_sync 10, each result right
(plots/racecheck_probe_rings_d3dfe31_h100.txt).

Usage (GPU):  python scripts/probe_racecheck.py [--pairs 1,2,3,5,8]
    runs itself under racecheck once for each pair count and prints the hazards of each.
              python scripts/probe_racecheck.py --handoffs [arrive,sync,racy,ring,ring_ahead,ring_sync]
    the same for the one-way handoff kernels.
              python scripts/probe_racecheck.py --child N  (or --handoff-child KIND)
    one launch of N pairs (or of that handoff kernel), its result checked (also in the
    simulator: NUMBA_ENABLE_CUDASIM=1).
"""
import argparse
import re
import subprocess
import sys

import numpy as np

from numba_mla import ptx  # (first: it picks the simulator where there is no GPU)
from numba import cuda, float32  # noqa: E402  (a global: the simulator swaps it in kernels)


def make_probe():
    BAR_SCALE0, BAR_SCALE1, BAR_WG = 1, 2, 3  # as in kernels/seesaw.py

    @cuda.jit
    def probe(out, pairs):
        hand = cuda.shared.array(128, float32)  # the handoffs' values
        sums = cuda.shared.array(64, float32)  # the epilogue's
        tid = cuda.threadIdx.x
        wg = tid // 128
        wtid = tid % 128
        got = float32(0.0)
        for p in range(pairs):
            if wg == 0:
                ptx.bar_sync(BAR_WG + wg, 128)
                hand[wtid] = float32(p)
                ptx.bar_arrive(BAR_SCALE0, 256)  # (WG1 reads it)
                ptx.bar_sync(BAR_WG + wg, 128)  # (a refill's barrier)
                ptx.bar_sync(BAR_SCALE1, 256)  # (WG1 wrote it)
                got += hand[(wtid + 1) % 128]
                ptx.bar_sync(BAR_WG + wg, 128)
            else:
                ptx.bar_sync(BAR_SCALE0, 256)
                got += hand[(wtid + 1) % 128]
                ptx.bar_sync(BAR_WG + wg, 128)  # (every warp has read it)
                hand[wtid] = float32(p) + float32(0.5)
                ptx.bar_arrive(BAR_SCALE1, 256)
                ptx.bar_sync(BAR_WG + wg, 128)
        cuda.syncthreads()
        if tid < 64:
            sums[tid] = float32(tid)
        cuda.syncthreads()
        out[tid] = sums[(tid + 5) % 64] + got

    return probe


def make_handoff(kind):
    """Warp 0 stores 32 values and hands them to warp 1 (64 threads, named barrier 1): by
    ``bar.arrive`` ("arrive"), by ``bar.sync`` on both sides ("sync"), or with the store
    after the arrival ("racy": a race)."""
    from numba import int32

    racy, arrive = kind == "racy", kind == "arrive"  # (constants in the kernel)

    @cuda.jit
    def handoff(out):
        vals = cuda.shared.array(32, int32)
        tid = cuda.threadIdx.x
        if tid < 32:
            if racy:
                ptx.bar_arrive(1, 64)
            vals[tid] = tid + 1
            if arrive:
                ptx.bar_arrive(1, 64)
            elif not racy:
                ptx.bar_sync(1, 64)
        else:
            ptx.bar_sync(1, 64)
            out[tid - 32] = vals[(tid + 1) % 32]

    return handoff


#: sub-tiles the "ring" handoff walks
RING_SUBS = 6


def make_ring(sync_pready=False, ahead=False):
    """The split-role kernel's whole handoff protocol, without its arithmetic: 256 threads,
    score warps 0-3 and V warps 4-7, ``RING_SUBS`` sub-tiles j, buffer h = j % 2, its barriers
    (kernels/mma_sync_roles.py: PAIR 1 + sm, KREADY 3 + h, PREADY 5 + h, PFREE 7 + h, VDONE
    9). A score warp waits for KREADY[h] and its pair, then PFREE[h], writes its rows' value
    of sub-tile j into buffer h as the kernel writes alpha (lanes tq = 0 of dh = 0), arrives
    at PREADY[h]; a V warp waits for PREADY[h], arrives at KREADY[h] for j + 2, reads four
    rows of buffer h, arrives at PFREE[h] for j + 2 and syncs the V warps (VDONE). Each V
    thread writes the sum of what it read. ``sync_pready``: the score warps ``bar.sync`` on
    PREADY in place of their arrival (the V warps always reach that barrier next, so nothing
    deadlocks): the handoff of the values then has both sides wait. ``ahead``: the score
    warps' order with ``S_AHEAD`` (the default four-stage form's): KREADY[0] once before
    the walk, then for each sub-tile the pair, KREADY of the next (if any), PFREE[h]."""
    @cuda.jit
    def ring(out):
        al = cuda.shared.array(64, float32)
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        gr, tq = lane // 4, lane % 4
        if warp < 4:
            sm, dh = warp // 2, warp % 2
            if ahead:
                ptx.bar_sync(3, 256)
            for j in range(RING_SUBS):
                h = j % 2
                if not ahead:
                    ptx.bar_sync(3 + h, 256)
                ptx.bar_sync(1 + sm, 64)
                if ahead and j + 1 < RING_SUBS:
                    ptx.bar_sync(3 + 1 - h, 256)
                ptx.bar_sync(7 + h, 256)
                for half in range(2):
                    i = 16 * sm + gr + 8 * half
                    if dh == 0 and tq == 0:
                        al[32 * h + i] = float32(32 * j + i)
                if sync_pready:
                    ptx.bar_sync(5 + h, 256)
                else:
                    ptx.bar_arrive(5 + h, 256)
        else:
            for h in range(2):
                ptx.bar_arrive(3 + h, 256)
                ptx.bar_arrive(7 + h, 256)
            total = float32(0.0)
            for j in range(RING_SUBS):
                h = j % 2
                ptx.bar_sync(5 + h, 256)
                if j + 2 < RING_SUBS:
                    ptx.bar_arrive(3 + h, 256)
                for k in range(4):
                    total += al[32 * h + gr + 8 * k]
                if j + 2 < RING_SUBS:
                    ptx.bar_arrive(7 + h, 256)
                ptx.bar_sync(9, 128)
            out[tid - 128] = total

    return ring


def ring_child(kind="ring"):
    out = cuda.to_device(np.zeros(128, np.float32))
    make_ring(kind == "ring_sync", kind == "ring_ahead")[1, 256](out)
    gr = np.arange(128) % 32 // 4
    want = sum(32 * j + gr + 8 * k for j in range(RING_SUBS) for k in range(4)).astype(np.float32)
    ok = np.array_equal(out.copy_to_host(), want)
    print(f"handoff {kind}: {'ok' if ok else 'WRONG'}")
    return 0 if ok else 1


def handoff_child(kind):
    if kind.startswith("ring"):
        return ring_child(kind)
    out = cuda.to_device(np.zeros(32, np.int32))
    make_handoff(kind)[1, 64](out)
    ok = np.array_equal(out.copy_to_host(), (np.arange(32) + 1) % 32 + 1)
    print(f"handoff {kind}: {'ok' if ok else 'WRONG'}")
    return 0 if ok or kind == "racy" else 1


def child(pairs):
    out = cuda.device_array(256, np.float32)
    make_probe()[1, 256](out, pairs)
    got = out.copy_to_host()
    tid = np.arange(256)
    # the epilogue's value, plus what each handed over: WG0 read WG1's (p + 0.5), WG1 WG0's (p)
    want = ((tid + 5) % 64 + np.where(tid < 128, sum(p + 0.5 for p in range(pairs)),
                                      sum(float(p) for p in range(pairs)))).astype(np.float32)
    ok = np.array_equal(got, want)
    print(f"pairs {pairs}: {'ok' if ok else 'WRONG'}")
    return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", type=int, default=None, help="one launch of this many pairs")
    ap.add_argument("--pairs", default="1,2,3,5,8")
    ap.add_argument("--handoffs", nargs="?", const="arrive,sync,racy,ring,ring_ahead,ring_sync", default=None,
                    help="probe the one-way handoff kernels instead (default all of them)")
    ap.add_argument("--handoff-child", choices=("arrive", "sync", "racy", "ring", "ring_ahead",
                                                     "ring_sync"), default=None,
                    help="one launch of that handoff kernel")
    args = ap.parse_args(argv)
    if args.child is not None:
        return child(args.child)
    if args.handoff_child is not None:
        return handoff_child(args.handoff_child)
    runs = ([(f"handoff {k}", ["--handoff-child", k]) for k in args.handoffs.split(",")]
            if args.handoffs else
            [(f"pairs {n}", ["--child", n]) for n in args.pairs.split(",")])
    bad = 0
    for name, child_args in runs:
        r = subprocess.run(["compute-sanitizer", "--tool", "racecheck", sys.executable, __file__]
                           + child_args, capture_output=True, text=True)
        text = r.stdout + r.stderr
        m = re.search(r"RACECHECK SUMMARY: (\d+) hazard", text)
        print(f"{name}: racecheck {m.group(1) if m else '?'} hazards, rc {r.returncode}"
              f"{'' if 'ok' in r.stdout else ' (result WRONG or missing)'}", flush=True)
        bad += r.returncode != 0 or m is None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
