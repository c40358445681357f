"""Stage 1 of split-K (flash-decoding) MLA decode on plain FMA units: the partition kernel.

Notation
--------
- A query *row* is one (query token i, head h) pair of one sequence, numbered r = i * H + h;
  a sequence with n query tokens has R = n * H rows.
- Grid ``(P, G, B)``: block (p, g, b) owns sequence b, rows ``[g*BLOCK_M, (g+1)*BLOCK_M)`` and
  key partition p of P. The kept-key range of the block's queries, ``[kstart, kend)``, is cut
  into key tiles of BLOCK_N keys (``block_n``: 64 at 16 rows of 16-bit data, else 32);
  partition p walks a contiguous run of those tiles, skipping the ones the mask drops entirely.
- 8 warps (256 threads). A cache row is 576 values = ROW_WORDS 4-byte *words* (288 packed
  bf16/fp16 pairs, or 576 fp32). Shared memory (4-byte words):
      Qt [576][BLOCK_M]             queries in fp32, transposed: the BLOCK_M rows of one dim
                                    are adjacent, so one 16-byte load gives four rows
      Pt [BLOCK_N][BLOCK_M]         probabilities of the current tile, transposed likewise
      Ss [8][BLOCK_M][BLOCK_N]      each warp's partial scores over its eighth of the dims
                                    (key columns swizzled by row group: see below)
      m, l, alpha [BLOCK_M]         running max (log2 units), running sum, this tile's rescale
      Ks [2][BLOCK_N][KV_STRIDE]    two KV tiles (double buffer) in storage format: the next
                                    tile is copied asynchronously (cp.async, 16-byte pieces,
                                    a few each P.V loop trip) while this one is used. Rows are
                                    16-byte aligned (4 words of padding), which also puts
                                    consecutive keys 4 banks apart.
  or, where ``staged`` (32 rows of 16-bit data), one copy buffer Ks [BLOCK_N][KV_STRIDE] and
      Kf [BLOCK_N][580]             the tile in fp32, so that the inner loops read floats (no
                                    unpacking in them): each warp converts the slice of the
                                    dims its scores read, a piece each score loop trip, two
                                    pieces ahead of its use.

Register tiling
---------------
An FMA unit does one multiply-add per operand it is fed; shared memory feeds far fewer
operands per clock than the FMA units consume, so each thread keeps a small tile of outputs in
registers and reuses every loaded operand across a row or column of it (an outer product,
as in a SIMT matrix product):
- Scores S = Q K^T: warp w sums the dims of its eighth of a row; its lanes tile the
  BLOCK_M x BLOCK_N scores, each lane SR = 8 rows x SK keys (SK = 4, or 2 for fp32 storage
  at 16 rows). Per step a lane loads SR x DPS queries (16-byte loads of Qt, four rows each)
  and its SK keys' next WPS words (one load a key) for SR x SK x DPS FMAs (DPS = dims a step:
  4 for packed tiles, 2 words; 4 for fp32 ones, 4 words). The loops are bound by instruction
  issue, so every load is as wide as the layout allows. The lane's keys are kg, kg + KG, ...
  (KG = lanes across keys): the KG keys a warp reads at once lie in distinct banks. Partial
  scores go to Ss; the softmax sums the eight warps' parts.
- Shared memory returns one 4-byte register a lane per pass, but two when lanes n and n^1 (or
  n and n^2) read the same address. So lanes n, n^1 share their rows of Q and n, n^2 their
  keys; in P.V, n, n^2 share their rows of P and n, n^1 their dims of V.
- Online softmax: a row belongs to TPR = 256 / BLOCK_M adjacent lanes, KPT = 4 (or 2) keys a
  lane; row max and sum by log2(TPR) shuffle steps.
- O += P V, V = the tile's first 512 dims: each thread owns PR = 8 rows x PD dims
  (PD = BLOCK_M / 4) of the BLOCK_M x 512 output, as fp32 accumulators in registers across the
  partition's tiles. Per key: PD values of V (16-byte pieces, the warp's adjacent) and 8
  probabilities (16-byte loads of Pt) for 8 x PD FMAs.
- Both loops are software-pipelined (``make_walk``): a step's (a key's) first operands are
  loaded during the step (key) before, into one of two register slots, and the loops walk
  running addresses: with two warps a scheduler little else hides a load's latency.

Softmax in base 2: exp(x) = exp2(x * LOG2E); when the score mod is the identity and the mask
is boolean, scale * LOG2E is folded into q as it is loaded, so scores arrive in log2 units.

Output: the partition's normalised output ``part_out[t, h, p, :512]`` (fp32 workspace) and its
natural-log LSE ``part_lse[t, h, p]`` (-inf and 0 when it kept no key); the combine kernel
merges the partitions. With one partition the kernel writes ``out`` and ``lse`` itself
(``part_out = out [T, H, 1, 512]`` in the storage dtype, ``store`` converting), no combine.

FP8 caches (``fp8``: "e4m3" or "v32", docs/fp8.md): rows of 576 or 656 bytes, 16-byte
copies as for 16-bit rows (the pieces past a row's end are not issued), always staged into
the fp32 tile at BLOCK_N = 32 (16 or 32 rows): each warp dequantizes the 72 dims it sums, 8 a
score-loop trip (8 bytes of codes times their scale: the per-tensor ``kv_scale``, which comes
as the imaginary part of the complex ``scale`` argument, or the row's group scale; the "v32"
rope dims are bf16). So the loops, and P.V, read exact float32 products code x scale.

Warp split-K (``groups=2``, ``decoding_warp_split_k``; 16 rows of 16-bit data): the 8 warps
form two groups of 4 (GW warps, GT = 128 threads a group). Group g walks the g-th half of the
partition's run of 32-key tiles ([t_begin, half) and [half, t_stop), half rounded up) with
its own copies of every array above but Qt (Pt, Ss, m, l, alpha, Ks: ``group_words`` apart),
its own barriers (named barrier 1 + g for its GT threads, in place of the block's), and all
the loops as above with GW warps: each warp sums a quarter of the dims of a score, and each
thread owns PR = 8 rows x PD = 8 dims of the output. The groups meet once, at the end (base-2
units; row i; group g kept keys K_g, whose running state is m_g, l_g, o_g):

    m = max(m_0, m_1),   c_g = 2^(m_g - m)        (m_ref = 0 when m = -inf: then c_g = 0)
    l = c_0 l_0 + c_1 l_1,   out = (c_0 o_0 + c_1 o_1) / l,   lse = (m + log2 l) ln 2

the softmax over K_0 and K_1 together: each term 2^(s_k - m_g) of group g becomes 2^(s_k - m)
once scaled by c_g. Thread t of group 1 owns the same rows and dims as thread t of group 0;
it writes c_1 o_1 over Qt, and group 0's thread adds it to its own c_0 o_0 and writes the
output. A row that neither group kept a key for has l = 0: zeros and LSE -inf, as above.

Traffic: each block reads its partition's keys once (576 values a key, into shared memory,
serving both q.K and P.V) plus its queries once; the G row groups of one sequence read the same
keys (from L2 after the first).
"""
import math

