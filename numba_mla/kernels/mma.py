"""Stage 1 of split-K MLA decode on Hopper tensor cores (wgmma): the lockstep partition kernel,
for cp.async tiles (page sizes that are not a multiple of 64), and for TMA tiles where the
seesaw kernel (kernels/seesaw.py, the one TMA tiles take) would spill registers.

Same contract as the FMA kernel (kernels/simt.py): grid ``(P, G, B)``, block (p, g, b) owns
sequence b, query rows ``[g*64, (g+1)*64)`` (row r = query token i * H + head h) and key
partition p; it writes the partition's normalised output and natural-log LSE to the fp32
workspace, and the combine kernel merges partitions (with one partition it writes out and lse
itself: ``store`` below). 16-bit storage (bf16, fp16), and FP8 "e4m3" rows with cp.async tiles
(``fp8``): their codes converted exactly into the KV buffer, the cache's scale applied to the
scores and to the output (the scale argument is then scale + 1j * kv_scale).

Two warpgroups (256 threads); 64 query rows along M; key tiles of 64 along N.
Shared memory (bytes), Q and the KV tiles in one of two layouts, chosen when compiling:
  - TMA (``tma``: a 64-key tile never straddles pages: a contiguous cache, or pages of a
    multiple of 64 keys, tiles aligned to 64 keys): 9 boxes of 64 rows x 64 values, 8 KB
    apart, each in the 128-byte swizzled layout the copy engine writes (rows of 128 bytes;
    16-byte chunk j of row r at j ^ (r % 8)) and swizzled descriptors read;
  - cp.async (other page sizes): wgmma's no-swizzle layout of core matrices (8 rows x 16
    bytes, see ptx.py), chunk by chunk: chunk c (8 values) of row r at ``c*1024 + r*16``.
    Q    [64 rows x 576]            loaded once (with the first tile)
    KV   [2][64 keys x 576]         double buffer: the next tile is copied while this one is
                                    used (TMA: completing on the buffer's mbarrier)
    P    [64 rows x 64 keys]        probabilities, 16-bit, K-major (keys along K)
    red  [2][2][64] f32             per-warpgroup row maxima and row sums, exchanged
    bars [2] mbarrier               one per KV buffer (TMA)
    (at the end, the output is staged as fp32 [64][512] over the KV buffers)
Per tile:
  1. S = Q K^T: warpgroup w computes the 64 rows x its 32 keys (36 wgmma m64n32k16 over 576);
  2. mask / score mod on the fragment; row maxima exchanged between the warpgroups through
     ``red``, so both keep the same running max (a reference that moves only when the max
     passes it by more than RESCALE_SLACK); P = exp2(S - max) written to shared memory in
     16 bits, and the row sums taken over P as written;
  3. O = alpha * O + P V (alpha = 1, no rescale, while the reference stays): warpgroup w
     owns output dims [256w, 256w+256) (4 wgmma m64n256k16 over the 64 keys), V read from
     the same tile as K: viewed MN-major (wgmma transposes it).
Each warpgroup keeps the running sum over its own keys; the two are added at the end.
With TMA, step 1 of the next tile is issued behind step 3, and each warpgroup refills the
boxes its own P V read once its four warps are past that wait (a named barrier: a wait covers
only its own warp's share of the product); with cp.async, the next tile's copies go out under
step 1 and step 3 is waited for at the end of the tile.
"""
import math

from numba import cuda, float32, int32, uint64

from .. import ptx
from .._compat import INLINE, JIT_OPTIONS
from .common import (D_QK, D_V, LN2, LOG2E, NEG_INF, make_log2_score, make_partition_walk,
                     make_tile_run, make_tile_walk, mark_empty)

