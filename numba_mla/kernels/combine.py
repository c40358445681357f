"""Stage 2 of split-K decode: merge the partitions of each query row by log-sum-exp.

Partition p of row (t, h) holds its normalised output o_p (fp32) and its LSE l_p (natural log,
-inf when it kept no key). With M = max_p l_p and w_p = exp(l_p - M):

    out = sum_p w_p o_p / sum_p w_p,        lse = M + log(sum_p w_p)

Empty partitions get weight exp(-inf) = 0; a row whose partitions are all empty gets out = 0
and lse = -inf (never NaN). A NaN LSE (NaN in the row's scores) makes the row NaN, as in the
reference.

Grid ``(T, H)``, block ``(128, S)``: block (t, h) merges row (t, h). Thread (x, g) holds output
dims 4x .. 4x + 3 (one 16-byte load a partition; a warp's load is 512 contiguous bytes) and
merges partitions g, g + S, ... in one pass, the maximum kept as it goes (as the partition
kernel's online softmax does); the S groups then meet in shared memory. Every load of a step is
issued before any is used (UNROLL partitions, 16 bytes each), so a thread keeps 8 loads in
flight (what bounds the merge, measured, is its instructions: docs/kernels/combine.md), and one
long row (B = 1) still spreads its partitions over S x 4 warps. A step's LSEs are loaded one
step ahead, so that only the outputs of partitions that kept a key are read: under the balanced
schedule (heuristics.balanced_split) a short sequence leaves most of its P partitions empty, and
those cost one LSE each, not 2 KB (the one-step kernel below reads every slot, in one trip).
``split(rows, P)`` picks S (launch.py). With ``skips`` (the runs kernel that writes the
sequences it does not cut out itself: kernels/seesaw.py's ``mixed``), a row whose partition 0
holds the LSE ``WRITTEN`` (+inf, which no partition's LSE can be: a score of +inf makes its
row's LSE NaN) was written out by its block: the kernel leaves it alone. Up to UNROLL
partitions (two is the commonest split) a one-step kernel on the same grid does the merge
instead (``variant``, ``_make_few_kernel``).
Traffic: reads P LSEs and (partitions that kept a key) x 512 fp32 per row (the one-step
kernel: every partition's 512), writes 512 values in the output dtype.
"""
import math

from numba import cuda, float32, uint64

from .. import ptx
from .._compat import JIT_OPTIONS
from .common import D_V, NEG_INF

NTHREADS = 128  # threads of one group: D_V / DIMS
DIMS = D_V // NTHREADS  # output dims a thread
MAX_SPLIT = 4  # partition groups of a block (its y dimension)
UNROLL = 8  # partitions a step
#: Partition 0's LSE of a row that its partition kernel wrote out itself (``skips``)
WRITTEN = math.inf


