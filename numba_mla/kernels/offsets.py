"""Stage 0 of a ragged call whose row offsets are in device memory: make them safe to read.

The host does not read such offsets (that would wait for the GPU on every call; checks.py's
``check_ragged``), so their values are unchecked. This kernel runs first and writes a copy the
partition kernels read instead, valid for q's ``T`` rows whatever the input holds:

    c[0] = clamp(o[0], 0, T),    c[b+1] = clamp(o[b+1], c[b], min(T, c[b] + MAX_SQ))

so the runs ``[c[b], c[b+1])`` are non-decreasing, within ``[0, T]`` and at most MAX_SQ rows
each. Offsets a host check accepts (from 0, non-decreasing, to T, at most MAX_SQ rows a run)
come out unchanged; others give runs that may not be the caller's, never a row outside q, out
or the workspace.

One block of NTHREADS threads: each chunk of NTHREADS offsets is loaded into shared memory by
all of them (one load each, in parallel), thread 0 walks the chunk (the running bound depends
on the previous offset), and all of them store it. A few microseconds for a batch of
hundreds: the loads are not a chain of dependent global reads.
"""
from numba import cuda, int32

from .._compat import JIT_OPTIONS
from ..constants import MAX_SQ

NTHREADS = 128


@cuda.jit(**JIT_OPTIONS)
def clamp_offsets(src, dst, total_rows):
    """dst [B+1] int32: src [B+1] int32 made valid row offsets for ``total_rows`` rows."""
    chunk = cuda.shared.array(NTHREADS, int32)
    tid = cuda.threadIdx.x
    n = src.shape[0]
    rows = int32(total_rows)
    prev = int32(0)  # (thread 0's: the last offset written)
    for base in range(0, n, NTHREADS):
        if base + tid < n:
            chunk[tid] = src[base + tid]
        cuda.syncthreads()
        if tid == 0:
            for j in range(min(NTHREADS, n - base)):
                v = chunk[j]
                if base + j == 0:
                    prev = min(max(v, int32(0)), rows)
                else:
                    prev = min(max(v, prev), rows, prev + int32(MAX_SQ))
                chunk[j] = prev
        cuda.syncthreads()
        if base + tid < n:
            dst[base + tid] = chunk[tid]
        cuda.syncthreads()  # (the next chunk overwrites the buffer)