BLOCK_M = 64  # query rows per block: wgmma's M
BLOCK_N = 64  # keys per tile
NTHREADS = 256  # two warpgroups
KEYS_PER_WG = BLOCK_N // 2  # score columns of one warpgroup: wgmma N
DIMS_PER_WG = D_V // 2  # output columns of one warpgroup: wgmma N
CHUNKS = D_QK // 8  # 16-byte chunks in a row
COL_BYTES = BLOCK_M * 16  # one chunk of 64 rows: the step between chunks (1024)
BOX = 64  # TMA: values per box row (128 bytes, swizzled)
BOX_BYTES = BLOCK_M * BOX * 2  # one box of 64 rows (8192)
NBOX = D_QK // BOX  # boxes per 576-wide operand (9)
ROWS_BYTES = BLOCK_M * D_QK * 2  # one 64-row operand (73728)
P_GROUP = 8 * BLOCK_N * 2  # 8 rows of P (1024)
# The output staged in shared memory before its global writes: fp32 rows of D_V + 8 floats
# (2080 bytes: the 32 bytes of padding put the 8 rows a warp's fragment store covers in
# different banks, ptx.acc_store)
O_PITCH = D_V + 8
O_BYTES = BLOCK_M * O_PITCH * 4  # 133120
Q_OFF = 0
KV_OFF = ROWS_BYTES
P_OFF = KV_OFF + 2 * ROWS_BYTES
RED_OFF = P_OFF + BLOCK_M * BLOCK_N * 2
BAR_OFF = RED_OFF + 2 * 2 * BLOCK_M * 4
SMEM_BYTES = BAR_OFF + 2 * 8  # 230416 of the H200's 232448
# cp.async copies of a 64-row operand: thread t copies rows 8*g + t%8 (g = 0..7) at chunks
# t//8 + 32*j: eight consecutive threads fill one core matrix (8 rows, one chunk), so the
# shared-memory writes are free of bank conflicts and each warp reads 64 contiguous bytes of
# 8 rows.
CHUNK_STEP = NTHREADS // 8  # 32
RESCALE_SLACK = 8.0  # log2 units the running max may lag the true one (see the softmax)
# FP8 rows ("e4m3": 576 codes; cp.async tiles only): one KV buffer, and two stages of the next
# tiles' rows as they are, 592 bytes apart (576 + 16: the 8-byte reads of 8 rows at one
# column fall in 8 different groups of 4 banks), converted into the KV buffer at the top of
# each tile, each warpgroup its own keys' rows, a group of dims at a time under the S steps
# of the group before. Then P, red; no mbarriers. The output is staged over Q and KV.
RAW_PITCH = 592
RAW_BYTES = BLOCK_N * RAW_PITCH  # one stage (37888)
FP8_RAW_OFF = KV_OFF + ROWS_BYTES
FP8_P_OFF = FP8_RAW_OFF + 2 * RAW_BYTES
FP8_RED_OFF = FP8_P_OFF + BLOCK_M * BLOCK_N * 2
FP8_SMEM_BYTES = FP8_RED_OFF + 2 * 2 * BLOCK_M * 4  # 232448: all a block may take on an H200
CONVERT_BATCH = 6  # units of 8 rows x 4 chunks a thread loads before converting and storing
CONVERT_GROUPS = 3  # a tile's conversion in 3 groups of 192 dims, each followed by its S steps
RAW_PIECES = D_QK // 16  # 16-byte pieces of a raw row (36)
NS = KEYS_PER_WG // 2  # score accumulators per thread (16)
NO = DIMS_PER_WG // 2  # output accumulators per thread (128)


def smem_bytes(fp8=None):
    return FP8_SMEM_BYTES if fp8 else SMEM_BYTES