def split(rows, nparts, sms):
    """Partition groups per block: enough of them that few rows still fill the device, but
    no more than there are whole steps of UNROLL partitions."""
    want = -(-8 * sms // max(rows, 1))  # about 8 blocks' worth of groups per multiprocessor
    return max(1, min(MAX_SPLIT, nparts // UNROLL, want))


def variant(rows, nparts, sms):
    """``(few, groups)``: which kernel merges ``nparts`` partitions of ``rows`` rows, and the
    partition groups of its block (its y dimension). Up to UNROLL partitions, the one-step
    kernel (``few`` slots, the power of two at or above ``nparts``; one group); past that, the
    general one (``few`` = 0) with ``split``'s groups."""
    if nparts <= UNROLL:
        return max(2, 1 << (max(nparts, 1) - 1).bit_length()), 1
    return 0, split(rows, nparts, sms)


def make_combine_kernel(store, follows=False, few=0, skips=False):
    """``store(x)`` converts fp32 to the output's storage (see ptx.py). ``follows``: the
    kernel is launched as the partition kernel's programmatic dependent (sm_90, launch.py), so
    the driver may start it before that kernel has finished; it waits for it
    (``ptx.grid_dependency_wait``) before reading anything, and what is saved is the launch's
    own latency between the two kernels. ``few``: the one-step kernel for at most ``few``
    partitions (``variant``), else the general one. ``skips``: rows whose partition 0's LSE is
    ``WRITTEN`` are left as they are."""
    if few:
        return _make_few_kernel(store, follows, few, skips)

    @cuda.jit(**JIT_OPTIONS)
    def combine_kernel(part_out, part_lse, out, lse):
        if follows:
            ptx.grid_dependency_wait()
        # part_out [T, H, P, 512] f32, part_lse [T, H, P] f32 -> out [T, H, 512], lse [T, H] f32
        # (unsigned indices: no wraparound test for negative ones, one base address a row)
        t = uint64(cuda.blockIdx.x)
        h = uint64(cuda.blockIdx.y)
        if skips and part_lse[t, h, 0] == float32(WRITTEN):
            return  # (the row's block wrote it out; uniform in the block, before any barrier)
        x = uint64(cuda.threadIdx.x)
        g = uint64(cuda.threadIdx.y)
        S = uint64(cuda.blockDim.y)
        nparts = uint64(part_lse.shape[2])
        acc = cuda.local.array(DIMS, float32)
        xs = cuda.local.array((UNROLL, DIMS), float32)
        ls = cuda.local.array(UNROLL, float32)
        for j in range(DIMS):
            acc[j] = 0.0
        m = float32(NEG_INF)  # largest LSE so far
        total = float32(0.0)  # sum of exp(l_p - m)
        nan = False
        nxt = cuda.local.array(UNROLL, float32)  # the next step's LSEs, loaded a step ahead
        for u in range(UNROLL):
            p = g * UNROLL + u
            nxt[u] = part_lse[t, h, p] if p < nparts else float32(NEG_INF)
        for p0 in range(g * UNROLL, nparts, S * UNROLL):
            # Loads first: the outputs of the partitions that kept a key (an empty one, LSE
            # -inf, never wrote its output), then the next step's LSEs, all in flight at once.
            for u in range(UNROLL):
                ls[u] = nxt[u]
                if ls[u] != float32(NEG_INF):  # (past the end: -inf)
                    v = ptx.ld_global_x4(part_out, t, h, p0 + u, uint64(DIMS) * x)
                    for j in range(DIMS):
                        xs[u, j] = v[j]
            for u in range(UNROLL):
                p = p0 + S * UNROLL + u
                nxt[u] = part_lse[t, h, p] if p < nparts else float32(NEG_INF)
            m_new = m
            for u in range(UNROLL):
                if ls[u] != ls[u]:
                    nan = True
                elif ls[u] > m_new:
                    m_new = ls[u]
            if m_new == float32(NEG_INF):
                continue  # nothing kept yet: no weight to give
            c = math.exp(m - m_new)  # 0 while m = -inf
            total *= c
            for j in range(DIMS):
                acc[j] *= c
            m = m_new
            for u in range(UNROLL):
                # An empty or NaN partition adds nothing, whatever its output holds (and costs
                # no exp: under the balanced schedule most slots of a short row are empty).
                if ls[u] > float32(NEG_INF):
                    w = math.exp(ls[u] - m)
                    if w > 0.0:
                        total += w
                        for j in range(DIMS):
                            acc[j] += w * xs[u, j]

        # The groups meet: each leaves m, total, NaN and its sums; every thread then finishes
        # the dims 4x + j, j = g, g + S, ... of its four.
        s_acc = cuda.shared.array((MAX_SPLIT, D_V), float32)
        s_m = cuda.shared.array(MAX_SPLIT, float32)
        s_total = cuda.shared.array(MAX_SPLIT, float32)
        s_nan = cuda.shared.array(MAX_SPLIT, float32)
        for j in range(DIMS):
            s_acc[g, uint64(DIMS) * x + uint64(j)] = acc[j]
        if x == 0:
            s_m[g] = m
            s_total[g] = total
            s_nan[g] = float32(1.0) if nan else float32(0.0)
        # Every group's results are in place.
        cuda.syncthreads()
        big = float32(NEG_INF)
        any_nan = False
        for k in range(S):
            any_nan = any_nan or s_nan[k] != 0.0
            big = max(big, s_m[k])
        # Each group's weight exp(m_k - big), then divided by the row's total: once a thread,
        # not once a dim (an empty group, m_k = -inf, weighs 0).
        wk = cuda.local.array(MAX_SPLIT, float32)
        row_total = float32(0.0)
        for k in range(MAX_SPLIT):
            wk[k] = float32(0.0)
            if k < S and s_m[k] != float32(NEG_INF):
                wk[k] = math.exp(s_m[k] - big)
                row_total += s_total[k] * wk[k]
        inv = float32(1.0) / row_total if row_total > 0.0 else float32(0.0)
        for k in range(MAX_SPLIT):
            wk[k] *= inv
        first = x == 0 and g == 0  # the thread that writes the row's LSE
        for j in range(g, uint64(DIMS), S):
            d = uint64(DIMS) * x + j
            if any_nan:  # NaN among the row's scores: the row is NaN, as in the reference
                y = float32(math.nan)
            else:  # (no kept key at all: every weight 0, y = 0)
                y = float32(0.0)
                for k in range(MAX_SPLIT):
                    if k < S:
                        y += s_acc[k, d] * wk[k]
            out[t, h, d] = store(y)
        if first:
            if any_nan:
                lse[t, h] = float32(math.nan)
            elif big == float32(NEG_INF):
                lse[t, h] = float32(NEG_INF)
            else:
                lse[t, h] = big + math.log(row_total)

    return combine_kernel


def _make_few_kernel(store, follows, few, skips=False):
    """The merge of at most ``few`` partitions (a power of two, at most UNROLL), launched on the
    general kernel's grid with one group a block: one step, no running maximum, no shared
    memory. Thread x loads the row's LSEs and beside them every partition's output (all at
    once: one round trip, ``few`` 16-byte loads in flight; an empty partition's output, which
    its block never wrote, is read and ignored), and writes its four dims. What the general
    kernel spends on a step sized for many partitions (the next step's LSEs, the rescales,
    the groups' meeting) is gone: two partitions are the commonest split."""

    @cuda.jit(**JIT_OPTIONS)
    def combine_kernel(part_out, part_lse, out, lse):
        if follows:
            ptx.grid_dependency_wait()
        t = uint64(cuda.blockIdx.x)
        h = uint64(cuda.blockIdx.y)
        if skips and part_lse[t, h, 0] == float32(WRITTEN):
            return  # (the row's block wrote it out)
        x = uint64(cuda.threadIdx.x)
        nparts = uint64(part_lse.shape[2])
        ls = cuda.local.array(few, float32)
        xs = cuda.local.array((few, DIMS), float32)
        # Every load at once, the outputs beside their LSEs. An empty partition's output slot
        # holds whatever its buffer held (the split-K workspace: zeros or an earlier call's
        # values, launch._zeroed): it is read, never used.
        for u in range(few):
            ls[u] = float32(NEG_INF)
            if uint64(u) < nparts:
                ls[u] = part_lse[t, h, uint64(u)]
                v = ptx.ld_global_x4(part_out, t, h, uint64(u), uint64(DIMS) * x)
                for j in range(DIMS):
                    xs[u, j] = v[j]
        m = float32(NEG_INF)  # the largest LSE
        nan = False
        for u in range(few):
            if ls[u] != ls[u]:
                nan = True
            elif ls[u] > m:
                m = ls[u]
        acc = cuda.local.array(DIMS, float32)
        for j in range(DIMS):
            acc[j] = 0.0
        total = float32(0.0)
        for u in range(few):
            if ls[u] > float32(NEG_INF):  # kept a key (false for NaN)
                w = math.exp(ls[u] - m)
                total += w
                for j in range(DIMS):
                    acc[j] += w * xs[u, j]
        inv = float32(1.0) / total if total > 0.0 else float32(0.0)  # (no kept key: out = 0)
        for j in range(DIMS):
            y = float32(math.nan) if nan else acc[j] * inv
            out[t, h, uint64(DIMS) * x + uint64(j)] = store(y)
        if x == 0:
            if nan:
                lse[t, h] = float32(math.nan)
            elif m == float32(NEG_INF):
                lse[t, h] = float32(NEG_INF)
            else:
                lse[t, h] = m + math.log(total)

    return combine_kernel
