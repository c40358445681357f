"""Stage 1 of split-K (flash-decoding) MLA decode on plain FMA units: the partition kernel.

Notation
--------
- A query *row* is one (query token i, head h) pair of one sequence, numbered r = i * H + h;
  a sequence with n query tokens has R = n * H rows.
- Grid ``(P, G, B)``: block (p, g, b) owns sequence b, rows ``[g*BLOCK_M, (g+1)*BLOCK_M)`` and
  key partition p of P. The kept-key range of the block's queries, ``[kstart, kend)``, is cut
  into key tiles of BLOCK_N keys; partition p walks a contiguous run of those tiles.
- 4 warps (128 threads). Shared memory (float32, rows padded to 577 words so that threads
  reading one dim of different rows hit different banks):
      Qs [BLOCK_M][577]           the block's queries, loaded once
      Ks [BLOCK_N][577]           one 576-wide KV tile: K for q.K, and its first 512 dims as V
      Ss [4][BLOCK_M][BLOCK_N]    each warp's partial scores over its quarter of the 576 dims
      Ps [BLOCK_M][BLOCK_N]       scores, then probabilities, of the current tile
      m, l, alpha [BLOCK_M]       running max (log2 units), running sum, this tile's rescale
- Scores: warp w sums dims [144w, 144w+144); its lanes form a 4 x 8 grid over (rows, keys),
  each lane holding a TM x TN register tile (TM = BLOCK_M/4, TN = BLOCK_N/8).
- P.V: warp w owns rows [w*BLOCK_M/4, ...) and each lane 16 of the 512 output dims
  (d = lane + 32j), accumulating in registers (fp32) across all tiles of the partition.

Softmax in base 2: exp(x) = exp2(x * LOG2E); when the score mod is the identity and the mask
is boolean, scale * LOG2E is folded into q as it is loaded, so scores arrive in log2 units.

Output (fp32 workspace): the partition's normalised output ``part_out[t, h, p, :512]`` and its
natural-log LSE ``part_lse[t, h, p]`` (-inf and 0 when it kept no key); the combine kernel
merges the partitions.

Traffic: each block reads its partition's keys once (576 values a key) plus its queries once;
the B x G blocks of one partition index read the same keys, G = ceil(Sq*H / BLOCK_M) times in
all (from L2 after the first).
"""
import math

from numba import cuda, float32

from ..mods import EMPTY, PARTIAL

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # log(x) = log2(x) * LN2
NEG_INF = -math.inf

D_QK = 576  # q and cache row width: 512 latent + 64 rope
D_V = 512  # V = the first 512 dims of the same row
DPAD = D_QK + 1  # shared row stride in words (bank-conflict padding)
NWARPS = 4
NTHREADS = 32 * NWARPS
M_LANES, N_LANES = 4, 8  # lane grid of the score phase
D_PER_WARP = D_QK // NWARPS  # 144
DV_PER_LANE = D_V // 32  # 16
LOADS_PER_LANE = D_QK // 32  # 18: one KV row is 18 loads per lane


def smem_bytes(block_m, block_n):
    words = (block_m + block_n) * DPAD + NWARPS * block_m * block_n + block_m * block_n + 3 * block_m
    return 4 * words


