"""Stage 1 of split-K (flash-decoding) MLA decode on plain FMA units: the partition kernel.

Notation
--------
- A query *row* is one (query token i, head h) pair of one sequence, numbered r = i * H + h;
  a sequence with n query tokens has R = n * H rows.
- Grid ``(P, G, B)``: block (p, g, b) owns sequence b, rows ``[g*BLOCK_M, (g+1)*BLOCK_M)`` and
  key partition p of P. The kept-key range of the block's queries, ``[kstart, kend)``, is cut
  into key tiles of BLOCK_N = 32 keys; partition p walks a contiguous run of those tiles,
  skipping the ones the mask drops entirely.
- 8 warps (256 threads). A cache row is 576 values = ROW_WORDS 4-byte *words* (288 packed
  bf16/fp16 pairs, or 576 fp32). Shared memory (4-byte words):
      Qt [576][BLOCK_M]           queries, transposed: the BLOCK_M rows of one dim are adjacent,
                                  so one 16-byte broadcast load gives four rows
      Pt [BLOCK_N][BLOCK_M]       probabilities of the current tile, transposed likewise
      Ss [8][BLOCK_M][BLOCK_N]    each warp's partial scores over its eighth of the dims
      m, l, alpha [BLOCK_M]       running max (log2 units), running sum, this tile's rescale
      Ks [2][BLOCK_N][ROW_WORDS+1] two KV tiles (double buffer) in storage format: the next
                                  tile is copied asynchronously (cp.async) while this one is
                                  used; the +1 word of padding puts the 32 rows of one column
                                  in 32 different banks
- Scores: warp w sums the dims of words [w*ROW_WORDS/8, (w+1)*ROW_WORDS/8); lane = key, each
  lane holding BLOCK_M partial scores in registers. Per word: one load of K, BLOCK_M/4 (x2
  for packed pairs) broadcast loads of q, BLOCK_M (x2) FMAs.
- Online softmax: warp w owns rows w, w+8, ...; lane = key; row max and sum by warp shuffles.
- P.V: thread t owns V words t (and t+256 for fp32), i.e. 2 of the 512 output dims, for all
  BLOCK_M rows; fp32 accumulators in registers across the partition's tiles.

Softmax in base 2: exp(x) = exp2(x * LOG2E); when the score mod is the identity and the mask
is boolean, scale * LOG2E is folded into q as it is loaded, so scores arrive in log2 units.

Output (fp32 workspace): the partition's normalised output ``part_out[t, h, p, :512]`` and its
natural-log LSE ``part_lse[t, h, p]`` (-inf and 0 when it kept no key); the combine kernel
merges the partitions.

Traffic: each block reads its partition's keys once (576 values a key, into shared memory,
serving both q.K and P.V) plus its queries once; the G row groups of one sequence read the same
keys (from L2 after the first).
"""
import math

from numba import cuda, float32, int32

from .. import ptx
from .._compat import JIT_OPTIONS
from ..mods import PARTIAL
from .common import D_QK, D_V, LN2, LOG2E, NEG_INF, make_tile_walk

NWARPS = 8
NTHREADS = 32 * NWARPS
BLOCK_N = 32  # keys per tile: one per lane in the score and softmax phases


def layout(block_m, packed):
    """Word offsets of the shared arrays and the total size in bytes."""
    row_words = D_QK // 2 if packed else D_QK
    qt = 0
    pt = qt + D_QK * block_m
    ss = pt + BLOCK_N * block_m
    m = ss + NWARPS * block_m * BLOCK_N
    l = m + block_m
    alpha = l + block_m
    ks = alpha + block_m
    ks += -ks % 4  # keep Ks 16-byte aligned
    stride = row_words + 1
    end = ks + 2 * BLOCK_N * stride
    assert block_m % 4 == 0 and qt % 4 == pt % 4 == alpha % 4 == 0  # lds128 alignment
    return dict(qt=qt, pt=pt, ss=ss, m=m, l=l, alpha=alpha, ks=ks, stride=stride,
                row_words=row_words, nbytes=4 * end)


