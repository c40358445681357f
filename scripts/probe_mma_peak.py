"""Probe: how fast can ``mma.sync.m16n8k16`` (bf16 in, fp32 accumulate) go on this GPU, from
Numba, alone and fed by ``ldmatrix``? The ceiling the warp tensor-core kernel
(``backend="mma_sync"``) works under (docs/kernels/mma_sync.md, "Next steps" item 10).

Each warp of a persistent grid (``blocks`` a multiprocessor) runs ``iters`` steps; a step is
``chains`` independent ``mma.sync`` (n8 tiles, each its own four accumulators), with

- ``ldsm = 0``: A and B fragments fixed in registers (the tensor pipe's own rate; with one
  chain and one warp a scheduler, a product's latency);
- ``ldsm = 1``: B of every two products from one ``ldmatrix.x4`` (as the score warps of the
  split-role form read K: two ``ldmatrix.x4`` for four products), A in registers;
- ``ldsm = 2``: A from one ``ldmatrix.x4`` a step as well (the lockstep blocks, which re-read
  Q's fragments, and the V warps, which read P).

The ``ldmatrix`` rows are laid out without bank conflicts (rows 16 bytes apart, a warp's own
4 KB) and change with the step, so the loads are not hoisted. Timed with CUDA events after a
warm-up launch; FLOPs = 2 x 16 x 8 x 16 a product.

Usage: python scripts/probe_mma_peak.py [--iters N] [--reps R]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from numba_mla import ptx  # noqa: E402  (before numba.cuda: numba_mla's environment shims)
from numba import cuda, float32, int32  # noqa: E402

from numba_mla._compat import INLINE  # noqa: E402

FLOPS_A_PRODUCT = 2 * 16 * 8 * 16
WARP_BYTES = 4096  # a warp's ldmatrix region: 256 rows of 16 bytes


def make_step(chains, ldsm):
    """``step(acc, words, base, off, a0, a1, a2, a3, b0, b1, tid)``: one step's ``chains``
    products (written out: ``mma`` takes its accumulator offset as a compile-time constant);
    the ``ldmatrix`` rows at ``base + (off ^ x)``, x changing bits 4-8 of the lane's offset
    only, so every row stays in the warp's 512 bytes of the step."""
    lines = ["def step(acc, words, base, off, a0, a1, a2, a3, b0, b1, tid):"]
    if ldsm == 2:
        lines.append("    a0, a1, a2, a3 = ldsm(words, base + off, tid)")
    for c in range(chains):
        if c % 2 == 0:  # a pair of products: B of both from one ldmatrix.x4
            if ldsm >= 1:
                lines.append(f"    b0, b1, c0, c1 = ldsm(words, base + (off ^ {pair_xor(c)}), tid)")
            else:
                lines.append("    c0, c1 = b1, b0")
        frag = "b0, b1" if c % 2 == 0 else "c0, c1"
        lines.append(f"    mma(acc, {4 * c}, a0, a1, a2, a3, {frag}, tid)")
    scope = {"ldsm": ptx.ldmatrix_x4, "mma": ptx.mma_m16n8k16("bf16")}
    exec("\n".join(lines), scope)  # (generated here, from the lines above: no outside input)
    return cuda.jit(device=True, **INLINE)(scope["step"])


def pair_xor(c):
    """The offset bits product pair c // 2 flips for its B rows (16 bytes a pair)."""
    return (8 * c) & 0x1F0


# word i of the shared array: (i * INIT_MUL) & INIT_MASK, bf16 pairs of powers of two (or 0)
INIT_MUL, INIT_MASK = 0x9E3779B1, 0x3F803F80


def make_kernel(chains, ldsm, warps):
    step = make_step(chains, ldsm)
    nacc = 4 * chains
    smem_words = warps * WARP_BYTES // 4

    @cuda.jit
    def mma_probe(out, iters):
        words = cuda.shared.array(smem_words, int32)
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        for i in range(tid, smem_words, cuda.blockDim.x):
            words[i] = (i * INIT_MUL) & INIT_MASK
        cuda.syncthreads()
        base = ptx.smem_addr(words)
        acc = cuda.local.array(nacc, float32)
        for i in range(nacc):
            acc[i] = 0.0
        a = int32(0x3F803F80 ^ lane)  # bf16 near 1.0
        b = int32(0x3F803F80 ^ (lane << 3))
        for it in range(iters):
            # (lane's row, 512 bytes further a step, within the warp's 4 KB)
            off = warp * WARP_BYTES + ((it & 7) << 9) + 16 * lane
            step(acc, words, base, off, a, a ^ 1, a ^ 2, a ^ 3, b, b ^ 1, tid)
        s = float32(0.0)
        for i in range(nacc):
            s += acc[i]
        out[cuda.blockIdx.x * cuda.blockDim.x + tid] = s

    return mma_probe


