"""The register fragments of the planned 16-row FP8 kernel (docs/fp8.md, "Next: a 16-row
kernel for H = 16"): S^T = K Q^T with K's e4m3 codes converted straight into wgmma's register
A operand (``ptx.wgmma_rs``, m64n16k16: 64 keys on M, 16 query rows on N), from the raw rows
in shared memory, no 16-bit K tile in between.

The dims are dealt to the k-steps so that one 16-byte shared load a row feeds four steps:
thread t (= lane % 4) of a warp loads bytes 64J + 16t .. 64J + 16t + 15 of its two rows (r,
r + 8), and word ``sub`` of that load holds, for k-step 4J + sub, the codes of its logical
dims 2t, 2t + 1 (low half) and 2t + 8, 2t + 9 (high half). Q, the B operand, is laid out in
shared memory in the same order (``q_image``), so the sum over the dims is unchanged.

The second product, O^T += V^T P^T (512 dims on M in eight m64 blocks, the rows on N, the
keys on K), takes V^T's register fragments by ``ldmatrix.trans`` from a 16-bit V tile (the
converted codes, rows 16 bytes longer than their dims so that the eight rows an ``ldmatrix``
reads fall in different banks) and P^T from shared memory in the same core-matrix layout as
Q. (Here 256 of the 512 dims, four m64 blocks: the tile then fits the 48 KB a launch gets
without asking for more.)

``test_online_softmax`` puts them together over 64 dims, for one 64-key tile and for three:
S^T from the codes, the softmax down S^T's columns (a query row's maximum over a tile's keys:
within a thread, three shuffles across the warp's lanes, then the four warps through shared
memory), P^T written as wgmma's B operand, O^T += V^T P^T; across tiles a running maximum a
query row, O^T's columns and the threads' shares of the row sums rescaled when it moves, the
sums met at the end, the output divided and written in q's row order.

- ``kernel``: the simulator's twins in CI (one case each), the real instructions on a GPU.
- ``gpu``: more draws on a real GPU (sm_90) only.
"""
import functools
import math

import ml_dtypes
import numpy as np
import pytest

from numba_mla import ptx  # before numba.cuda: applies numba_mla's environment shims
from numba import cuda, float32, int16, int32
from test_ptx_wgmma import fragment_to_matrix

ROW_BYTES = 576  # a raw e4m3 row: 512 latent + 64 rope codes
KEYS = 64  # wgmma's M
ROWS = 16  # query rows: wgmma's N
NACC = ROWS // 2  # S^T's accumulators a thread
STEP_BYTES = 512  # one k-step of Q's B image: [16 rows x 16 dims] fp16
LBO, SBO = 128, 256  # B^T [16, 16] K-major, core matrices of 8 x 16 bytes


def physical_dim(step, k):
    """The dim of the row that logical column ``k`` (0..15) of k-step ``step`` stands for."""
    J, sub = divmod(step, 4)
    t, e = divmod(k % 8, 2)
    return 64 * J + 16 * t + 4 * sub + (2 if k >= 8 else 0) + e