def make_partition_kernel(*, load, unpack, locate, mask_apply, mask_classify, mask_key_range,
                          score_mod, fold_scale, block_m, heads):
    """The stage-1 kernel for one configuration. Every argument is a compile-time constant:
    device functions (inlined) or ints; see factory.py. ``unpack`` turns a packed 16-bit pair
    into two floats, or is None for fp32 storage."""
    packed = unpack is not None
    WORD = int32 if packed else float32
    if not packed:

        @cuda.jit(device=True)
        def unpack(w):  # typed but never called: the fp32 branches read floats directly
            return w, w

    L = layout(block_m, packed)
    QT, PT, SS, M_, L_, A_, KS = L["qt"], L["pt"], L["ss"], L["m"], L["l"], L["alpha"], L["ks"]
    STRIDE, ROW_WORDS = L["stride"], L["row_words"]
    BUF = BLOCK_N * STRIDE  # words per KV tile buffer
    E = 2 if packed else 1  # values per word
    WORDS_PER_WARP = ROW_WORDS // NWARPS  # score phase: this warp's slice of a row
    WORDS_PER_LANE = ROW_WORDS // 32  # tile copy: words per lane per key
    KEYS_PER_WARP = BLOCK_N // NWARPS  # tile copy: keys per warp
    ROWS_PER_WARP = block_m // NWARPS
    MQ = block_m // 4  # 16-byte groups of rows
    H = heads
    assert block_m % 8 == 0 and ROW_WORDS % (32 * NWARPS // 8) == 0
    assert D_QK * block_m >= D_V * block_m  # the output is staged in the queries' space
    key_tiles, next_tile = make_tile_walk(mask_classify, mask_key_range, BLOCK_N, heads)

    @cuda.jit(device=True)
    def issue_tile(smk, sb, buf, storage, block_table, page_size, b, k0, k1, warp, lane):
        """Start the asynchronous copy of keys [k0, k1) into buffer ``buf`` (zeros past k1)."""
        for j in range(KEYS_PER_WARP):
            n = warp + NWARPS * j
            k = k0 + n
            valid = k < k1
            pg = 0
            sl = 0
            if valid:
                pg, sl = locate(block_table, page_size, b, k)
            base = KS + buf * BUF + n * STRIDE
            for c in range(WORDS_PER_LANE):
                w = lane + 32 * c
                ptx.cp_async4(smk, sb + 4 * (base + w), storage, pg, sl, w, valid)
        ptx.cp_async_commit()

    @cuda.jit(**JIT_OPTIONS)
    def partition_kernel(q, q_offsets, storage, block_table, lengths, bias, scale,
                         part_out, part_lse):
        # q [T, H, 576] (storage dtype), q_offsets [B+1], storage [pages, page_size, words],
        # part_out [T, H, P, 512] f32, part_lse [T, H, P] f32.
        p = cuda.blockIdx.x
        nparts = cuda.gridDim.x
        b = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        smf = cuda.shared.array(0, float32)  # one dynamic allocation, seen as floats ...
        smk = cuda.shared.array(0, WORD)  # ... and as storage words
        sb = ptx.smem_addr(smf)  # its 32-bit address: byte offsets below are added to it

        row0 = q_offsets[b]  # first q row of sequence b
        nq = q_offsets[b + 1] - row0  # its query tokens
        length = lengths[b]
        page_size = storage.shape[1]
        r0 = cuda.blockIdx.y * block_m  # first row of this block
        nrows = min(block_m, nq * H - r0)  # rows this block owns (uniform in the block)
        if nrows <= 0:
            return  # every thread of the block leaves: no barrier is skipped

        q_lo, q_hi, kstart, kend, ntiles = key_tiles(length, nq, r0, nrows)
        per_part = (ntiles + nparts - 1) // nparts
        t_end = min((p + 1) * per_part, ntiles)
        t = next_tile(p * per_part, t_end, kstart, kend, q_lo, q_hi)
        if t < t_end:  # start copying the first tile before anything else
            k0 = kstart + t * BLOCK_N
            issue_tile(smk, sb, 0, storage, block_table, page_size, b, k0, min(k0 + BLOCK_N, kend),
                       warp, lane)

        # -- load the block's queries, transposed (once), and reset the softmax state --
        qscale = float32(scale * LOG2E) if fold_scale else float32(1.0)
        for idx in range(tid, block_m * D_QK, NTHREADS):
            m = idx // D_QK
            d = idx - m * D_QK
            v = float32(0.0)
            if m < nrows:
                r = r0 + m
                v = load(q[row0 + r // H, r % H, d]) * qscale
            ptx.sts32(smf, sb + 4 * (QT + d * block_m + m), v)
        if tid < block_m:
            smf[M_ + tid] = float32(NEG_INF)
            smf[L_ + tid] = 0.0
        acc = cuda.local.array((block_m, 2), float32)  # P.V accumulators: rows x my 2 dims
        for ii in range(block_m):
            acc[ii, 0] = 0.0
            acc[ii, 1] = 0.0
        s_acc = cuda.local.array(block_m, float32)

        buf = 0
        while t < t_end:
            k0 = kstart + t * BLOCK_N
            k1 = min(k0 + BLOCK_N, kend)
            cls = mask_classify(k0, k1, q_lo, q_hi)
            kb = KS + buf * BUF
            ptx.cp_async_wait_all()
            # Wait until this tile's copies (every thread's) have landed, and until every
            # warp is done with the previous tile, whose buffer the next copy reuses (on the
            # first tile: until the queries and the softmax state are in place).
            cuda.syncthreads()
            t_next = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi)
            if t_next < t_end:  # prefetch the next tile while this one is used
                k0n = kstart + t_next * BLOCK_N
                issue_tile(smk, sb, 1 - buf, storage, block_table, page_size, b, k0n,
                           min(k0n + BLOCK_N, kend), warp, lane)

            # -- partial scores: lane = key, warp w sums its slice of the 576 dims --
            for ii in range(block_m):
                s_acc[ii] = 0.0
            for wd in range(warp * WORDS_PER_WARP, (warp + 1) * WORDS_PER_WARP):
                if packed:
                    k_lo, k_hi = unpack(ptx.lds32(smk, sb + 4 * (kb + lane * STRIDE + wd)))
                    for mq in range(MQ):
                        q0, q1, q2, q3 = ptx.lds128(smf, sb + 4 * (QT + (2 * wd) * block_m + 4 * mq))
                        s_acc[4 * mq] += q0 * k_lo
                        s_acc[4 * mq + 1] += q1 * k_lo
                        s_acc[4 * mq + 2] += q2 * k_lo
                        s_acc[4 * mq + 3] += q3 * k_lo
                        q0, q1, q2, q3 = ptx.lds128(smf, sb + 4 * (QT + (2 * wd + 1) * block_m + 4 * mq))
                        s_acc[4 * mq] += q0 * k_hi
                        s_acc[4 * mq + 1] += q1 * k_hi
                        s_acc[4 * mq + 2] += q2 * k_hi
                        s_acc[4 * mq + 3] += q3 * k_hi
                else:
                    kv = ptx.lds32(smf, sb + 4 * (kb + lane * STRIDE + wd))
                    for mq in range(MQ):
                        q0, q1, q2, q3 = ptx.lds128(smf, sb + 4 * (QT + wd * block_m + 4 * mq))
                        s_acc[4 * mq] += q0 * kv
                        s_acc[4 * mq + 1] += q1 * kv
                        s_acc[4 * mq + 2] += q2 * kv
                        s_acc[4 * mq + 3] += q3 * kv
            for ii in range(block_m):
                ptx.sts32(smf, sb + 4 * (SS + (warp * block_m + ii) * BLOCK_N + lane), s_acc[ii])
            # Wait for all eight warps' partial scores.
            cuda.syncthreads()

            # -- mask, score mod and online softmax: warp w owns rows w, w+8, ...; lane = key --
            k = k0 + lane
            for jr in range(ROWS_PER_WARP):
                m = warp + NWARPS * jr
                r = r0 + m
                i = r // H
                h = r % H
                q_pos = length - nq + i
                s = float32(NEG_INF)
                if m < nrows and k < k1:
                    s = float32(0.0)
                    for w in range(NWARPS):
                        s += ptx.lds32(smf, sb + 4 * (SS + (w * block_m + m) * BLOCK_N + lane))
                    if fold_scale:
                        # ---- apply mask (scores already in log2 units) ----
                        if cls == PARTIAL:
                            s = float32(mask_apply(s, b, h, i, q_pos, k, bias))
                    else:
                        s = s * scale
                        # ---- apply score mod (computed as the mod likes, kept in fp32) ----
                        s = float32(score_mod(s, b, h, q_pos, k))
                        # ---- apply mask ----
                        if cls == PARTIAL:
                            s = float32(mask_apply(s, b, h, i, q_pos, k, bias))
                        s = s * float32(LOG2E)
                m_old = ptx.lds32(smf, sb + 4 * (M_ + m))
                m_new = s
                for o in (16, 8, 4, 2, 1):
                    m_new = max(m_new, ptx.shfl_xor(m_new, o, tid))
                m_new = max(m_new, m_old)
                # A row with no kept key so far keeps m = -inf; exp2 then sees -inf - 0.
                m_ref = m_new if m_new != float32(NEG_INF) else float32(0.0)
                pr = math.exp2(s - m_ref)
                ptx.sts32(smf, sb + 4 * (PT + lane * block_m + m), pr)
                row_sum = pr
                for o in (16, 8, 4, 2, 1):
                    row_sum += ptx.shfl_xor(row_sum, o, tid)
                # Every lane has read m_old before lane 0 replaces it.
                ptx.syncwarp(tid)
                if lane == 0:
                    alpha = math.exp2(m_old - m_ref)
                    smf[A_ + m] = alpha
                    smf[L_ + m] = smf[L_ + m] * alpha + row_sum
                    smf[M_ + m] = m_new
            # Wait for the probabilities and the rescale factors.
            cuda.syncthreads()

            # -- O = alpha * O + P @ V, V = the tile's first 512 dims --
            for mq in range(MQ):
                a0, a1, a2, a3 = ptx.lds128(smf, sb + 4 * (A_ + 4 * mq))
                for c in range(2):
                    acc[4 * mq, c] *= a0
                    acc[4 * mq + 1, c] *= a1
                    acc[4 * mq + 2, c] *= a2
                    acc[4 * mq + 3, c] *= a3
            for n in range(BLOCK_N):
                if packed:
                    v0, v1 = unpack(ptx.lds32(smk, sb + 4 * (kb + n * STRIDE + tid)))
                else:
                    v0 = ptx.lds32(smf, sb + 4 * (kb + n * STRIDE + tid))
                    v1 = ptx.lds32(smf, sb + 4 * (kb + n * STRIDE + tid + NTHREADS))
                for mq in range(MQ):
                    p0, p1, p2, p3 = ptx.lds128(smf, sb + 4 * (PT + n * block_m + 4 * mq))
                    acc[4 * mq, 0] += p0 * v0
                    acc[4 * mq, 1] += p0 * v1
                    acc[4 * mq + 1, 0] += p1 * v0
                    acc[4 * mq + 1, 1] += p1 * v1
                    acc[4 * mq + 2, 0] += p2 * v0
                    acc[4 * mq + 2, 1] += p2 * v1
                    acc[4 * mq + 3, 0] += p3 * v0
                    acc[4 * mq + 3, 1] += p3 * v1
            buf = 1 - buf
            t = t_next

        # -- write the partition's normalised output and LSE --
        # Stage O through shared memory in the queries' space: every register index stays a
        # compile-time constant, and the global writes are whole rows.
        # Wait until every warp is done with the queries (and, when no tile was processed,
        # until the queries' stores are over: the staging below overwrites them).
        cuda.syncthreads()
        # Thread t's dims: 2t, 2t+1 (packed pairs) or t, t+256 (fp32).
        d0 = E * tid
        d1 = d0 + 1 if packed else tid + NTHREADS
        for m in range(block_m):
            ptx.sts32(smf, sb + 4 * (QT + m * D_V + d0), acc[m, 0])
            ptx.sts32(smf, sb + 4 * (QT + m * D_V + d1), acc[m, 1])
        # Wait for the staged output.
        cuda.syncthreads()
        for m in range(nrows):
            r = r0 + m
            t_row = row0 + r // H
            h = r % H
            l = smf[L_ + m]
            empty = l == 0.0  # no kept key (a NaN score gives l = NaN: not empty, NaN out)
            inv = float32(0.0) if empty else float32(1.0) / l
            for d in range(tid, D_V, NTHREADS):
                part_out[t_row, h, p, d] = smf[QT + m * D_V + d] * inv
            if tid == 0:
                part_lse[t_row, h, p] = (float32(NEG_INF) if empty
                                         else (smf[M_ + m] + math.log2(l)) * float32(LN2))

    return partition_kernel


def smem_bytes(block_m, packed):
    return layout(block_m, packed)["nbytes"]