def make_partition_kernel(*, tag, locate, mask_apply, mask_classify, mask_key_range, score_mod,
                          fold_scale, heads, store, tma, key_count=None, fp8=None):
    """The stage-1 tensor-core kernel for one configuration; arguments as for the FMA kernel
    (see factory.py), ``tag`` "bf16" or "f16"; ``tma``: tiles copied by the copy engine (the
    caller makes sure a 64-key tile aligned to 64 keys lies in one page). ``store`` converts
    an output value for ``part_out``: the identity for the fp32 workspace, or the storage
    conversion when there is one partition and the kernel writes ``out [T, H, 1, 512]`` and
    ``lse [T, H, 1]`` itself (no combine)."""
    H = heads
    mma_s = ptx.wgmma(KEYS_PER_WG, tag, False)
    mma_o = ptx.wgmma(DIMS_PER_WG, tag, True)
    wait_so = ptx.wgmma_wait2(NS, NO)
    wait_o = ptx.wgmma_wait(NO)
    if tma:  # 128-byte swizzled boxes of 64 rows x 64 values, 8 KB apart
        desc_rows = ptx.wgmma_desc(16, 1024, True)  # Q, K: K-major; 8-row atoms 1 KB apart
        desc_v = ptx.wgmma_desc(BOX_BYTES, 1024, True)  # V: MN-major; 64 dims a box, 8 keys 1 KB
    else:
        desc_rows = ptx.wgmma_desc(COL_BYTES, 128)  # K-major; chunks (K) 1 KB apart, 8 rows 128 B
        desc_v = ptx.wgmma_desc(128, COL_BYTES)  # MN-major; 8 keys (K) 128 B apart, chunks (N) 1 KB
    desc_p = ptx.wgmma_desc(128, P_GROUP)  # P: K-major, 64 keys a row
    pack = ptx.pack_bf16x2 if tag == "bf16" else ptx.pack_f16x2
    unpack = ptx.bf16x2_to_f32 if tag == "bf16" else ptx.f16x2_to_f32
    zero_o = ptx.acc_zero(NO)
    scale_o = ptx.acc_scale(NO)
    store_o = ptx.acc_store(NO)
    write_rows = make_write_rows(store, heads)
    log2_score = make_log2_score(mask_apply, score_mod, fold_scale)
    key_tiles, next_tile = make_tile_walk(mask_classify, mask_key_range, BLOCK_N, heads,
                                          align=BLOCK_N if tma else 1, key_count=key_count)
    first_tiles = make_partition_walk(key_tiles, next_tile)
    tile_run = make_tile_run(locate)
    tma_box = ptx.tma_load(BLOCK_M, BOX, True)
    FP8 = fp8 is not None
    assert not FP8 or (fp8 == "e4m3" and not tma)
    # FP8: P and red after the raw stages; the output staged over Q and KV (KV's 2 buffers
    # otherwise)
    P_AT, RED_AT, O_AT = (FP8_P_OFF, FP8_RED_OFF, Q_OFF) if FP8 else (P_OFF, RED_OFF, KV_OFF)
    SUMS_AT = O_AT + O_BYTES  # [2][64] f32 after the staged output (Q, KV hold it)
    assert SUMS_AT + 2 * BLOCK_M * 4 <= O_AT + 2 * ROWS_BYTES
    e4m3x4_to_16 = ptx.e4m3x4_to_bf16x4 if tag == "bf16" else ptx.e4m3x4_to_f16x4
    UNITS = BLOCK_N // 8 * CHUNKS // 4 // (NTHREADS // 32)  # a warp's units of a tile (18)
    UG = UNITS // CONVERT_GROUPS  # ... of a group (6)
    KG = CHUNKS // 2 // CONVERT_GROUPS  # S's k16 steps over a group's dims (12)
    assert UG * CONVERT_GROUPS == UNITS and UG % CONVERT_BATCH == 0 and CONVERT_GROUPS == 3

    @cuda.jit(device=True)
    def issue_raw(smk, dst, storage, block_table, page_size, b, k0, k1, page, slot, run, tid):
        """Start copying the FP8 rows of keys [k0, k1) as they are into the raw stage at
        byte ``dst`` (zeros past k1; RAW_PITCH bytes a row); ``page, slot, run``: tile_run's
        answer for them, looked up ahead by the caller. Warpgroup w copies the rows of
        its own keys, 32w + 8g + t % 8 (g = 0..3; t its thread), so that it alone waits for
        them and refills them: thread t copies 16-byte pieces t // 8, 16 + t // 8 and
        (t // 8 < 4) 32 + t // 8 of each (36 pieces a row; eight consecutive threads write 8
        rows' pieces into 8 different groups of banks)."""
        pgs = cuda.local.array(4, int32)
        sls = cuda.local.array(4, int32)
        npages = storage.shape[0]
        wtid = tid % 128
        n0 = KEYS_PER_WG * (tid // 128) + wtid % 8
        for g in range(4):  # (one lookup a row only where the tile is not one page's run)
            n = min(n0 + 8 * g, k1 - 1 - k0)
            if run:
                pgs[g], sls[g] = page, slot + n
            else:
                pgs[g], sls[g] = locate(block_table, page_size, npages, b, k0 + n)
        c = wtid // 8
        for g in range(4):
            n = n0 + 8 * g
            row = ptx.global_addr(storage, pgs[g], sls[g], 0)
            for j in range(3):
                if j < 2 or c < RAW_PIECES - 32:
                    ptx.cp_async16_at(smk, dst + n * RAW_PITCH + 16 * (c + 16 * j),
                                      row + 16 * (c + 16 * j), k0 + n < k1)
        ptx.cp_async_commit()

    @cuda.jit(device=True)
    def convert_raw(smk, raw, kv, tid, group):
        """The raw stage at byte ``raw`` into the KV buffer at ``kv`` as 16-bit values (the
        codes exactly, in the no-swizzle layout: chunk c of 8 values of row n at
        c*1024 + n*16), the chunks of ``group`` (24 of the 72) of this warp's rows: warp w
        converts rows 8w..8w+7 (so warpgroup w its own keys' rows) a unit of 8 rows x 4 chunks
        at a time, lane l row l % 8 and chunk l // 8 of it (an 8-byte load of 8 codes, a
        16-byte store): the loads of each half warp and the stores of each quarter warp meet
        no bank conflict. CONVERT_BATCH units' loads go out before their conversions and
        stores (shared-memory accesses keep their order)."""
        warp, lane = tid // 32, tid % 32
        lo = cuda.local.array(CONVERT_BATCH, int32)
        hi = cuda.local.array(CONVERT_BATCH, int32)
        # Unit u of warp w: rows 8w + lane % 8 (the same every unit), chunk 4u + lane // 8; its
        # addresses are the thread's first plus constants.
        n = 8 * warp + lane % 8
        src = raw + n * RAW_PITCH + 8 * (lane // 8)
        dst = kv + (lane // 8) * COL_BYTES + n * 16
        for u0 in range(group * UG, (group + 1) * UG, CONVERT_BATCH):
            for j in range(CONVERT_BATCH):
                lo[j], hi[j] = ptx.lds64(smk, src + 32 * (u0 + j))
            for j in range(CONVERT_BATCH):
                a0, a1 = e4m3x4_to_16(lo[j])
                a2, a3 = e4m3x4_to_16(hi[j])
                ptx.sts128(smk, dst + 4 * COL_BYTES * (u0 + j), a0, a1, a2, a3)

    @cuda.jit(device=True, **INLINE)
    def convert_and_score(smk, raw, kv, dq, dk, s_acc, tid, group):
        """Group ``group`` of this warpgroup's rows converted (convert_raw), then S's steps
        over its dims issued, not waited for: the tensor cores run them while the warpgroup
        converts the next group. A group's rows are its own four warps', so a warpgroup
        barrier suffices."""
        convert_raw(smk, raw, kv, tid, group)
        ptx.fence_proxy_async()
        ptx.bar_sync(1 + tid // 128, 128)  # the warpgroup's rows of the group are in place
        for kk in range(group * KG, (group + 1) * KG):
            mma_s(s_acc, smk, ptx.desc_advance(dq, 2 * COL_BYTES * kk),
                  ptx.desc_advance(dk, 2 * COL_BYTES * kk), kk, tid % 128)

    @cuda.jit(device=True)
    def copy_row(smk, dst, row, valid, tid):
        """Start copying this thread's chunks (tid//8 + 32j) of one 576-wide row at global
        address ``row`` to the row's place at ``dst`` (zeros when not ``valid``): two full
        rounds, then the 8 chunks past 64 by the first 64 threads."""
        c = tid // 8
        for j in range(CHUNKS // CHUNK_STEP):
            ptx.cp_async16_at(smk, dst + COL_BYTES * (c + CHUNK_STEP * j),
                              row + 16 * (c + CHUNK_STEP * j), valid)
        if c < CHUNKS % CHUNK_STEP:
            j = CHUNKS // CHUNK_STEP
            ptx.cp_async16_at(smk, dst + COL_BYTES * (c + CHUNK_STEP * j),
                              row + 16 * (c + CHUNK_STEP * j), valid)

    @cuda.jit(device=True)
    def issue_tile(smk, dst, storage, block_table, page_size, b, k0, k1, tid):
        """Start copying keys [k0, k1) into the KV buffer at byte ``dst`` (zeros past k1).
        The thread's eight rows are located first, without branches (so the division by the
        page size shares its reciprocal): their page-table loads are independent and go out
        together, before the copies (asm statements the loads cannot move across)."""
        pgs = cuda.local.array(8, int32)
        sls = cuda.local.array(8, int32)
        npages = storage.shape[0]
        for g in range(8):  # rows past k1 read key k1 - 1's place (a real one) but copy zeros
            pgs[g], sls[g] = locate(block_table, page_size, npages, b,
                                    min(k0 + 8 * g + tid % 8, k1 - 1))
        for g in range(8):
            copy_row(smk, dst + (8 * g + tid % 8) * 16,
                     ptx.global_addr(storage, pgs[g], sls[g], 0), k0 + 8 * g + tid % 8 < k1, tid)

    @cuda.jit(device=True)
    def tma_rows(smk, dst, tmap, src, row, bar, tid):
        """Copy 64 rows from ``row`` of ``src`` (seen as [rows, 576]) by 9 swizzled boxes of
        64 values, completing on the mbarrier ``bar`` (thread 0 announced the bytes before a
        block barrier that precedes this). Lane 0 of warp j of warpgroup w copies box 4w + j
        (the dims its warpgroup's P V reads), lane 1 of warp 0 the last box (dims 512..575):
        a warpgroup may refill a buffer once its own P V is done with it."""
        lane = tid % 32
        j = tid % 128 // 32
        if lane == 0 or (lane == 1 and tid < 32):
            box = 4 * (tid // 128) + j if lane == 0 else NBOX - 1
            tma_box(smk, dst + BOX_BYTES * box, tmap, src, BOX * box, row, bar)

    @cuda.jit(device=True)
    def tile_row(block_table, page_size, npages, b, k0):
        """The row of ``storage`` (seen as [pages * page_size, 576]) holding key k0: a 64-key
        tile aligned to 64 keys lies in one page, so its rows follow."""
        pg, sl = locate(block_table, page_size, npages, b, k0)
        return pg * page_size + sl

    @cuda.jit(device=True)
    def zero_rows(smk, dst, n0, tid):
        """Zero rows [n0, 64) of the TMA tile at ``dst`` (whole 128-byte rows of each box: the
        swizzle stays within a row): keys past the partition's end (cache slots that may hold
        anything, NaN included)."""
        for i in range(tid, (BLOCK_N - n0) * NBOX * 32, NTHREADS):
            box = (i // 32) % NBOX
            n = n0 + i // (32 * NBOX)
            ptx.sts32(smk, dst + BOX_BYTES * box + 128 * n + 4 * (i % 32), 0)

    @cuda.jit(**JIT_OPTIONS)
    def partition_kernel(q, q_offsets, storage, block_table, lengths, bias, scale, chunk,
                         part_out, part_lse, tmap_q, tmap_kv):
        # q [T, H, 288] and storage [pages, page_size, 288]: int32 words of 16-bit pairs;
        # tmap_q, tmap_kv: their tensor maps (TMA; unused otherwise).
        p = cuda.blockIdx.x
        nparts = cuda.gridDim.x
        b = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        wg = ptx.warp_uniform(tid // 128, tid)  # warpgroup (uniform: see the descriptors)
        wtid = tid % 128  # thread in the warpgroup
        lane = tid % 32
        smk = cuda.shared.array(0, int32)  # the dynamic shared memory, as 4-byte words
        smf = cuda.shared.array(0, float32)  # ... and as floats
        sb = ptx.smem_addr(smk)

        row0 = q_offsets[b]
        nq = q_offsets[b + 1] - row0
        length = lengths[b]
        page_size = storage.shape[1]
        npages = storage.shape[0]
        r0 = cuda.blockIdx.y * BLOCK_M
        nrows = min(BLOCK_M, nq * H - r0)
        if nrows <= 0:
            return

        q_lo, q_hi, kstart, kend, t, t_end = first_tiles(length, nq, r0, nrows, p, nparts,
                                                            chunk)
        if t >= t_end and nparts > 1:  # (one partition writes out itself: zeros, below)
            mark_empty(part_lse, row0, r0, nrows, p, H, tid, NTHREADS)
            return  # uniform in the block, before any barrier
        bars = sb + BAR_OFF  # the mbarriers of KV buffers 0 and 1 (8 bytes each)
        if tma:
            if tid == 0:
                ptx.mbar_init(smk, bars, 1)
                ptx.mbar_init(smk, bars + 8, 1)
                ptx.mbar_fence_init()
                if t < t_end:  # the queries and the first tile arrive on buffer 0's barrier,
                    ptx.mbar_expect_tx(smk, bars, 2 * ROWS_BYTES)
                    if next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi) < t_end:
                        ptx.mbar_expect_tx(smk, bars + 8, ROWS_BYTES)  # the second on 1's
            cuda.syncthreads()
        if t < t_end:  # the queries and the first tile, in one group
            k0 = kstart + t * BLOCK_N
            if tma:
                # the queries: rows row0*H + r0 ... of q seen as [T*H, 576]
                tma_rows(smk, sb + Q_OFF, tmap_q, q, row0 * H + r0, bars, tid)
                tma_rows(smk, sb + KV_OFF, tmap_kv, storage,
                         tile_row(block_table, page_size, npages, b, k0), bars, tid)
            else:
                for g in range(8):
                    n = 8 * g + tid % 8
                    valid = n < nrows
                    r = r0 + n if valid else r0
                    copy_row(smk, sb + Q_OFF + n * 16,
                             ptx.global_addr(q, row0 + r // H, r % H, 0), valid, tid)
                if FP8:  # the first two tiles' rows, one group each (an empty one if none)
                    k1f = min(k0 + BLOCK_N, kend)
                    pg, sl, run = tile_run(block_table, page_size, npages, b, k0, k1f)
                    issue_raw(smk, sb + FP8_RAW_OFF, storage, block_table, page_size, b, k0, k1f,
                              pg, sl, run, tid)
                    t_second = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi)
                    if t_second < t_end:
                        k0s = kstart + t_second * BLOCK_N
                        k1s = min(k0s + BLOCK_N, kend)
                        pg, sl, run = tile_run(block_table, page_size, npages, b, k0s, k1s)
                        issue_raw(smk, sb + FP8_RAW_OFF + RAW_BYTES, storage, block_table,
                                  page_size, b, k0s, k1s, pg, sl, run, tid)
                    else:
                        ptx.cp_async_commit()
                else:
                    issue_tile(smk, sb + KV_OFF, storage, block_table, page_size, b, k0,
                               min(k0 + BLOCK_N, kend), tid)
                    ptx.cp_async_commit()

        # This thread's two rows of every fragment ("halves"): m = 16*warp + lane//4 (+ 8).
        m_run = cuda.local.array(2, float32)  # running max, log2 units
        l_run = cuda.local.array(2, float32)  # running sum over this warpgroup's keys
        l_p = cuda.local.array(2, float32)  # FP8: ... of P as multiplied (16-bit): the output's
        alpha = cuda.local.array(2, float32)
        mx = cuda.local.array(2, float32)  # this tile's row maxima
        for half in range(2):
            m_run[half] = float32(NEG_INF)
            l_run[half] = float32(0.0)
            l_p[half] = float32(0.0)
        s_acc = cuda.local.array(NS, float32)
        o_acc = cuda.local.array(NO, float32)
        zero_o(o_acc)
        sm_scale, kv_scale = float32(scale.real), float32(scale.imag)
        folded = kv_scale if FP8 else float32(1.0)  # FP8: the scale the tiles leave out
        qscale = float32(sm_scale * LOG2E)
        dq = desc_rows(sb + Q_OFF)  # the queries' and P's descriptors (advanced by constants)
        dp = desc_p(sb + P_AT)

        buf = 0
        fs = 0  # FP8: this tile's raw stage (bytes from the first)
        phases = 0  # bit i: parity of KV buffer i's next mbarrier phase
        # No wgmma wait sits in a run-time branch that rejoins, and the loop is left only by
        # its break, after the last wait: at a join where one path waited for a product and
        # another did not, ptxas waits for every product in flight (before: a full wait at the
        # end of every tile, which undid the overlap of P V with the next S; 15% of the
        # stall samples on 64x128x4096).
        if t < t_end:
            while True:
                k0 = kstart + t * BLOCK_N
                k1 = min(k0 + BLOCK_N, kend)
                cls = mask_classify(k0, k1, q_lo, q_hi)
                kv = sb + KV_OFF + buf * ROWS_BYTES  # (FP8: one buffer, buf stays 0)
                t_next = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi)
                k0n = kstart + t_next * BLOCK_N
                if tma and t_next < t_end:  # looked up now: the load's latency hides under S
                    row_next = tile_row(block_table, page_size, npages, b, k0n)
                if tma:
                    while not ptx.mbar_try_wait(smk, bars + 8 * buf, (phases >> buf) & 1):
                        pass
                    phases ^= 1 << buf
                    if k1 - k0 < BLOCK_N:
                        zero_rows(smk, kv, k1 - k0, tid)
                elif FP8:
                    # The tile after the next (its rows are copied once this one is converted)
                    # looked up now: the page-table loads' latency hides under the conversion.
                    t_after = t_end
                    if t_next < t_end:
                        t_after = next_tile(t_next + 1, t_end, kstart, kend, q_lo, q_hi)
                    k0a = kstart + t_after * BLOCK_N
                    k1a = min(k0a + BLOCK_N, kend)
                    pga, sla, runa = 0, 0, False
                    if t_after < t_end:
                        pga, sla, runa = tile_run(block_table, page_size, npages, b, k0a, k1a)
                    ptx.cp_async_wait_one()  # this tile's rows (the next tile's may fly)
                    # Every thread's pieces of them (and, the first time, of Q) are in place,
                    # and every warpgroup is done with the KV buffer (its P V waited for at
                    # the end of the last tile).
                    cuda.syncthreads()
                else:
                    ptx.cp_async_wait_all()
                if not FP8 and (not tma or k1 - k0 < BLOCK_N):
                    ptx.fence_proxy_async()
                    # This tile's copies (cp.async) or zeroed rows are visible to every thread
                    # (a TMA tile is, through its mbarrier).
                    cuda.syncthreads()

                # -- S = Q K^T over this warpgroup's 32 keys; with TMA, issued behind the previous
                # tile's P V (the tensor cores run both back to back; the wait covers both) --
                ptx.wgmma_fence()
                # (descriptors built once a tile and advanced by constants: issuing 36
                # products must not cost more than the tensor cores take to run them)
                if FP8:
                    # The warpgroup converts its own keys' rows a group of 192 dims at a time
                    # and issues that group's steps: the tensor cores multiply one group while
                    # the next is converted.
                    # (Three calls, not a loop: each group's steps are then constants.)
                    dk = desc_rows(kv + wg * KEYS_PER_WG * 16)
                    raw = sb + FP8_RAW_OFF + fs
                    convert_and_score(smk, raw, kv, dq, dk, s_acc, tid, 0)
                    convert_and_score(smk, raw, kv, dq, dk, s_acc, tid, 1)
                    convert_and_score(smk, raw, kv, dq, dk, s_acc, tid, 2)
                    ptx.wgmma_commit()
                    # The rows of the tile after the next into the stage just converted (the
                    # warpgroup's own rows of it: its last barrier follows their conversion).
                    if t_after < t_end:
                        issue_raw(smk, raw, storage, block_table, page_size, b, k0a, k1a, pga,
                                  sla, runa, tid)
                    else:
                        ptx.cp_async_commit()  # (empty: one wait_group 1 fits every tile)
                    fs = RAW_BYTES - fs
                elif tma:  # K step kk: box kk // 4, 32 bytes a step within its rows
                    dk = desc_rows(kv + wg * KEYS_PER_WG * 128)
                    for box in range(NBOX):
                        for j in range(BOX // 16):
                            step = BOX_BYTES * box + 32 * j
                            mma_s(s_acc, smk, ptx.desc_advance(dq, step),
                                  ptx.desc_advance(dk, step), box + j, wtid)
                    ptx.wgmma_commit()
                else:
                    dk = desc_rows(kv + wg * KEYS_PER_WG * 16)
                    for kk in range(CHUNKS // 2):
                        mma_s(s_acc, smk, ptx.desc_advance(dq, 2 * COL_BYTES * kk),
                              ptx.desc_advance(dk, 2 * COL_BYTES * kk), kk, wtid)
                    ptx.wgmma_commit()
                if not tma and not FP8 and t_next < t_end:  # cp.async: copies under the product
                    issue_tile(smk, sb + KV_OFF + (1 - buf) * ROWS_BYTES, storage, block_table,
                               page_size, b, k0n, min(k0n + BLOCK_N, kend), tid)
                    ptx.cp_async_commit()
                wait_so(s_acc, o_acc)
                if tma and t_next < t_end:
                    # A wait covers its own warp's share of the warpgroup's products: once all four
                    # warps are past theirs, this warpgroup's P V is done with the other buffer.
                    ptx.bar_sync(1 + wg, 128)
                    tma_rows(smk, sb + KV_OFF + (1 - buf) * ROWS_BYTES, tmap_kv, storage, row_next,
                             bars + 8 * (1 - buf), tid)

                # -- mask and score mod; row maxima (log2 units); the row's indices are recomputed
                # here rather than kept across the loop (registers are scarce beside O) --
                for half in range(2):
                    m = ptx.acc_row(2 * half, wtid)
                    r = r0 + m
                    iq = r // H
                    h = r - iq * H
                    q_pos = length - nq + iq
                    row_max = float32(NEG_INF)
                    for j in range(NS // 4):
                        for e in range(2):
                            i = 4 * j + 2 * half + e
                            k = k0 + KEYS_PER_WG * wg + ptx.acc_col(i, wtid)
                            s = float32(NEG_INF)
                            if m < nrows and k < k1:
                                s = log2_score(s_acc[i] * folded, qscale, sm_scale, cls, b, h,
                                               iq, q_pos, k, bias)
                            s_acc[i] = s
                            row_max = max(row_max, s)
                    for o in (1, 2):  # the four lanes of a quad share a row
                        row_max = max(row_max, ptx.shfl_xor(row_max, o, tid))
                    mx[half] = row_max
                if lane % 4 == 0:
                    smf[RED_AT // 4 + wg * BLOCK_M + ptx.acc_row(0, wtid)] = mx[0]
                    smf[RED_AT // 4 + wg * BLOCK_M + ptx.acc_row(2, wtid)] = mx[1]
                # The tile after next will land in this buffer: announced before the barrier
                # below, which every copy into it follows and every wait for this tile precedes.
                if tma and tid == 0 and t_next < t_end:
                    if next_tile(t_next + 1, t_end, kstart, kend, q_lo, q_hi) < t_end:
                        ptx.mbar_expect_tx(smk, bars + 8 * buf, ROWS_BYTES)
                # Both warpgroups' maxima are in place.
                cuda.syncthreads()

                # -- online softmax: both warpgroups compute the same new max per row --
                for half in range(2):
                    m = ptx.acc_row(2 * half, wtid)
                    m_old = m_run[half]
                    m_new = max(m_old, max(smf[RED_AT // 4 + m], smf[RED_AT // 4 + BLOCK_M + m]))
                    # The reference max moves only when the row's max passes it by more than
                    # RESCALE_SLACK (or it was -inf, or the max is NaN): P then stays below
                    # 2^RESCALE_SLACK (exact either way: O, the sum and the LSE all use the
                    # reference), and most tiles leave O unscaled.
                    if not (m_new <= m_old + float32(RESCALE_SLACK)):
                        m_run[half] = m_new
                    m_ref = m_run[half] if m_run[half] != float32(NEG_INF) else float32(0.0)
                    alpha[half] = math.exp2(m_old - m_ref)
                    l_run[half] *= alpha[half]
                    if FP8:
                        l_p[half] *= alpha[half]
                    for j in range(NS // 4):
                        i = 4 * j + 2 * half
                        p0 = math.exp2(s_acc[i] - m_ref)
                        p1 = math.exp2(s_acc[i + 1] - m_ref)
                        l_run[half] += p0 + p1
                        word = pack(p0, p1)
                        if FP8:
                            # The output's sum counts P as P V multiplies it, rounded to 16
                            # bits: the output is then a mean of V under weights that sum to
                            # one. (With the reference max lagging, even the largest P is
                            # rounded; the fp32 sum left a dominant key's rounding in the
                            # output.) The LSE keeps the fp32 sum. (16-bit rows: not done, the
                            # two registers spill there with some masks.)
                            w0, w1 = unpack(word)
                            l_p[half] += w0 + w1
                        n = KEYS_PER_WG * wg + ptx.acc_col(i, wtid)
                        ptx.sts32(smk, sb + P_AT + (m // 8) * P_GROUP + (n // 8) * 128
                                  + (m % 8) * 16 + (n % 8) * 2, word)
                if alpha[0] != float32(1.0) or alpha[1] != float32(1.0):  # per lane: a warp
                    scale_o(o_acc, alpha[0], alpha[1])  # skips it when none of its rows moved
                ptx.fence_proxy_async()
                # P is complete (both warpgroups' keys).
                cuda.syncthreads()

                # -- O += P V over this warpgroup's 256 dims --
                ptx.wgmma_fence()
                if tma:  # this warpgroup's 4 boxes; 16 keys = 2 groups of 8 rows
                    dv = desc_v(kv + wg * (DIMS_PER_WG // BOX) * BOX_BYTES)
                    for kk in range(BLOCK_N // 16):
                        mma_o(o_acc, smk, ptx.desc_advance(dp, 256 * kk),
                              ptx.desc_advance(dv, 2048 * kk), 1, wtid)
                else:
                    dv = desc_v(kv + wg * (DIMS_PER_WG // 8) * COL_BYTES)
                    for kk in range(BLOCK_N // 16):
                        mma_o(o_acc, smk, ptx.desc_advance(dp, 256 * kk),
                              ptx.desc_advance(dv, 256 * kk), 1, wtid)
                ptx.wgmma_commit()
                if not tma:
                    wait_o(o_acc)
                if t_next >= t_end:
                    if tma:  # (else waited for under the next tile's S)
                        wait_o(o_acc)
                    break
                if not FP8:
                    buf = 1 - buf
                t = t_next

        # -- the row sums of both warpgroups, then the partition's output and LSE --
        for half in range(2):
            lsum = l_run[half]
            psum = l_p[half]
            for o in (1, 2):
                lsum += ptx.shfl_xor(lsum, o, tid)
                if FP8:
                    psum += ptx.shfl_xor(psum, o, tid)
            l_run[half] = lsum
            l_p[half] = psum
        # Every warpgroup is done with the last tile: its buffers take the staged output.
        cuda.syncthreads()
        # Stage O (fp32, row-major [64][512], rows O_PITCH floats apart) over the KV buffers,
        # so the global writes below are whole rows; the running max and both warpgroups' sums
        # go to ``red``, their sums of P as multiplied after the staged output (SUMS_AT).
        store_o(o_acc, smf, sb + O_AT + 4 * (ptx.acc_row(0, wtid) * O_PITCH + DIMS_PER_WG * wg
                                               + ptx.acc_col(0, wtid)), 4 * O_PITCH)
        if lane % 4 == 0:
            for half in range(2):
                m = ptx.acc_row(2 * half, wtid)
                smf[RED_AT // 4 + (2 + wg) * BLOCK_M + m] = l_run[half]
                if FP8:
                    smf[SUMS_AT // 4 + wg * BLOCK_M + m] = l_p[half]
                if wg == 0:
                    smf[RED_AT // 4 + m] = m_run[half]
        # The staged output, maxima and sums are in place.
        cuda.syncthreads()
        # One thread a row: the row's LSE, and 1/sum (FP8: of P as multiplied; 0 for a row without
        # kept keys; NaN scores give NaN, not empty) in place of warpgroup 0's sum, for the
        # stores below.
        if tid < nrows:
            r = r0 + tid
            lsum = smf[RED_AT // 4 + 2 * BLOCK_M + tid] + smf[RED_AT // 4 + 3 * BLOCK_M + tid]
            psum = lsum
            if FP8:
                psum = smf[SUMS_AT // 4 + tid] + smf[SUMS_AT // 4 + BLOCK_M + tid]
            empty = lsum == 0.0
            part_lse[row0 + r // H, r % H, p] = (
                float32(NEG_INF) if empty
                else (smf[RED_AT // 4 + tid] + math.log2(lsum)) * float32(LN2))
            smf[RED_AT // 4 + 2 * BLOCK_M + tid] = (float32(0.0) if empty
                                                     else folded * ptx.rcp(psum))
        # Every row's 1/sum is in place.
        cuda.syncthreads()
        write_rows(part_out, smf, sb, O_AT, RED_AT // 4 + 2 * BLOCK_M, row0, r0, nrows, p, tid)

    return partition_kernel


def make_write_rows(store, heads):
    """``write_rows(part_out, smf, sb, o_at, inv_at, row0, r0, nrows, p, tid)``, both
    tensor-core kernels' last step: the block's staged output (fp32 rows O_PITCH floats apart
    from shared byte offset ``o_at``), row m times its 1/sum ``smf[inv_at + m]``, ``store``d
    into ``part_out[t, h, p]`` for the block's rows ``r0 + m`` of sequence rows from ``row0``.

    A warp a row (rows w, w + 8, ...): each row's index arithmetic is done by one warp, not by
    all eight. A lane reads 4 floats in one load and stores them in one 8- or 16-byte store, a
    warp's store 256 or 512 contiguous bytes; where ``part_out`` (a caller's ``out``) does not
    start aligned for that, an element a store. Unsigned indices: no negative-index
    wrap-around code."""
    H = heads

    @cuda.jit(device=True)
    def write_rows(part_out, smf, sb, o_at, inv_at, row0, r0, nrows, p, tid):
        lane = tid % 32
        x4 = ptx.aligned_x4(part_out)
        for m in range(tid // 32, nrows, NTHREADS // 32):
            r = uint64(r0 + m)
            t_row = uint64(row0) + r // uint64(H)
            h = r % uint64(H)
            inv = smf[uint64(inv_at + m)]
            if x4:
                for j in range(D_V // 128):
                    d = 4 * lane + 128 * j
                    y0, y1, y2, y3 = ptx.lds128(smf, sb + o_at + 4 * (m * O_PITCH + d))
                    ptx.st_global_x4(part_out, t_row, h, uint64(p), uint64(d), store(y0 * inv),
                                     store(y1 * inv), store(y2 * inv), store(y3 * inv))
            else:
                src = uint64(o_at // 4 + m * O_PITCH)
                for j in range(D_V // 32):
                    d = uint64(lane + 32 * j)
                    part_out[t_row, h, uint64(p), d] = store(smf[src + d] * inv)

    return write_rows