from numba import cuda, float32, int32

from .. import ptx
from .._compat import INLINE, JIT_OPTIONS
from ..fp8 import ROW_BYTES as FP8_ROW_BYTES
from .common import (D_QK, D_V, LN2, LOG2E, NEG_INF, make_log2_score, make_partition_walk,
                     make_tile_walk, mark_empty, partition_tiles)

NWARPS = 8
NTHREADS = 32 * NWARPS
SR = 8  # score rows per lane
PR = 8  # output rows per thread


def block_n(block_m, packed, fp8=None, groups=1):
    """Keys a tile: 64 at 16 rows of 16-bit data, so that a lane's score tile is 8 rows x 4
    keys there too (two such tiles still fit beside the queries), else 32 (FP8: 32, one key
    a lane in the conversion; warp split-K: 32 a group)."""
    return 64 if packed and block_m == 16 and not fp8 and groups == 1 else 32


def warp_split_runs(block_m, packed, fp8=None):
    """Whether the warp split-K variant (``groups=2``) exists for this configuration: 16 rows
    of 16-bit data, whose tiles the loops read packed. Two groups' tiles fit there (the
    same bytes as one group's 64-key tiles); the fp32 tiles of 32-row, FP8 or fp32 caches
    do not fit twice."""
    return packed and not fp8 and block_m == 16


def staged(block_m, packed, fp8=None):
    """Whether 16-bit tiles are converted to fp32 once, in shared memory, before use: at 32
    rows (at 16 the 64-key fp32 tile does not fit). Each value is then unpacked once a tile,
    not once by every thread that reads it (four of them), and the inner loops are FMAs and
    loads alone. FP8 tiles always are."""
    return bool(fp8) or (packed and block_m == 32)


def layout(block_m, packed, fp8=None, groups=1):
    """Word offsets of the shared arrays, the strides, and the total size in bytes. With
    warp split-K (``groups=2``) every array but Qt exists once a group: group g's lie
    ``g * group_words`` words past group 0's (the offsets given)."""
    assert block_m in (16, 32) and groups in (1, 2)
    assert groups == 1 or warp_split_runs(block_m, packed, fp8)
    gw = NWARPS // groups  # warps a group
    bn = block_n(block_m, packed, fp8, groups)
    stage = staged(block_m, packed, fp8)
    if fp8:  # storage words a row (copies)
        row_words = FP8_ROW_BYTES[fp8] // 4
    else:
        row_words = D_QK // 2 if packed else D_QK
    kv_stride = row_words + 4
    tile_words = D_QK if stage or not packed else row_words  # words a row (the loops)
    tile_stride = tile_words + 4
    # 16-byte aligned rows, so that the loops read 4 rows of Qt / Pt a load. Qt of 16 rows
    # of 16-bit data is unpadded (64-key tiles leave no room): the loops' lanes all read one
    # dim at a time, so only the stores of the queries (once a block) meet bank conflicts.
    pt_stride = block_m + 4
    qt_stride = block_m + (0 if packed and block_m == 16 and not fp8 else 4)
    qt = 0
    pt = qt + D_QK * qt_stride
    ss = pt + bn * pt_stride
    m = ss + gw * block_m * bn  # Ss rows unpadded: a swizzle spreads the stores
    l = m + block_m
    alpha = l + block_m
    ks = alpha + block_m
    ks += -ks % 4  # keep Ks 16-byte aligned
    if stage:  # one copy buffer, one fp32 tile
        kf = ks + bn * kv_stride
        end = kf + bn * tile_stride
    else:  # two copy buffers, read as they are
        kf = ks
        end = ks + 2 * bn * kv_stride
    group_words = end - pt  # one group's arrays (a multiple of 4 words: Ks ends them)
    end += (groups - 1) * group_words
    assert qt % 4 == pt % 4 == 0 and ss % 4 == 0 and alpha % 4 == 0  # lds64, lds128 alignment
    assert kf % 4 == 0 and group_words % 4 == 0
    return dict(qt=qt, pt=pt, ss=ss, m=m, l=l, alpha=alpha, ks=ks, kf=kf, kv_stride=kv_stride,
                tile_stride=tile_stride, qt_stride=qt_stride, pt_stride=pt_stride,
                row_words=row_words, tile_words=tile_words, block_n=bn, staged=stage,
                group_words=group_words, nbytes=4 * end)


