"""Stage 2 of split-K decode: merge the partitions of each query row by log-sum-exp.

Partition p of row (t, h) holds its normalised output o_p (fp32) and its LSE l_p (natural log,
-inf when it kept no key). With M = max_p l_p and w_p = exp(l_p - M):

    out = sum_p w_p o_p / sum_p w_p,        lse = M + log(sum_p w_p)

Empty partitions get weight exp(-inf) = 0; a row whose partitions are all empty gets out = 0
and lse = -inf (never NaN). A NaN LSE (NaN in the row's scores) makes the row NaN, as in the
reference. Grid ``(T, H, SLICES)``: block (t, h, z) merges output dims [128z, 128z + 128) of
row (t, h), one dim a thread, so even one long row (B = 1) spreads over many multiprocessors.
Traffic: reads P x 512 fp32 per row, writes 512 values in the output dtype.
The partition loop is latency-bound, so its loads must go out together: UNROLL partitions a
step, each load unconditional (the index is clamped, a partition past the end has weight 0),
and the weights are computed once per partition (a chunk of 128 at a time, in shared memory).
"""
import math

from numba import cuda, float32

from .._compat import JIT_OPTIONS
from .common import D_V, NEG_INF

NTHREADS = 128
SLICES = D_V // NTHREADS  # blocks per row (one output dim a thread)
UNROLL = 8  # partitions merged per step: independent loads in flight per thread


def make_combine_kernel(store):
    """``store(x)`` converts fp32 to the output's storage (see ptx.py)."""

    @cuda.jit(**JIT_OPTIONS)
    def combine_kernel(part_out, part_lse, out, lse):
        # part_out [T, H, P, 512] f32, part_lse [T, H, P] f32 -> out [T, H, 512], lse [T, H] f32
        t = cuda.blockIdx.x
        h = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        d = cuda.blockIdx.z * NTHREADS + tid
        nparts = part_lse.shape[2]
        # The row's largest LSE (and whether one is NaN): each thread scans its partitions,
        # then every thread reads the partial results from shared memory (the LSEs are loaded
        # side by side, not one after another; only the first ``nparts`` hold any: a block's
        # fixed cost counts, there are T x H x 4 of them).
        red = cuda.shared.array(NTHREADS, float32)
        mine = float32(NEG_INF)
        for p in range(tid, nparts, NTHREADS):
            x = part_lse[t, h, p]
            if x != x or x > mine:
                mine = x
            if mine != mine:
                break
        red[tid] = mine
        # Every thread's partial result is in place.
        cuda.syncthreads()
        big = float32(NEG_INF)  # float32, like part_lse: the merge stays in fp32
        nan = False
        for i in range(min(nparts, NTHREADS)):
            x = red[i]
            if x != x:
                nan = True
            elif x > big:
                big = x
        first = cuda.blockIdx.z == 0 and tid == 0  # the thread that writes the row's LSE
        if nan:  # NaN among the row's scores: the row is NaN, as in the reference
            out[t, h, d] = store(float32(math.nan))
            if first:
                lse[t, h] = float32(math.nan)
            return
        if big == float32(NEG_INF):
            out[t, h, d] = store(float32(0.0))
            if first:
                lse[t, h] = float32(NEG_INF)
            return
        # The weights, a chunk of NTHREADS partitions at a time, go through shared memory:
        # one exp per partition, not one per partition and output dim; 0 past the chunk's end.
        w_s = cuda.shared.array(NTHREADS, float32)
        acc = float32(0.0)
        total = float32(0.0)
        for c0 in range(0, nparts, NTHREADS):
            n = min(NTHREADS, nparts - c0)
            w_s[tid] = math.exp(part_lse[t, h, c0 + tid] - big) if tid < n else float32(0.0)
            # The chunk's weights are in place.
            cuda.syncthreads()
            for i in range(n):
                total += w_s[i]
            # UNROLL partitions a step: their loads are independent and unconditional (past
            # the chunk, partition n - 1 is read again with weight 0). An empty partition
            # (weight 0) adds nothing, whatever its output holds.
            for i0 in range(0, n, UNROLL):
                for u in range(UNROLL):
                    w = w_s[i0 + u]
                    x = part_out[t, h, c0 + min(i0 + u, n - 1), d]
                    acc += w * x if w > 0.0 else float32(0.0)
            # Everyone is done with the chunk before the next one replaces it.
            cuda.syncthreads()
        out[t, h, d] = store(acc / total)
        if first:
            lse[t, h] = big + math.log(total)

    return combine_kernel