def expected(chains, ldsm, iters, warp=0):
    """(NumPy) ``out`` of one warp of the probe: each lane's sum of its accumulators, from the
    fragment layouts of PTX's mma.m16n8k16 and ldmatrix, in float64."""
    words = (np.arange((warp + 1) * WARP_BYTES // 4, dtype=np.int64) * INIT_MUL) & INIT_MASK
    lane = np.arange(32)
    g, t = lane // 4, lane % 4

    def values(w):  # int32 words [...] -> their bf16 pairs as float64 [..., 2]
        w = (np.asarray(w, np.int64) & 0xFFFFFFFF).astype(np.uint32)
        f = (w[..., None] >> np.array([0, 16], np.uint32)) & 0xFFFF
        return (f.astype(np.uint32) << 16).view(np.float32).astype(np.float64)

    def ldmatrix(offs):  # lane i names row offs[i] (bytes); each gets row g's pair t of 4
        rows = values(words[(offs[:, None] // 4 + np.arange(4))])  # [row, 4 words, 2]
        return np.stack([rows[8 * m + g, t] for m in range(4)], axis=1)  # [lane, 4, 2]

    out = np.zeros(32)
    a_reg = values(np.stack([(0x3F803F80 ^ lane) ^ k for k in range(4)], axis=1))
    b_reg = values(np.stack([0x3F803F80 ^ (lane << 3), (0x3F803F80 ^ (lane << 3)) ^ 1], axis=1))
    for it in range(iters):
        off = warp * WARP_BYTES + ((it & 7) << 9) + 16 * lane
        a = ldmatrix(off) if ldsm == 2 else a_reg
        A = np.empty((16, 16))
        for w in range(4):  # a0 rows g, cols 2t; a1 rows +8; a2 cols +8; a3 both
            A[g[:, None] + 8 * (w % 2), 2 * t[:, None] + 8 * (w // 2) + np.arange(2)] = a[:, w]
        for c in range(chains):
            if ldsm >= 1:
                bw = ldmatrix(off ^ pair_xor(c - c % 2))[:, 2 * (c % 2):2 * (c % 2) + 2]
            else:
                bw = b_reg if c % 2 == 0 else b_reg[:, ::-1]
            B = np.empty((16, 8))
            for w in range(2):  # b0 rows 2t, col g; b1 rows +8
                B[2 * t[:, None] + 8 * w + np.arange(2), g[:, None]] = bw[:, w]
            D = A @ B
            out += D[g, 2 * t] + D[g, 2 * t + 1] + D[g + 8, 2 * t] + D[g + 8, 2 * t + 1]
    return out


def run(chains, ldsm, warps, blocks, iters, reps):
    kernel = make_kernel(chains, ldsm, warps)
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    grid, nt = sms * blocks, 32 * warps
    out = cuda.device_array(grid * nt, np.float32)
    kernel[grid, nt](out, iters)  # compile and warm up
    cuda.synchronize()
    start, stop = cuda.event(), cuda.event()
    best = None
    for _ in range(reps):
        start.record()
        kernel[grid, nt](out, iters)
        stop.record()
        stop.synchronize()
        ms = cuda.event_elapsed_time(start, stop)
        best = ms if best is None else min(best, ms)
    products = grid * warps * iters * chains
    return products * FLOPS_A_PRODUCT / (best * 1e-3) / 1e12, best


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    dev = cuda.get_current_device()
    print(f"# {dev.name.decode() if isinstance(dev.name, bytes) else dev.name}, "
          f"{dev.MULTIPROCESSOR_COUNT} multiprocessors; mma.sync m16n8k16 bf16 -> f32")
    clock_hz = dev.CLOCK_RATE * 1e3  # (kHz)
    print(f"# cycles at the reported clock, {clock_hz / 1e9:.2f} GHz")
    print("ldsm  chains  warps/block  blocks/SM  TFLOP/s       ms  cycles/product/scheduler")
    configs = [(0, chains, warps, blocks) for chains in (1, 2, 4, 8, 16)
               for warps, blocks in ((4, 1), (4, 2), (8, 1), (16, 1))]
    configs += [(ldsm, chains, warps, blocks) for ldsm in (1, 2) for chains in (4, 8, 16)
                for warps, blocks in ((4, 1), (4, 2), (8, 1), (16, 1))]
    for ldsm, chains, warps, blocks in configs:
        tflops, ms = run(chains, ldsm, warps, blocks, args.iters, args.reps)
        # a scheduler's cycles a product, at the device's reported clock (a lower bound where
        # the clock runs below it): its warps' chains' products in flight
        per_scheduler = blocks * warps / 4 * args.iters * chains
        cycles = ms * 1e-3 * clock_hz / per_scheduler
        print(f"{ldsm:4d}  {chains:6d}  {warps:11d}  {blocks:9d}  {tflops:7.1f}  {ms:7.3f}  "
              f"{cycles:6.2f}", flush=True)


if __name__ == "__main__":
    main()