def make_partition_kernel(*, load, store, unpack, locate, mask_apply, mask_classify,
                          mask_key_range, score_mod, fold_scale, block_m, heads, wide=True,
                          key_count=None, fp8=None, groups=1):
    """The stage-1 kernel for one configuration. Every argument is a compile-time constant:
    device functions (inlined) or ints; see factory.py. ``unpack`` turns a packed 16-bit pair
    into two floats, or is None for fp32 storage; ``store`` converts an output value for
    ``part_out`` (the identity for the fp32 workspace); ``wide``: the cache starts at a
    16-byte aligned address, so tiles are copied in 16-byte pieces (else 4-byte ones);
    ``key_count``: given for a shard of each sequence (see common.make_tile_walk); ``fp8``:
    the cache's FP8 layout ("e4m3", "v32"), or None; ``groups``: 2 for warp split-K (two
    groups of four warps, each walking half of the partition's tiles; see the notation)."""
    FP8 = fp8
    GROUPS = groups
    GW = NWARPS // GROUPS  # warps a group
    GT = 32 * GW  # threads a group
    packed = unpack is not None or bool(FP8)
    L = layout(block_m, packed, FP8, GROUPS)
    GR = L["group_words"]  # group g's arrays lie g * GR words past group 0's
    STAGED = L["staged"]
    TILE_PACKED = packed and not STAGED  # the loops read packed pairs
    WORD = int32 if packed else float32  # the cache's words
    TWORD = int32 if TILE_PACKED else float32  # the loops' tile words
    if unpack is None:

        @cuda.jit(device=True)
        def unpack(w):  # typed but never called: the fp32 branches read floats directly
            return w, w

    QT, PT, SS, M_, L_, A_, KS = L["qt"], L["pt"], L["ss"], L["m"], L["l"], L["alpha"], L["ks"]
    KF, TSTRIDE, TILE_WORDS = L["kf"], L["tile_stride"], L["tile_words"]
    STRIDE, ROW_WORDS, BLOCK_N = L["kv_stride"], L["row_words"], L["block_n"]
    QS, PS = L["qt_stride"], L["pt_stride"]
    BUF = BLOCK_N * STRIDE  # words per KV tile buffer
    E = 2 if TILE_PACKED else 1  # values per word of the tiles the loops read
    # Scores: lane = (rg, kg); rows rg*SR + i, keys kg + KG*j; steps of WPS words = DPS dims.
    RG = block_m // SR
    KG = 32 // RG
    SK = BLOCK_N // KG
    # Words a step and key (one 8- or 16-byte load): 2 where the loop unpacks them (4 would
    # take 8 more registers, and a warp's 36 words would not split in an even step count).
    WPS = 2 if TILE_PACKED else 4
    DPS = WPS * E
    WORDS_PER_WARP = TILE_WORDS // GW  # this warp's slice of a row
    STEPS = WORDS_PER_WARP // WPS
    # Output: thread = (rgp, dg); rows rgp*PR + i; PD dims, PDW words in NCH chunks of CW
    # words, chunk c at word c * VW // NCH + dg * CW of a row's VW words of V: the dg of a
    # warp read adjacent 16-byte pieces (distinct banks).
    RGP = block_m // PR
    DGW = 32 // RGP  # dg a warp
    PD = D_V * block_m // (PR * GT)
    PDW = PD // E
    CW = min(PDW, 4)
    NCH = PDW // CW
    VW = 512 // E
    # Partial scores: row m of warp w's slice at SS + (w * block_m + m) * BLOCK_N, key column
    # c at c ^ swz(m), swz(m) = KG * (row group of m): a lane's stores of one (i, j) then hit
    # 32 distinct banks (rows are unpadded, so the softmax reads 16-byte pieces).
    assert RG <= SK and SK & (SK - 1) == 0
    # Softmax: TPR adjacent lanes a row (all in one warp), KPT keys a lane.
    TPR = GT // block_m
    LOG_TPR = TPR.bit_length() - 1
    KPT = BLOCK_N // TPR
    assert KPT in (2, 4)
    # Tile copy: 8 threads a key row, in PIECE-byte cp.async pieces.
    PIECE = 16 if wide else 4
    ROW_PIECES = 4 * ROW_WORDS // PIECE
    PIECES = -(-ROW_PIECES // 8)  # per thread and key (FP8 rows: the last ones partly)
    WHOLE = ROW_PIECES % 8 == 0  # every thread's pieces lie in the row
    KEYS_PER_THREAD = BLOCK_N * 8 // GT
    cp_async = ptx.cp_async16_at if wide else ptx.cp_async4_at
    Q_PER_LANE = D_QK // 32
    CONVERT_PIECES = ROW_WORDS // GW // 4  # 16-byte pieces of a warp's slice of a key
    H = heads
    assert STEPS % 2 == 0 and BLOCK_N % 4 == 0 and PDW in (2, 4, 8) and SK >= 1
    assert (FP8 or 4 * ROW_WORDS % (8 * PIECE) == 0) and KEYS_PER_THREAD in (1, 2)
    assert not STAGED or (BLOCK_N == 32 and (FP8 or ROW_WORDS % (4 * GW) == 0))
    assert PD * PR * GT == D_V * block_m and GW * DGW * PDW == VW
    assert GROUPS == 1 or PR * PD * GT <= D_QK * QS  # the merge's exchange fits over Qt
    key_tiles, next_tile = make_tile_walk(mask_classify, mask_key_range, BLOCK_N, heads,
                                          key_count=key_count)
    first_tiles = make_partition_walk(key_tiles, next_tile)
    log2_score = make_log2_score(mask_apply, score_mod, fold_scale)

    @cuda.jit(device=True, **INLINE)
    def locate_rows(storage, block_table, page_size, b, k0, k1, tid):
        """The global addresses of this thread's rows of keys [k0, k1): threads 8n..8n+7 of
        the group (``tid``: the thread's place in it) copy key n (and n + GT / 8); keys past
        k1 get key k1 - 1's place (a real one) and copy zeros. Located a phase before the
        copy, so that the block-table loads are in flight meanwhile."""
        n = tid // 8
        npages = storage.shape[0]
        pg, sl = locate(block_table, page_size, npages, b, min(k0 + n, k1 - 1))
        src0 = ptx.global_addr(storage, pg, sl, 0) + PIECE * (tid % 8)
        src1 = src0
        if KEYS_PER_THREAD == 2:
            pg, sl = locate(block_table, page_size, npages, b,
                            min(k0 + n + GT // 8, k1 - 1))
            src1 = ptx.global_addr(storage, pg, sl, 0) + PIECE * (tid % 8)
        return src0, src1

    NP = KEYS_PER_THREAD * PIECES  # copies a thread and tile

    def make_copy(count):
        """A device function that starts the asynchronous copy of ``count`` pieces, from
        piece c0 on, of this thread's key j (0 or 1) of keys [k0, k1) into buffer ``buf``
        (zeros past k1), from the rows at ``src0``, ``src1`` (locate_rows): each thread
        copies every eighth piece of its row, so that a warp's copy instruction reads 128
        contiguous bytes a row."""

        @cuda.jit(device=True, **INLINE)
        def copy(smk, sb, buf, src0, src1, k0, k1, tid, j, c0):
            n = tid // 8 + (GT // 8) * j
            src = (src1 if j == 1 else src0) + 8 * PIECE * c0
            dst = sb + 4 * (KS + buf * BUF + n * STRIDE) + PIECE * (tid % 8) + 8 * PIECE * c0
            for u in range(count):
                if WHOLE or tid % 8 + 8 * (c0 + u) < ROW_PIECES:  # (FP8: not past the row)
                    cp_async(smk, dst + 8 * PIECE * u, src + 8 * PIECE * u, k0 + n < k1)

        return copy

    copy_row = make_copy(PIECES)

    @cuda.jit(device=True, **INLINE)
    def issue_tile(smk, sb, buf, src0, src1, k0, k1, tid):
        """The whole copy of keys [k0, k1) at once (the first tile)."""
        for j in range(KEYS_PER_THREAD):
            copy_row(smk, sb, buf, src0, src1, k0, k1, tid, j, 0)
        ptx.cp_async_commit()

    @cuda.jit(device=True, **INLINE)
    def convert_piece(smf, dst, w):
        """Four packed words ``w`` (8 dims) to fp32 at ``dst``."""
        x0, x1 = unpack(w[0])
        x2, x3 = unpack(w[1])
        x4, x5 = unpack(w[2])
        x6, x7 = unpack(w[3])
        ptx.sts128(smf, dst, x0, x1, x2, x3)
        ptx.sts128(smf, dst + 16, x4, x5, x6, x7)

    # Byte strides of one score step (its DPS rows of Qt, its WPS words of a key) and one key.
    Q_STEP = 4 * DPS * QS
    K_STEP = 4 * WPS
    V_KEY = 4 * TSTRIDE
    P_KEY = 4 * PS

    @cuda.jit(device=True, **INLINE)
    def load_step(smf, smk, qa, ka, kw, qf, slot):
        """Start a step's first loads into ``slot``: its SK x 2 key words (still packed) and
        the SR queries of its first dim (``qa``, ``ka``: its addresses). Issued a step ahead,
        so that each step's first FMAs find their operands there (two warps a scheduler hide
        little latency)."""
        for j in range(SK):
            if WPS == 4:
                kw[slot, j, 0], kw[slot, j, 1], kw[slot, j, 2], kw[slot, j, 3] = ptx.lds128(
                    smk, ka + 4 * j * KG * TSTRIDE)
            else:
                kw[slot, j, 0], kw[slot, j, 1] = ptx.lds64(smk, ka + 4 * j * KG * TSTRIDE)
        for i4 in range(SR // 4):
            (qf[slot, 4 * i4], qf[slot, 4 * i4 + 1], qf[slot, 4 * i4 + 2],
             qf[slot, 4 * i4 + 3]) = ptx.lds128(smf, qa + 16 * i4)

    @cuda.jit(device=True, **INLINE)
    def score_step(smf, smk, qa, ka, s_acc, kv, kw, qf, slot, more):
        """Partial scores += this lane's SR rows x SK keys over the DPS dims of the step at
        ``qa``, ``ka``, whose first loads are in ``slot``; if ``more`` (a constant once
        inlined), starts the next step's in the other slot."""
        for j in range(SK):  # SK keys x DPS dims
            if TILE_PACKED:
                kv[j, 0], kv[j, 1] = unpack(kw[slot, j, 0])
                kv[j, 2], kv[j, 3] = unpack(kw[slot, j, 1])
            else:
                for dd in range(DPS):
                    kv[j, dd] = kw[slot, j, dd]
        if more:
            load_step(smf, smk, qa + Q_STEP, ka + K_STEP, kw, qf, 1 - slot)
        for dd in range(DPS):  # SR rows of each dim, four at a time
            for i4 in range(SR // 4):
                if dd == 0:
                    q0, q1 = qf[slot, 4 * i4], qf[slot, 4 * i4 + 1]
                    q2, q3 = qf[slot, 4 * i4 + 2], qf[slot, 4 * i4 + 3]
                else:
                    q0, q1, q2, q3 = ptx.lds128(smf, qa + 4 * dd * QS + 16 * i4)
                for j in range(SK):
                    s_acc[4 * i4, j] += q0 * kv[j, dd]
                    s_acc[4 * i4 + 1, j] += q1 * kv[j, dd]
                    s_acc[4 * i4 + 2, j] += q2 * kv[j, dd]
                    s_acc[4 * i4 + 3, j] += q3 * kv[j, dd]

    @cuda.jit(device=True, **INLINE)
    def load_vp(smf, smk, va, pa, vw, pf, slot):
        """A key's operands of P.V into ``slot``: this thread's PDW words of V (packed, at
        ``va``) and its PR probabilities (at ``pa``); loaded a key ahead (see load_step)."""
        for c in range(NCH):
            if CW == 4:
                (vw[slot, 4 * c], vw[slot, 4 * c + 1], vw[slot, 4 * c + 2],
                 vw[slot, 4 * c + 3]) = ptx.lds128(smk, va + 4 * c * (VW // NCH))
            else:
                vw[slot, 2 * c], vw[slot, 2 * c + 1] = ptx.lds64(smk, va + 4 * c * (VW // NCH))
        for i4 in range(PR // 4):
            (pf[slot, 4 * i4], pf[slot, 4 * i4 + 1], pf[slot, 4 * i4 + 2],
             pf[slot, 4 * i4 + 3]) = ptx.lds128(smf, pa + 16 * i4)

    @cuda.jit(device=True, **INLINE)
    def pv_key(smf, smk, va, pa, acc, v, vw, pf, slot, more):
        """O += p v for the key whose operands are in ``slot`` (``va``, ``pa``: its
        addresses); if ``more``, starts the next key's loads in the other slot."""
        for h in range(PDW):
            if TILE_PACKED:
                v[2 * h], v[2 * h + 1] = unpack(vw[slot, h])
            else:
                v[h] = vw[slot, h]
        if more:
            load_vp(smf, smk, va + V_KEY, pa + P_KEY, vw, pf, 1 - slot)
        for i2 in range(PR // 2):
            p0, p1 = pf[slot, 2 * i2], pf[slot, 2 * i2 + 1]
            for c in range(PD):
                acc[2 * i2, c] += p0 * v[c]
                acc[2 * i2 + 1, c] += p1 * v[c]

    def make_steps(step, n, stride0, stride1, last):
        """``n`` (even) calls of ``step`` written out, the first finding its operands in slot
        0, each starting the next's loads (the very last too unless ``last``)."""
        if n == 0:
            @cuda.jit(device=True, **INLINE)
            def none(smf, smk, a0, a1, acc, vals, slots0, slots1):
                pass

            return none
        rest = make_steps(step, n - 2, stride0, stride1, last)
        more = not (last and n == 2)

        @cuda.jit(device=True, **INLINE)
        def steps(smf, smk, a0, a1, acc, vals, slots0, slots1):
            step(smf, smk, a0, a1, acc, vals, slots0, slots1, 0, True)
            step(smf, smk, a0 + stride0, a1 + stride1, acc, vals, slots0, slots1, 1, more)
            rest(smf, smk, a0 + 2 * stride0, a1 + 2 * stride1, acc, vals, slots0, slots1)

        return steps

    def make_walk(load, step, calls, unroll, stride0, stride1, pre, post):
        """A loop of ``calls`` calls of ``step`` (score steps or keys of P.V), ``unroll`` a
        trip, each finding its first operands loaded (by ``load``, or by the call before it,
        into the other of two slots) and starting the next's: running addresses ``a0``,
        ``a1`` move by the strides; the last trip's calls are written out after the loop, the
        very last starting no loads. Around each loop trip, ``pre(trip, hx)`` and
        ``post(trip, hx, w)`` (w: what pre returned) slip in other work."""
        assert unroll % 2 == 0 and calls % unroll == 0
        body = make_steps(step, unroll, stride0, stride1, False)
        tail = make_steps(step, unroll, stride0, stride1, True)
        trips = calls // unroll - 1

        @cuda.jit(device=True, **INLINE)
        def walk(smf, smk, a0, a1, acc, vals, slots0, slots1, hx):
            load(smf, smk, a0, a1, slots0, slots1, 0)
            for trip in range(int32(trips)):  # (a 32-bit counter)
                w = pre(trip, hx)
                body(smf, smk, a0, a1, acc, vals, slots0, slots1)
                post(trip, hx, w)
                a0 += unroll * stride0
                a1 += unroll * stride1
            tail(smf, smk, a0, a1, acc, vals, slots0, slots1)

        return walk

    @cuda.jit(device=True, **INLINE)
    def skip(trip, hx):
        return 0

    @cuda.jit(device=True, **INLINE)
    def nothing(trip, hx, w):
        pass

    # The next tile's copy goes out during P.V, a few pieces a trip (a burst of copies all at
    # once stalls on the copy queue), from trip 1 on (the rows are still being located on
    # trip 0): the fewest pieces a trip that divide a row's. hx: copy's arguments, and
    # whether there is a next tile.
    PV_UNROLL = 4
    PV_TRIPS = BLOCK_N // PV_UNROLL - 1
    PER_TRIP = min(d for d in range(1, PIECES + 1) if PIECES % d == 0 and NP <= d * (PV_TRIPS - 1))
    TRIPS_A_ROW = PIECES // PER_TRIP
    copy_part = make_copy(PER_TRIP)

    @cuda.jit(device=True, **INLINE)
    def copy_some(trip, cp):
        u = trip - 1  # this trip's part of the copy: key j, pieces from c0
        if cp[8] and u >= 0 and u < NP // PER_TRIP:
            j = 1 if KEYS_PER_THREAD == 2 and u >= TRIPS_A_ROW else 0  # (no division)
            copy_part(cp[0], cp[1], cp[2], cp[3], cp[4], cp[5], cp[6], cp[7], j,
                      (u - j * TRIPS_A_ROW) * PER_TRIP)
        return 0

    pv_walk = make_walk(load_vp, pv_key, BLOCK_N, PV_UNROLL, V_KEY, P_KEY, copy_some, nothing)

    if FP8:
        # As the staged 16-bit tiles below, but a piece is 8 dims of codes (8 bytes) and a
        # scale: the per-tensor one, or ("v32") the row's scale of the piece's group of 128
        # latent dims; the "v32" rope dims (warp 7's pieces 1..8) are 8 bf16 (16 bytes).
        # cv: the lane's row (bytes), its fp32 slice, the warp's first dim, tid, kv_scale.
        V32 = FP8 == "v32"
        ROPE_AT = FP8_ROW_BYTES["v32"] - 128  # bytes before the "v32" rope (528)
        CONVERT_PIECES = WORDS_PER_WARP // 8

        @cuda.jit(device=True, **INLINE)
        def fp8_load(smk, smf, row, d0, kv_scale):
            """The raw words of the piece of dims d0 .. d0 + 7 of a row, and its scale."""
            w2 = w3 = WORD(0)
            sc = kv_scale
            if V32 and d0 >= 512:
                w0, w1, w2, w3 = ptx.lds128(smk, row + ROPE_AT + 2 * (d0 - 512))
            else:
                w0, w1 = ptx.lds64(smk, row + d0)
                if V32:
                    sc = ptx.lds32(smf, row + 512 + 4 * (d0 // 128))
            return w0, w1, w2, w3, sc

        @cuda.jit(device=True, **INLINE)
        def fp8_store(smf, dst, d0, w):
            """A piece (fp8_load's) to fp32 at ``dst``."""
            if V32 and d0 >= 512:
                x0, x1 = ptx.bf16x2_to_f32(w[0])
                x2, x3 = ptx.bf16x2_to_f32(w[1])
                x4, x5 = ptx.bf16x2_to_f32(w[2])
                x6, x7 = ptx.bf16x2_to_f32(w[3])
            else:
                sc = w[4]
                x0, x1, x2, x3 = ptx.e4m3x4_to_f32(w[0])
                x4, x5, x6, x7 = ptx.e4m3x4_to_f32(w[1])
                x0, x1, x2, x3 = x0 * sc, x1 * sc, x2 * sc, x3 * sc
                x4, x5, x6, x7 = x4 * sc, x5 * sc, x6 * sc, x7 * sc
            ptx.sts128(smf, dst, x0, x1, x2, x3)
            ptx.sts128(smf, dst + 16, x4, x5, x6, x7)

        @cuda.jit(device=True, **INLINE)
        def convert_load(trip, cv):
            w = (WORD(0), WORD(0), WORD(0), WORD(0), float32(0.0))
            if trip + 2 < CONVERT_PIECES:
                w = fp8_load(cv[5], cv[0], cv[1], cv[3] + 8 * (trip + 2), cv[6])
            return w

        @cuda.jit(device=True, **INLINE)
        def convert_store(trip, cv, w):
            if trip + 2 < CONVERT_PIECES:
                fp8_store(cv[0], cv[2] + 32 * (trip + 2), cv[3] + 8 * (trip + 2), w)
                ptx.syncwarp(cv[4])  # (the warp's lanes read each other's keys)

        assert STEPS == 2 * CONVERT_PIECES and BLOCK_N == 32
        score_walk = make_walk(load_step, score_step, STEPS, 2, Q_STEP, K_STEP, convert_load,
                               convert_store)

        @cuda.jit(device=True, **INLINE)
        def score_hooks(smk, smf, sb, warp, lane, tid, kv_scale):
            """The conversion's addresses (lane l: key l), after pieces 0 and 1 are
            converted."""
            row = sb + 4 * (KS + lane * STRIDE)
            dst = sb + 4 * (KF + lane * TSTRIDE + warp * WORDS_PER_WARP)
            d0 = warp * WORDS_PER_WARP
            w = fp8_load(smk, smf, row, d0, kv_scale)
            w1 = fp8_load(smk, smf, row, d0 + 8, kv_scale)
            fp8_store(smf, dst, d0, w)
            fp8_store(smf, dst + 32, d0 + 8, w1)
            ptx.syncwarp(tid)
            return smf, row, dst, d0, tid, smk, kv_scale
    elif STAGED:
        # The scores convert their own slice as they go: trip c (2 steps = 8 dims = one
        # 16-byte piece of packed pairs) loads piece c + 2 of lane l's key l at its start and
        # stores it in fp32 at its end (pieces 0 and 1 come before the loop), so the
        # conversion's shared-memory traffic overlaps the FMAs. hx: the lane's addresses.
        @cuda.jit(device=True, **INLINE)
        def convert_load(trip, cv):
            w0 = w1 = w2 = w3 = WORD(0)
            if trip + 2 < CONVERT_PIECES:
                w0, w1, w2, w3 = ptx.lds128(cv[0], cv[2] + 16 * (trip + 2))
            return w0, w1, w2, w3

        @cuda.jit(device=True, **INLINE)
        def convert_store(trip, cv, w):
            if trip + 2 < CONVERT_PIECES:
                convert_piece(cv[1], cv[3] + 32 * (trip + 2), w)
                ptx.syncwarp(cv[4])  # (the warp's lanes read each other's keys)

        assert STEPS == 2 * CONVERT_PIECES
        score_walk = make_walk(load_step, score_step, STEPS, 2, Q_STEP, K_STEP, convert_load,
                               convert_store)

        @cuda.jit(device=True, **INLINE)
        def score_hooks(smk, smf, sb, warp, lane, tid, kv_scale):
            """The conversion's addresses (lane l: key l of warp w's slice), after pieces 0
            and 1 are converted."""
            src = sb + 4 * (KS + lane * STRIDE + warp * (ROW_WORDS // GW))
            dst = sb + 4 * (KF + lane * TSTRIDE + warp * WORDS_PER_WARP)
            w = ptx.lds128(smk, src)
            w1 = ptx.lds128(smk, src + 16)
            convert_piece(smf, dst, w)
            convert_piece(smf, dst + 32, w1)
            ptx.syncwarp(tid)
            return smk, smf, src, dst, tid
    else:
        # Steps a loop trip: more where a step is short (fp32 tiles), to spread the loop's own
        # instructions over more FMAs.
        score_walk = make_walk(load_step, score_step, STEPS,
                               6 if not TILE_PACKED and STEPS % 6 == 0 else 2, Q_STEP, K_STEP,
                               skip, nothing)

        @cuda.jit(device=True, **INLINE)
        def score_hooks(smk, smf, sb, warp, lane, tid, kv_scale):
            return 0

    @cuda.jit(device=True, **INLINE)
    def group_sync(grp):
        """A barrier for the threads that share this group's arrays: the block's, or (warp
        split-K) named barrier 1 + g for group g's GT threads."""
        if GROUPS == 1:
            cuda.syncthreads()
        else:
            ptx.bar_sync(1 + grp, GT)

    @cuda.jit(**JIT_OPTIONS)
    def partition_kernel(q, q_offsets, storage, block_table, lengths, bias, scale, chunk,
                         part_out, part_lse):
        # q [T, H, 576] (storage dtype), q_offsets [B+1], storage [pages, page_size, words],
        # chunk: tiles a partition (common.partition_tiles),
        # part_out [T, H, P, 512] f32, part_lse [T, H, P] f32. FP8 caches: scale is complex,
        # scale + 1j * kv_scale (a real scale has imaginary part 0, which nothing reads).
        kv_scale = float32(scale.imag)
        sm_scale = float32(scale.real)
        p = cuda.blockIdx.x
        nparts = cuda.gridDim.x
        b = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        # Warp split-K: this thread's group, its place in the group, its warp there, and the
        # group's arrays (words past group 0's; bytes: gb). One group: 0, tid, warp, sb.
        grp = tid // GT if GROUPS > 1 else 0
        gtid = tid % GT if GROUPS > 1 else tid
        gwarp = gtid // 32
        gw0 = GR * grp
        smf = cuda.shared.array(0, float32)  # one dynamic allocation, seen as floats ...
        smk = cuda.shared.array(0, WORD)  # ... as the cache's words ...
        smt = cuda.shared.array(0, TWORD)  # ... and as the words of the tiles the loops read
        sb = ptx.smem_addr(smf)  # its 32-bit address: byte offsets below are added to it
        gb = sb + 4 * gw0

        row0 = q_offsets[b]  # first q row of sequence b
        nq = q_offsets[b + 1] - row0  # its query tokens
        length = lengths[b]
        page_size = storage.shape[1]
        r0 = cuda.blockIdx.y * block_m  # first row of this block
        nrows = min(block_m, nq * H - r0)  # rows this block owns (uniform in the block)
        if nrows <= 0:
            return  # every thread of the block leaves: no barrier is skipped

        if GROUPS == 1:
            q_lo, q_hi, kstart, kend, t, t_end = first_tiles(length, nq, r0, nrows, p,
                                                             nparts, chunk)
            none = t >= t_end
        else:  # the partition's run [t_begin, t_stop): group 0 walks its first half
            q_lo, q_hi, kstart, kend, ntiles = key_tiles(length, nq, r0, nrows)
            t_begin, t_stop = partition_tiles(ntiles, p, nparts, chunk)
            t = next_tile(t_begin, t_stop, kstart, kend, q_lo, q_hi)
            none = t >= t_stop
            half = t_begin + (t_stop - t_begin + 1) // 2
            t_end = half if grp == 0 else t_stop
            if grp == 1:
                t = next_tile(max(t, half), t_stop, kstart, kend, q_lo, q_hi)
        if none and nparts > 1:  # (one partition writes out itself: zeros, below)
            mark_empty(part_lse, row0, r0, nrows, p, H, tid, NTHREADS)
            return  # uniform in the block: no barrier is skipped
        if t < t_end:  # start copying the first tile before anything else
            k0 = kstart + t * BLOCK_N
            k1 = min(k0 + BLOCK_N, kend)
            src0, src1 = locate_rows(storage, block_table, page_size, b, k0, k1, gtid)
            issue_tile(smk, gb, 0, src0, src1, k0, k1, gtid)

        # -- load the block's queries, transposed (once), and reset the softmax state --
        # Warp w loads rows w, w + 8, ...: a row's loads all go out before its stores.
        qscale = float32(sm_scale * LOG2E) if fold_scale else float32(1.0)
        qv = cuda.local.array(Q_PER_LANE, float32)
        for g in range(block_m // NWARPS):
            m = g * NWARPS + warp
            r = r0 + min(m, nrows - 1)  # rows past nrows read a real row and store zeros
            t_q = row0 + r // H
            h_q = r % H
            for c in range(Q_PER_LANE):
                qv[c] = load(q[t_q, h_q, lane + 32 * c])
            for c in range(Q_PER_LANE):
                ptx.sts32(smf, sb + 4 * (QT + (lane + 32 * c) * QS + m),
                          qv[c] * qscale if m < nrows else float32(0.0))
        if gtid < block_m:
            smf[M_ + gw0 + gtid] = float32(NEG_INF)
            smf[L_ + gw0 + gtid] = 0.0
        if GROUPS > 1:
            cuda.syncthreads()  # both groups read all the queries (the loop's barriers: a group's)

        # This thread's place in the score tile and in the output tile. Shared memory returns
        # one register a lane per pass, two when lanes n and n^1 (or n and n^2) read the same
        # address: lanes n, n^1 share their rows of Q and n, n^2 their keys; in P.V, lanes
        # n, n^2 share their rows of P and n, n^1 their dims of V.
        rg = ((lane >> 1) & 1) | ((lane >> 3) & (RG - 2))  # bits 1 (and 4)
        kg = (lane & 1) | ((lane >> 1) & (KG - 2))  # bits 0, 2, 3 (and 4)
        rgp = (lane & 1) | ((lane >> 3) & (RGP - 2))  # bits 0 (and 4)
        dg = gwarp * DGW + ((lane >> 1) & (DGW - 1))  # bits 1, 2, 3 (and 4)
        q_at = sb + 4 * (QT + gwarp * WORDS_PER_WARP * E * QS + rg * SR)
        p_at = gb + 4 * (PT + rgp * PR)
        acc = cuda.local.array((PR, PD), float32)  # O: my PR rows x PD dims
        for i in range(PR):
            for c in range(PD):
                acc[i, c] = 0.0
        s_acc = cuda.local.array((SR, SK), float32)
        kv = cuda.local.array((SK, DPS), float32)
        kw = cuda.local.array((2, SK, WPS), TWORD)  # a step's key words, two slots
        qf = cuda.local.array((2, SR), float32)  # a step's first-dim queries, two slots
        v = cuda.local.array(PD, float32)
        vw = cuda.local.array((2, PDW), TWORD)  # a key's V words, two slots
        pf = cuda.local.array((2, PR), float32)  # a key's probabilities, two slots
        # The softmax's row and keys, and where it reads partial scores and writes P.
        sm_row = gtid // TPR
        kq = gtid % TPR
        sm_i = (r0 + sm_row) // H
        sm_h = (r0 + sm_row) % H
        sm_pos = length - nq + sm_i
        ss_at = gb + 4 * (SS + sm_row * BLOCK_N + ((kq * KPT) ^ (KG * ((sm_row // SR) % RG))))
        pt_at = gb + 4 * (PT + kq * KPT * PS + sm_row)
        sm_s = cuda.local.array(KPT, float32)  # softmax: scores, then probabilities

        buf = 0
        while t < t_end:
            k0 = kstart + t * BLOCK_N
            k1 = min(k0 + BLOCK_N, kend)
            cls = mask_classify(k0, k1, q_lo, q_hi)
            ptx.cp_async_wait_all()
            # Wait until this tile's copies (every thread's) have landed, and until every
            # warp is done with the previous tile, whose buffers this tile's work reuses (on
            # the first tile: until the queries and the softmax state are in place). Warp
            # split-K: every thread and warp of this group, which alone uses these buffers.
            group_sync(grp)
            kb = KF if STAGED else KS + buf * BUF

            # -- partial scores: warp w sums its slice of the dims, lanes tile rows x keys --
            for i in range(SR):
                for j in range(SK):
                    s_acc[i, j] = 0.0
            k_at = gb + 4 * (kb + kg * TSTRIDE + gwarp * WORDS_PER_WARP)
            score_walk(smf, smt, q_at, k_at, s_acc, kv, kw, qf,
                       score_hooks(smk, smf, gb, gwarp, lane, tid, kv_scale))
            for i in range(SR):
                for j in range(SK):  # key kg + KG*j at column kg + KG*(j ^ rg): swizzled
                    ptx.sts32(smf, gb + 4 * (SS + (gwarp * block_m + rg * SR + i) * BLOCK_N
                                             + kg + KG * (j ^ rg)), s_acc[i, j])
            # Wait for all eight warps' partial scores (and, staged, for their conversions:
            # the copy buffer is free again, the fp32 tile whole for P.V).
            group_sync(grp)
            # The next tile, copied during this one's P.V: its rows located now, the
            # block-table loads landing during the softmax. (Buffer 1 - buf is free since the
            # top of this tile; the staged copy buffer since the barrier above.)
            t_next = next_tile(t + 1, t_end, kstart, kend, q_lo, q_hi)
            k0n = kstart + t_next * BLOCK_N
            k1n = min(k0n + BLOCK_N, kend)  # (k1n - 1: a real key even past the last tile)
            src0, src1 = locate_rows(storage, block_table, page_size, b, k0n, k1n, gtid)

            # -- mask, score mod and online softmax: thread (sm_row, kq) owns keys kq*KPT ..
            #    kq*KPT + KPT - 1 of its row; the row's TPR threads are adjacent lanes of one
            #    warp, so its maximum and sum take log2(TPR) shuffle steps. --
            for c in range(KPT):
                sm_s[c] = 0.0
            for w in range(GW):  # the (group's) warps' partial scores, KPT keys a load
                a = ss_at + 4 * w * block_m * BLOCK_N
                if KPT == 4:
                    x0, x1, x2, x3 = ptx.lds128(smf, a)
                    sm_s[0] += x0
                    sm_s[1] += x1
                    sm_s[2] += x2
                    sm_s[3] += x3
                else:
                    x0, x1 = ptx.lds64(smf, a)
                    sm_s[0] += x0
                    sm_s[1] += x1
            for c in range(KPT):
                k = k0 + kq * KPT + c
                s = float32(NEG_INF)
                if sm_row < nrows and k < k1:
                    # (with fold_scale, q brought scale * LOG2E already)
                    s = log2_score(sm_s[c], float32(1.0), sm_scale, cls, b, sm_h, sm_i, sm_pos, k,
                                   bias)
                sm_s[c] = s
            row_max = sm_s[0]
            for c in range(1, KPT):
                row_max = max(row_max, sm_s[c])
            for e in range(LOG_TPR):  # butterfly over the row's lanes: TPR/2, ..., 1
                row_max = max(row_max, ptx.shfl_xor(row_max, (TPR // 2) >> e, tid))
            m_old = ptx.lds32(smf, gb + 4 * (M_ + sm_row))
            m_new = max(row_max, m_old)
            # A row with no kept key so far keeps m = -inf; exp2 then sees -inf - 0.
            m_ref = m_new if m_new != float32(NEG_INF) else float32(0.0)
            row_sum = float32(0.0)
            for c in range(KPT):
                pr = math.exp2(sm_s[c] - m_ref)
                ptx.sts32(smf, pt_at + 4 * c * PS, pr)
                row_sum += pr
            for e in range(LOG_TPR):
                row_sum += ptx.shfl_xor(row_sum, (TPR // 2) >> e, tid)
            # Every lane of the row has read m_old before its first lane replaces it.
            ptx.syncwarp(tid)
            if kq == 0:
                alpha = math.exp2(m_old - m_ref)
                smf[A_ + gw0 + sm_row] = alpha
                smf[L_ + gw0 + sm_row] = smf[L_ + gw0 + sm_row] * alpha + row_sum
                smf[M_ + gw0 + sm_row] = m_new
            # Wait for the probabilities and the rescale factors.
            group_sync(grp)

            # -- O = alpha * O + P @ V: my PR rows x PD dims --
            for i4 in range(PR // 4):
                a0, a1, a2, a3 = ptx.lds128(smf, gb + 4 * (A_ + rgp * PR + 4 * i4))
                for c in range(PD):
                    acc[4 * i4, c] *= a0
                    acc[4 * i4 + 1, c] *= a1
                    acc[4 * i4 + 2, c] *= a2
                    acc[4 * i4 + 3, c] *= a3
            pv_walk(smf, smt, gb + 4 * (kb + dg * CW), p_at, acc, v, vw, pf,
                    (smk, gb, 0 if STAGED else 1 - buf, src0, src1, k0n, k1n, gtid,
                     t_next < t_end))
            ptx.cp_async_commit()
            buf = 1 - buf
            t = t_next

        # -- write the partition's normalised output and LSE, straight from registers --
        # Wait for the softmax state (when no tile was processed: for its initial values).
        cuda.syncthreads()
        if GROUPS > 1:
            # Warp split-K's merge: both groups scale their terms by c_g = 2^(m_g - m); group
            # 1 hands its c_1 o_1 to the thread of group 0 that owns the same rows and dims,
            # through shared memory over Qt (word (i * PD + c) * GT + gtid: no bank conflict).
            for i in range(PR):
                m = rgp * PR + i
                m_max = max(smf[M_ + m], smf[M_ + GR + m])
                m_ref = m_max if m_max != float32(NEG_INF) else float32(0.0)
                c_g = math.exp2(smf[M_ + gw0 + m] - m_ref)
                for c in range(PD):
                    acc[i, c] *= c_g
            if grp == 1:
                for i in range(PR):
                    for c in range(PD):
                        smf[QT + (i * PD + c) * GT + gtid] = acc[i, c]
            cuda.syncthreads()
            if grp == 0:
                for i in range(PR):
                    for c in range(PD):
                        acc[i, c] += smf[QT + (i * PD + c) * GT + gtid]
        if grp == 0:
            for i in range(PR):
                m = rgp * PR + i
                if m < nrows:
                    r = r0 + m
                    t_row = row0 + r // H
                    h = r % H
                    if GROUPS == 1:
                        m_row = smf[M_ + m]
                        l = smf[L_ + m]
                    else:  # l = c_0 l_0 + c_1 l_1 against m = max(m_0, m_1)
                        m_row = max(smf[M_ + m], smf[M_ + GR + m])
                        m_ref = m_row if m_row != float32(NEG_INF) else float32(0.0)
                        l = (smf[L_ + m] * math.exp2(smf[M_ + m] - m_ref)
                             + smf[L_ + GR + m] * math.exp2(smf[M_ + GR + m] - m_ref))
                    empty = l == 0.0  # no kept key (a NaN score: l = NaN, not empty, NaN out)
                    inv = float32(0.0) if empty else float32(1.0) / l
                    for c in range(NCH):
                        d0 = E * (c * (VW // NCH) + dg * CW)
                        for u in range(CW * E):
                            part_out[t_row, h, p, d0 + u] = store(acc[i, c * CW * E + u] * inv)
                    if dg == 0:
                        part_lse[t_row, h, p] = (float32(NEG_INF) if empty
                                                 else (m_row + math.log2(l)) * float32(LN2))

    return partition_kernel


def smem_bytes(block_m, packed, fp8=None, groups=1):
    return layout(block_m, packed, fp8, groups)["nbytes"]