def q_image(q, steps):
    """Q [16, dims] fp16 -> the B operand's shared-memory image (int32 words): for each
    k-step, B^T [16 rows, 16 logical dims] in core matrices (byte(c, k) = (c//8)*SBO +
    (k//8)*LBO + (c%8)*16 + (k%8)*2), the logical dims in the order the A fragments take."""
    img = np.zeros(steps * STEP_BYTES // 2, np.float16)
    for s in range(steps):
        for c in range(ROWS):
            for k in range(16):
                byte = s * STEP_BYTES + (c // 8) * SBO + (k // 8) * LBO + (c % 8) * 16 + (k % 8) * 2
                img[byte // 2] = q[c, physical_dim(s, k)]
    return img.view(np.int32)


def kernel_fn(steps):
    mma = ptx.wgmma_rs(ROWS, "f16", False)
    wait = ptx.wgmma_wait(NACC)
    desc = ptx.wgmma_desc(LBO, SBO)
    raw_words = KEYS * ROW_BYTES // 4

    def kernel(raw, qimg, out):
        # raw [64 * 576 / 4] int32 (the keys' codes, rows 576 bytes apart), qimg [steps * 128]
        # int32, out [128, 8] float32 (S^T's accumulator fragments)
        sm = cuda.shared.array(0, int32)
        tid = cuda.threadIdx.x
        for j in range(tid, raw_words, 128):
            sm[j] = raw[j]
        for j in range(tid, qimg.size, 128):
            sm[raw_words + j] = qimg[j]
        ptx.fence_proxy_async()
        # Rows and Q in place, visible to the tensor cores.
        cuda.syncthreads()
        warp, lane = tid // 32, tid % 32
        r = 16 * warp + lane // 4
        t = lane % 4
        base = ptx.smem_addr(sm)
        row_lo = base + r * ROW_BYTES + 16 * t
        row_hi = row_lo + 8 * ROW_BYTES
        d = desc(base + raw_words * 4)
        acc = cuda.local.array(NACC, float32)
        for i in range(NACC):
            acc[i] = 0.0
        ptx.wgmma_fence()
        for J in range(steps // 4):
            lo = ptx.lds128(sm, row_lo + 64 * J)
            hi = ptx.lds128(sm, row_hi + 64 * J)
            for sub in range(4):
                a0, a2 = ptx.e4m3x4_to_f16x4(lo[sub])
                a1, a3 = ptx.e4m3x4_to_f16x4(hi[sub])
                mma(acc, a0, a1, a2, a3, sm, ptx.desc_advance(d, STEP_BYTES * (4 * J + sub)),
                    1, tid)
        ptx.wgmma_commit()
        wait(acc)
        for i in range(NACC):
            out[tid, i] = acc[i]

    return kernel


@functools.lru_cache(maxsize=None)
def compiled(steps):
    return cuda.jit(kernel_fn(steps))


def run(rng, dims):
    steps = dims // 16
    codes = rng.integers(0, 256, (KEYS, ROW_BYTES), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C  # no NaN codes (0x7F, 0xFF): finite keys
    k = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    q = rng.standard_normal((ROWS, ROW_BYTES)).astype(np.float16)
    raw = codes.reshape(-1).view(np.int32)
    img = q_image(q, steps)
    out = cuda.to_device(np.full((128, NACC), np.nan, np.float32))
    smem = KEYS * ROW_BYTES + img.size * 4
    assert smem <= 48 * 1024  # (what a launch gets without asking the driver for more)
    compiled(steps)[1, 128, 0, smem](cuda.to_device(raw), cuda.to_device(img), out)
    got = fragment_to_matrix(out.copy_to_host())  # [64 keys, 16 rows]
    q64 = q.astype(np.float64)
    want = k[:, :dims] @ q64[:, :dims].T
    bound = np.abs(k[:, :dims]) @ np.abs(q64[:, :dims]).T * 2.0 ** -19 + 1e-30
    assert not np.isnan(got).any(), "an output element was not written"
    assert (np.abs(got - want) <= bound).all(), \
        f"max error {np.max(np.abs(got - want) / bound):.2f} x the bound"


D_V = 256  # V's dims here (the kernel's 512 are eight m64 blocks, the same way)
V_ROW = 2 * D_V + 16  # a converted V row, 16 bytes over (no bank conflicts in ldmatrix)
OACC = ROWS // 2  # O^T's accumulators a thread, for one 64-dim block


def p_image(p):
    """P [16 rows, 64 keys] fp16 -> P^T's B image: for each k-step of 16 keys, B^T [16 rows,
    16 keys] in core matrices (byte(c, k) = (c//8)*SBO + (k//8)*LBO + (c%8)*16 + (k%8)*2)."""
    img = np.zeros(KEYS // 16 * STEP_BYTES // 2, np.float16)
    c, k = np.meshgrid(np.arange(ROWS), np.arange(KEYS), indexing="ij")
    byte = (k // 16) * STEP_BYTES + (c // 8) * SBO + (k % 16 // 8) * LBO + (c % 8) * 16 + k % 8 * 2
    img[byte // 2] = p
    return img.view(np.int32)


def pv_kernel_fn():
    mma = ptx.wgmma_rs(ROWS, "f16", False)
    wait = ptx.wgmma_wait(OACC)
    desc = ptx.wgmma_desc(LBO, SBO)
    v_words = KEYS * V_ROW // 4

    def kernel(v, pimg, out):
        # v [64 * V_ROW / 4] int32 (16-bit V rows), pimg [512] int32, out [4, 128, 8] float32
        sm = cuda.shared.array(0, int32)
        tid = cuda.threadIdx.x
        for j in range(tid, v_words, 128):
            sm[j] = v[j]
        for j in range(tid, pimg.size, 128):
            sm[v_words + j] = pimg[j]
        ptx.fence_proxy_async()
        # V and P in place, visible to the tensor cores.
        cuda.syncthreads()
        warp, lane = tid // 32, tid % 32
        base = ptx.smem_addr(sm)
        # ldmatrix: lane l gives row l % 8 of matrix l // 8; matrix m covers keys
        # 8 (m // 2) .. + 7 and dims 8 (m % 2) .. + 7 of the warp's 16 (a0 .. a3 of V^T)
        m = lane // 8
        row = base + (8 * (m // 2) + lane % 8) * V_ROW + 2 * (16 * warp + 8 * (m % 2))
        d = desc(base + v_words * 4)
        for blk in range(D_V // 64):
            acc = cuda.local.array(OACC, float32)
            for i in range(OACC):
                acc[i] = 0.0
            ptx.wgmma_fence()
            for step in range(KEYS // 16):
                a0, a1, a2, a3 = ptx.ldmatrix_x4_trans(sm, row + 16 * step * V_ROW + 128 * blk,
                                                       tid)
                mma(acc, a0, a1, a2, a3, sm, ptx.desc_advance(d, STEP_BYTES * step), 1, tid)
            ptx.wgmma_commit()
            wait(acc)
            for i in range(OACC):
                out[blk, tid, i] = acc[i]

    return kernel


@functools.lru_cache(maxsize=None)
def pv_compiled():
    return cuda.jit(pv_kernel_fn())


def run_pv(rng):
    v = rng.standard_normal((KEYS, D_V)).astype(np.float16)
    p = rng.random((ROWS, KEYS)).astype(np.float16)  # probabilities: in [0, 1)
    rows = np.zeros((KEYS, V_ROW // 2), np.float16)
    rows[:, :D_V] = v
    out = cuda.to_device(np.full((D_V // 64, 128, OACC), np.nan, np.float32))
    img = p_image(p)
    smem = KEYS * V_ROW + img.size * 4
    assert smem <= 48 * 1024
    pv_compiled()[1, 128, 0, smem](cuda.to_device(rows.reshape(-1).view(np.int32)),
                                   cuda.to_device(img), out)
    got = np.concatenate([fragment_to_matrix(f) for f in out.copy_to_host()])  # [256, 16]
    v64, p64 = v.astype(np.float64), p.astype(np.float64)
    want = v64.T @ p64.T
    bound = np.abs(v64.T) @ np.abs(p64.T) * 2.0 ** -20 + 1e-30
    assert not np.isnan(got).any(), "an output element was not written"
    assert (np.abs(got - want) <= bound).all(), \
        f"max error {np.max(np.abs(got - want) / bound):.2f} x the bound"


# Tiles end to end: rows of 64 codes here (the 576-byte stride is the first test's)
T_DIMS = 64
T_VROW = 2 * T_DIMS + 16  # a converted V row of 64 dims, 16 bytes over


def seq_layout(tiles):
    """Byte offsets in shared memory for ``tiles`` tiles: every tile's codes from 0, then Q's
    image (4 k-steps), every tile's V rows, P^T's image (4 k-steps), 4 warps x 16 row
    statistics (float32), and the total."""
    qimg = tiles * KEYS * T_DIMS
    v = qimg + T_DIMS // 16 * STEP_BYTES
    pimg = v + tiles * KEYS * T_VROW
    red = pimg + KEYS // 16 * STEP_BYTES
    return qimg, v, pimg, red, red + 4 * ROWS * 4


def seq_kernel_fn(tiles):
    S_QIMG, S_V, S_PIMG, S_RED, _ = seq_layout(tiles)
    mma = ptx.wgmma_rs(ROWS, "f16", False)
    wait = ptx.wgmma_wait(NACC)
    desc = ptx.wgmma_desc(LBO, SBO)

    def kernel(image, out, row_max):
        # image [S_PIMG / 4] int32: every tile's codes, Q's image, every tile's V rows;
        # out [16, 64] float32: O = softmax(S) V for the 16 query rows, 64 dims; row_max [16]:
        # each row's running maximum at the end (a common reference that is not the maximum
        # still gives the right O, short of overflow: the maxima are checked themselves)
        sm = cuda.shared.array(0, int32)
        sm16 = cuda.shared.array(0, int16)
        smf = cuda.shared.array(0, float32)
        tid = cuda.threadIdx.x
        for j in range(tid, image.size, 128):
            sm[j] = image[j]
        ptx.fence_proxy_async()
        cuda.syncthreads()
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        base = ptx.smem_addr(sm)
        dq = desc(base + S_QIMG)
        dp = desc(base + S_PIMG)
        mq = lane // 8
        s_acc = cuda.local.array(NACC, float32)
        o_acc = cuda.local.array(NACC, float32)
        m_run = cuda.local.array(4, float32)  # this thread's four query rows (columns)
        l_run = cuda.local.array(4, float32)  # its share of their sums
        mx = cuda.local.array(4, float32)
        for i in range(NACC):
            o_acc[i] = 0.0
        for j in range(4):
            m_run[j] = float32(-math.inf)
            l_run[j] = 0.0
        for tile in range(tiles):
            for i in range(NACC):
                s_acc[i] = 0.0
            ptx.wgmma_fence()
            row_lo = base + (tile * KEYS + 16 * warp + g) * T_DIMS + 16 * t
            lo = ptx.lds128(sm, row_lo)
            hi = ptx.lds128(sm, row_lo + 8 * T_DIMS)
            for sub in range(4):
                a0, a2 = ptx.e4m3x4_to_f16x4(lo[sub])
                a1, a3 = ptx.e4m3x4_to_f16x4(hi[sub])
                mma(s_acc, a0, a1, a2, a3, sm, ptx.desc_advance(dq, STEP_BYTES * sub), 1, tid)
            ptx.wgmma_commit()
            wait(s_acc)
            for j in range(4):  # element i = (j // 2) * 4 + j % 2 and i + 2: column j's keys
                i = (j // 2) * 4 + j % 2
                m = max(s_acc[i], s_acc[i + 2])
                for step in (4, 8, 16):
                    m = max(m, ptx.shfl_xor(m, step, tid))
                mx[j] = m
            if g == 0:
                for j in range(4):
                    smf[S_RED // 4 + ROWS * warp + 8 * (j // 2) + 2 * t + j % 2] = mx[j]
            cuda.syncthreads()
            for j in range(4):
                c = 8 * (j // 2) + 2 * t + j % 2
                m = m_run[j]
                for w in range(4):
                    m = max(m, smf[S_RED // 4 + ROWS * w + c])
                alpha = math.exp(m_run[j] - m)  # 0 on the first tile (m_run = -inf)
                l_run[j] *= alpha
                for i in ((j // 2) * 4 + j % 2, (j // 2) * 4 + j % 2 + 2):
                    o_acc[i] *= alpha  # O^T's column c: O^T rows are dims, no key in it
                m_run[j] = m
            for i in range(NACC):
                j = (i // 4) * 2 + i % 2
                c = 8 * (i // 4) + 2 * t + i % 2
                pv = math.exp(s_acc[i] - m_run[j])
                h = ptx.f32_to_f16(pv)
                l_run[j] += ptx.f16_to_f32(h)  # the sum of P as rounded, as P V sees it
                byte = (S_PIMG + STEP_BYTES * warp + (c // 8) * SBO + ((i // 2) % 2) * LBO
                        + (c % 8) * 16 + 2 * g)
                sm16[byte // 2] = h
            ptx.fence_proxy_async()
            # P^T complete and the maxima read: the next tile may overwrite both after P V
            cuda.syncthreads()
            vrow = (base + S_V + (tile * KEYS + 8 * (mq // 2) + lane % 8) * T_VROW
                    + 2 * (16 * warp + 8 * (mq % 2)))
            ptx.wgmma_fence()
            for step in range(KEYS // 16):
                a0, a1, a2, a3 = ptx.ldmatrix_x4_trans(sm, vrow + 16 * step * T_VROW, tid)
                mma(o_acc, a0, a1, a2, a3, sm, ptx.desc_advance(dp, STEP_BYTES * step), 1, tid)
            ptx.wgmma_commit()
            wait(o_acc)
            # (P V has read P^T: the next tile's may take its place)
            cuda.syncthreads()
        # Each row's sum: the thread's two keys a tile are in l_run; lanes, then warps
        for j in range(4):
            v = l_run[j]
            for step in (4, 8, 16):
                v += ptx.shfl_xor(v, step, tid)
            l_run[j] = v
        if g == 0:
            for j in range(4):
                smf[S_RED // 4 + ROWS * warp + 8 * (j // 2) + 2 * t + j % 2] = l_run[j]
                if warp == 0:
                    row_max[8 * (j // 2) + 2 * t + j % 2] = m_run[j]
        cuda.syncthreads()
        for i in range(NACC):
            j = (i // 4) * 2 + i % 2
            c = 8 * (i // 4) + 2 * t + i % 2
            total = float32(0.0)
            for w in range(4):
                total += smf[S_RED // 4 + ROWS * w + c]
            # (ptx.rcp: an IEEE division is a subroutine call, and a call in the function
            # makes ptxas serialise every wgmma in it)
            out[c, 16 * warp + g + 8 * ((i // 2) % 2)] = o_acc[i] * ptx.rcp(total)

    return kernel


@functools.lru_cache(maxsize=None)
def seq_compiled(tiles):
    return cuda.jit(seq_kernel_fn(tiles))


def run_seq(rng, tiles):
    n = tiles * KEYS
    qimg, vrow0, pimg, _, smem = seq_layout(tiles)
    # e4m3 codes sign | exponent << 3 | mantissa, the second tile's exponents larger (|k| up
    # to 15 against 2 or 4): the running maximum moves there, and the third falls under it
    exps = np.concatenate([rng.integers(lo, hi + 1, (KEYS, T_DIMS))
                           for lo, hi in ((1, 7), (6, 10), (1, 8))[:tiles]])
    codes = ((rng.integers(0, 2, (n, T_DIMS)) << 7) | (exps << 3)
             | rng.integers(0, 8, (n, T_DIMS))).astype(np.uint8)
    k = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    q = (rng.standard_normal((ROWS, ROW_BYTES)) * 0.1).astype(np.float16)
    v = rng.standard_normal((n, T_DIMS)).astype(np.float16)
    image = np.zeros(pimg, np.uint8)
    image[:qimg] = codes.reshape(-1)
    image[qimg:vrow0] = q_image(q, T_DIMS // 16).view(np.uint8)
    vrows = np.zeros((n, T_VROW // 2), np.float16)
    vrows[:, :T_DIMS] = v
    image[vrow0:pimg] = vrows.reshape(-1).view(np.uint8)
    out = cuda.to_device(np.full((ROWS, T_DIMS), np.nan, np.float32))
    row_max = cuda.to_device(np.full(ROWS, np.nan, np.float32))
    assert smem <= 48 * 1024  # (what a launch gets without asking the driver for more)
    seq_compiled(tiles)[1, 128, 0, smem](cuda.to_device(image.view(np.int32)), out, row_max)
    got = out.copy_to_host()
    s = q.astype(np.float64)[:, :T_DIMS] @ k.T  # [16 rows, keys]
    s_bound = np.abs(q.astype(np.float64)[:, :T_DIMS]) @ np.abs(k.T) * 2.0 ** -20
    top = s.argmax(axis=1)
    assert (np.abs(row_max.copy_to_host() - s.max(axis=1))
            <= s_bound[np.arange(ROWS), top] + 1e-30).all(), "a row's maximum is not its own"
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = p @ v.astype(np.float64) / p.sum(axis=1, keepdims=True)
    # P rounded to fp16 in the products and in the sums alike: each output moves by at most
    # about a half-ulp of fp16 of the weighted values
    bound = (p @ np.abs(v.astype(np.float64))) / p.sum(axis=1, keepdims=True) * 2.0 ** -9
    assert not np.isnan(got).any(), "an output element was not written"
    assert (np.abs(got - want) <= bound + 1e-6).all(), \
        f"max error {np.max(np.abs(got - want) / (bound + 1e-6)):.2f} x the bound"


@pytest.mark.kernel
@pytest.mark.parametrize("tiles", [1, 3], ids=["one_tile", "three_tiles"])
def test_online_softmax(tiles, rng):
    """O = softmax(S) V for every query row: one tile (the softmax down S^T's columns, P^T as
    the B operand), and three with the maximum moving between them."""
    run_seq(rng, tiles)


def test_physical_dims_are_a_permutation():
    """Every dim of a row is taken by exactly one (k-step, column), and a thread's four
    k-steps of a 64-dim group read the 16 bytes it loads."""
    dims = sorted(physical_dim(s, k) for s in range(36) for k in range(16))
    assert dims == list(range(576))
    for J in range(9):
        for t in range(4):
            taken = {physical_dim(4 * J + sub, k) for sub in range(4)
                     for k in (2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9)}
            assert taken == set(range(64 * J + 16 * t, 64 * J + 16 * t + 16))


@pytest.mark.kernel
def test_s_transposed_from_fp8_fragments(rng):
    """S^T = K Q^T over the first 64 dims (four k-steps, one 16-byte load a row)."""
    run(rng, 64)


@pytest.mark.kernel
def test_o_transposed_from_v_fragments(rng):
    """O^T = V^T P^T for one 64-key tile, each 64-dim block of V^T by ldmatrix.trans."""
    run_pv(rng)


GPU_CHECKS = {"s_64": lambda rng: run(rng, 64), "s_192": lambda rng: run(rng, 192),
              "pv": run_pv, "one_tile": lambda rng: run_seq(rng, 1),
              "three_tiles": lambda rng: run_seq(rng, 3)}


@pytest.mark.gpu
@pytest.mark.parametrize("check", list(GPU_CHECKS))
def test_gpu_draws(check, rng):
    """Each check above on five random draws, on a real GPU (sm_90) only."""
    if cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("wgmma needs sm_90")
    for _ in range(5):
        GPU_CHECKS[check](rng)