def make_partition_kernel(*, load, locate, mask_apply, mask_classify, mask_key_range, score_mod,
                          fold_scale, block_m, block_n, heads):
    """The stage-1 kernel for one configuration. Every argument is a compile-time constant:
    device functions (inlined) or ints; see factory.py."""
    assert block_m % M_LANES == 0 and block_m % NWARPS == 0 and block_n % N_LANES == 0
    TM, TN = block_m // M_LANES, block_n // N_LANES
    RPW = block_m // NWARPS  # P.V rows per warp
    H = heads
    # Word offsets into the one dynamic shared array.
    Q_OFF = 0
    K_OFF = Q_OFF + block_m * DPAD
    S_OFF = K_OFF + block_n * DPAD
    P_OFF = S_OFF + NWARPS * block_m * block_n
    M_OFF = P_OFF + block_m * block_n
    L_OFF = M_OFF + block_m
    A_OFF = L_OFF + block_m

    @cuda.jit
    def partition_kernel(q, q_offsets, storage, block_table, lengths, bias, scale,
                         part_out, part_lse):
        # q [T, H, 576] (storage dtype), q_offsets [B+1], storage [pages, page_size, 576],
        # part_out [T, H, P, 512] f32, part_lse [T, H, P] f32.
        p = cuda.blockIdx.x
        nparts = cuda.gridDim.x
        b = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        sm = cuda.shared.array(0, float32)

        row0 = q_offsets[b]  # first q row of sequence b
        nq = q_offsets[b + 1] - row0  # its query tokens
        length = lengths[b]
        page_size = storage.shape[1]
        r0 = cuda.blockIdx.y * block_m  # first row of this block
        nrows = min(block_m, nq * H - r0)  # rows this block owns (uniform in the block)
        if nrows <= 0:
            return  # every thread of the block leaves: no barrier is skipped

        # Query positions of the block's rows: i in [i_lo, i_hi], q_pos = length - nq + i.
        q_lo = length - nq + r0 // H
        q_hi = length - nq + (r0 + nrows - 1) // H
        kstart, kend = mask_key_range(q_lo, q_hi)
        kstart = max(kstart, 0)
        kend = min(kend, length)
        ntiles = (kend - kstart + block_n - 1) // block_n if kend > kstart else 0
        per_part = (ntiles + nparts - 1) // nparts
        t_begin = p * per_part
        t_end = min(t_begin + per_part, ntiles)
        qscale = scale * LOG2E if fold_scale else float32(1.0)

        # -- load the block's queries (once) and reset the running softmax state --
        for idx in range(tid, block_m * D_QK, NTHREADS):
            m = idx // D_QK
            d = idx - m * D_QK
            if m < nrows:
                r = r0 + m
                sm[Q_OFF + m * DPAD + d] = load(q[row0 + r // H, r % H, d]) * qscale
            else:
                sm[Q_OFF + m * DPAD + d] = 0.0
        if tid < block_m:
            sm[M_OFF + tid] = NEG_INF
            sm[L_OFF + tid] = 0.0
        acc = cuda.local.array((RPW, DV_PER_LANE), float32)
        for ii in range(RPW):
            for jj in range(DV_PER_LANE):
                acc[ii, jj] = 0.0
        s_acc = cuda.local.array((TM, TN), float32)
        qv = cuda.local.array(TM, float32)
        kv = cuda.local.array(TN, float32)
        vv = cuda.local.array(DV_PER_LANE, float32)
        row_buf = cuda.local.array(LOADS_PER_LANE, float32)
        ml = lane // N_LANES  # score phase: this lane's row group ...
        nl = lane % N_LANES  # ... and key group

        for t in range(t_begin, t_end):
            k0 = kstart + t * block_n
            k1 = min(k0 + block_n, kend)
            cls = mask_classify(k0, k1, q_lo, q_hi)
            if cls == EMPTY:
                continue  # the mask drops the whole tile: never loaded (uniform branch)

            # Wait until every warp is done with the previous tile's Ks and Ps (and, on the
            # first tile, until the queries and the softmax state are in place).
            cuda.syncthreads()

            # -- load K tile: warp w loads keys w, w+4, ...; lane l dims l, l+32, ... --
            # All 18 loads of a row are issued before the first store, so one memory
            # latency is paid per row rather than per element.
            for n in range(warp, block_n, NWARPS):
                k = k0 + n
                if k < k1:
                    pg, sl = locate(block_table, page_size, b, k)
                    for j in range(LOADS_PER_LANE):
                        row_buf[j] = load(storage[pg, sl, lane + 32 * j])
                else:
                    for j in range(LOADS_PER_LANE):
                        row_buf[j] = 0.0  # past the range: zero, never NaN
                for j in range(LOADS_PER_LANE):
                    sm[K_OFF + n * DPAD + lane + 32 * j] = row_buf[j]
            # Wait for the whole K tile.
            cuda.syncthreads()

            # -- partial scores: warp w sums q.K over its 144 dims --
            for ii in range(TM):
                for jj in range(TN):
                    s_acc[ii, jj] = 0.0
            for d in range(warp * D_PER_WARP, (warp + 1) * D_PER_WARP):
                for ii in range(TM):
                    qv[ii] = sm[Q_OFF + (ml + M_LANES * ii) * DPAD + d]
                for jj in range(TN):
                    kv[jj] = sm[K_OFF + (nl + N_LANES * jj) * DPAD + d]
                for ii in range(TM):
                    for jj in range(TN):
                        s_acc[ii, jj] += qv[ii] * kv[jj]
            for ii in range(TM):
                for jj in range(TN):
                    m = ml + M_LANES * ii
                    n = nl + N_LANES * jj
                    sm[S_OFF + (warp * block_m + m) * block_n + n] = s_acc[ii, jj]
            # Wait for all four warps' partial scores.
            cuda.syncthreads()

            # -- mask, score mod and online softmax: one thread per row --
            if tid < block_m:
                m = tid
                r = r0 + m
                i = r // H
                h = r % H
                q_pos = length - nq + i
                m_old = sm[M_OFF + m]
                m_new = m_old
                for n in range(block_n):
                    k = k0 + n
                    s = NEG_INF
                    if m < nrows and k < k1:
                        s = float32(0.0)
                        for w in range(NWARPS):
                            s += sm[S_OFF + (w * block_m + m) * block_n + n]
                        if fold_scale:
                            # ---- apply mask (scores already in log2 units) ----
                            if cls == PARTIAL:
                                s = mask_apply(s, b, h, i, q_pos, k, bias)
                        else:
                            s = s * scale
                            # ---- apply score mod ----
                            s = score_mod(s, b, h, q_pos, k)
                            # ---- apply mask ----
                            if cls == PARTIAL:
                                s = mask_apply(s, b, h, i, q_pos, k, bias)
                            s = s * LOG2E
                    sm[P_OFF + m * block_n + n] = s
                    m_new = max(m_new, s)
                # Rows with no kept key so far keep m = -inf; exp2 then sees 0 - 0, not NaN.
                m_ref = m_new if m_new != NEG_INF else float32(0.0)
                alpha = math.exp2(m_old - m_ref)
                l_new = sm[L_OFF + m] * alpha
                for n in range(block_n):
                    pr = math.exp2(sm[P_OFF + m * block_n + n] - m_ref)
                    sm[P_OFF + m * block_n + n] = pr
                    l_new += pr
                sm[M_OFF + m] = m_new
                sm[L_OFF + m] = l_new
                sm[A_OFF + m] = alpha
            # Wait for the probabilities and the rescale factors.
            cuda.syncthreads()

            # -- O = alpha * O + P @ V, V = Ks[:, :512] --
            for ii in range(RPW):
                a = sm[A_OFF + warp * RPW + ii]
                for jj in range(DV_PER_LANE):
                    acc[ii, jj] *= a
            for n in range(block_n):
                for jj in range(DV_PER_LANE):
                    vv[jj] = sm[K_OFF + n * DPAD + lane + 32 * jj]
                for ii in range(RPW):
                    pr = sm[P_OFF + (warp * RPW + ii) * block_n + n]
                    for jj in range(DV_PER_LANE):
                        acc[ii, jj] += pr * vv[jj]

        # Wait for the softmax state (also when no tile was processed).
        cuda.syncthreads()

        # -- write the partition's normalised output and LSE --
        for ii in range(RPW):
            m = warp * RPW + ii
            if m < nrows:
                r = r0 + m
                t_row = row0 + r // H
                h = r % H
                l = sm[L_OFF + m]
                inv = 1.0 / l if l > 0.0 else float32(0.0)
                for jj in range(DV_PER_LANE):
                    part_out[t_row, h, p, lane + 32 * jj] = acc[ii, jj] * inv
                if lane == 0:
                    if l > 0.0:
                        part_lse[t_row, h, p] = (sm[M_OFF + m] + math.log2(l)) * LN2
                    else:
                        part_lse[t_row, h, p] = NEG_INF

    return partition_kernel
