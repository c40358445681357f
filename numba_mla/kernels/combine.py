"""Stage 2 of split-K decode: merge the partitions of each query row by log-sum-exp.

Partition p of row (t, h) holds its normalised output o_p (fp32) and its LSE l_p (natural log,
-inf when it kept no key). With M = max_p l_p and w_p = exp(l_p - M):

    out = sum_p w_p o_p / sum_p w_p,        lse = M + log(sum_p w_p)

Empty partitions get weight exp(-inf) = 0; a row whose partitions are all empty gets out = 0
and lse = -inf (never NaN). A NaN LSE (NaN in the row's scores) makes the row NaN, as in the
reference. Grid ``(T, H)``, one block a row; thread x owns output dims
x, x + 128, ... . Traffic: reads P x 512 fp32 per row, writes 512 values in the output dtype.
The P weights are computed once each (a chunk of 128 at a time, in shared memory); the row's
LSEs are read by all threads at once, and partitions merged four at a time, so no step waits
on one load after another (a long row of 64 partitions took 110 us when it did).
"""
import math

from numba import cuda, float32

from .._compat import JIT_OPTIONS
from .common import D_V, NEG_INF

NTHREADS = 128
DIMS = D_V // NTHREADS  # output dims per thread
UNROLL = 4  # partitions merged per step


def make_combine_kernel(store):
    """``store(x)`` converts fp32 to the output's storage (see ptx.py)."""

    @cuda.jit(**JIT_OPTIONS)
    def combine_kernel(part_out, part_lse, out, lse):
        # part_out [T, H, P, 512] f32, part_lse [T, H, P] f32 -> out [T, H, 512], lse [T, H] f32
        t = cuda.blockIdx.x
        h = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        nparts = part_lse.shape[2]
        # The row's largest LSE (and whether one is NaN): each thread scans its partitions,
        # then every thread reads the 128 partial results from shared memory (the LSEs are
        # loaded side by side, not one after another).
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
        for i in range(NTHREADS):
            x = red[i]
            if x != x:
                nan = True
            elif x > big:
                big = x
        if nan:  # NaN among the row's scores: the row is NaN, as in the reference
            for d in range(tid, D_V, NTHREADS):
                out[t, h, d] = store(float32(math.nan))
            if tid == 0:
                lse[t, h] = float32(math.nan)
            return
        if big == float32(NEG_INF):
            for d in range(tid, D_V, NTHREADS):
                out[t, h, d] = store(float32(0.0))
            if tid == 0:
                lse[t, h] = float32(NEG_INF)
            return
        # The weights, a chunk of NTHREADS partitions at a time, go through shared memory:
        # one exp per partition, not one per partition and output dim.
        w_s = cuda.shared.array(NTHREADS, float32)
        acc = cuda.local.array(DIMS, float32)
        for j in range(DIMS):
            acc[j] = float32(0.0)
        total = float32(0.0)
        for c0 in range(0, nparts, NTHREADS):
            n = min(NTHREADS, nparts - c0)
            if tid < n:
                w_s[tid] = math.exp(part_lse[t, h, c0 + tid] - big)  # 0 for empty partitions
            # The chunk's weights are in place.
            cuda.syncthreads()
            for i in range(n):
                total += w_s[i]
            # Four partitions a step: their loads are independent and go out together. An
            # empty partition (weight 0) adds nothing, whatever its output holds.
            for i0 in range(0, n, UNROLL):
                for j in range(DIMS):
                    d = tid + NTHREADS * j
                    for u in range(UNROLL):
                        if i0 + u < n:
                            w = w_s[i0 + u]
                            x = part_out[t, h, c0 + i0 + u, d]
                            acc[j] += w * x if w > 0.0 else float32(0.0)
            # Everyone is done with the chunk before the next one replaces it.
            cuda.syncthreads()
        inv = float32(1.0) / total
        for j in range(DIMS):
            out[t, h, tid + NTHREADS * j] = store(acc[j] * inv)
        if tid == 0:
            lse[t, h] = big + math.log(total)

    return combine_kernel
