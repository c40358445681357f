"""``ptx.wgmma_rs``: Hopper's warpgroup product with A from registers (``wgmma.mma_async`` with
a register A operand), from a two-warpgroup kernel, against NumPy and against the layouts
written out here independently of numba_mla.ptx (A: mma.sync's A fragment over each warp's 16 rows;
D: the wgmma accumulator fragment).

- ``kernel``: a few cases; the plain-Python twin in the CUDA simulator (CI), the real
  instruction on a GPU.
- ``gpu``: every case over many random draws, on a real GPU (sm_90) only.
- ``build``: compiled for sm_90a without a GPU (NVVM, nvJitLink, cuobjdump, as in
  tests/test_build.py): one register-A HGMMA per product in the SASS, none serialised.
  ``python tests/test_ptx_wgmma.py`` runs that check by itself (exit status 77: no toolchain).
"""
import functools
import re
import sys

import ml_dtypes
import numpy as np
import pytest

from numba_mla import ptx  # before numba.cuda: applies numba_mla's environment shims
from numba import cuda, float32, int32

DTYPE = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}
WARPGROUPS = 2  # each multiplies its own A by the shared B
#: B [16 x n] in shared memory, no swizzle, in core matrices of 8 x 16 bytes: K-major (stored as
#: B^T [n, 16], trans_b False) or N-major (stored as [16, n], trans_b True); LBO steps 8 along
#: K, SBO 8 along N.
LBO, SBO = 128, 256
CASES = [(tag, n, trans_b) for tag in DTYPE for n in (16, 64, 256) for trans_b in (False, True)]
SIM_CASES = [("bf16", 64, False), ("bf16", 256, True), ("f16", 16, True)]


def kernel_fn(tag, n, trans_b):
    """out[w] = 2 * A[w] @ B for warpgroup w: one product that overwrites, one that adds."""
    mma = ptx.wgmma_rs(n, tag, trans_b)
    wait = ptx.wgmma_wait(n // 2)
    desc = ptx.wgmma_desc(LBO, SBO)
    nacc = n // 2

    def kernel(a_words, b_words, out):
        # a_words [WARPGROUPS, 128, 4] int32, b_words [8 * n] int32, out [WARPGROUPS, 128, n/2]
        sm = cuda.shared.array(0, int32)
        tid = cuda.threadIdx.x
        for j in range(tid, b_words.size, 128 * WARPGROUPS):
            sm[j] = b_words[j]
        ptx.fence_proxy_async()
        # B is in place, visible to the tensor cores.
        cuda.syncthreads()
        wg, wtid = tid // 128, tid % 128
        a0, a1 = a_words[wg, wtid, 0], a_words[wg, wtid, 1]
        a2, a3 = a_words[wg, wtid, 2], a_words[wg, wtid, 3]
        acc = cuda.local.array(nacc, float32)
        d = desc(ptx.smem_addr(sm))
        ptx.wgmma_fence()
        mma(acc, a0, a1, a2, a3, sm, d, 0, tid)
        mma(acc, a0, a1, a2, a3, sm, d, 1, tid)
        ptx.wgmma_commit()
        wait(acc)
        for i in range(nacc):
            out[wg, wtid, i] = acc[i]

    return kernel


@functools.lru_cache(maxsize=None)
def compiled(tag, n, trans_b):
    return cuda.jit(kernel_fn(tag, n, trans_b))


def a_fragments(a):
    """[64, 16] -> [128, 4] int32: thread w's words (warp w // 32, lane w % 32; r = 16 * warp
    + lane // 4, t = lane % 4): A[r, 2t:2t+2], A[r+8, 2t:2t+2], A[r, 2t+8:2t+10],
    A[r+8, 2t+8:2t+10], low half first."""
    w = np.arange(128)
    r, t = 16 * (w // 32) + w % 32 // 4, w % 32 % 4
    pairs = [a[r, 2 * t + c] for c in (0, 1)], [a[r + 8, 2 * t + c] for c in (0, 1)], \
        [a[r, 2 * t + 8 + c] for c in (0, 1)], [a[r + 8, 2 * t + 8 + c] for c in (0, 1)]
    words = [np.stack(p, axis=1).copy().view(np.int32)[:, 0] for p in pairs]
    return np.stack(words, axis=1)


def b_image(b, trans_b):
    """B [16, n] -> shared-memory image (int32 words) in the layout the descriptor names."""
    n = b.shape[1]
    img = np.zeros(16 * n, b.dtype)
    k, c = np.meshgrid(np.arange(16), np.arange(n), indexing="ij")
    if trans_b:  # N-major: byte(k, c) = (c//8)*SBO + (k//8)*LBO + (k%8)*16 + (c%8)*2
        byte = (c // 8) * SBO + (k // 8) * LBO + (k % 8) * 16 + (c % 8) * 2
    else:  # K-major, B^T [n, 16]: byte(c, k) = (c//8)*SBO + (k//8)*LBO + (c%8)*16 + (k%8)*2
        byte = (c // 8) * SBO + (k // 8) * LBO + (c % 8) * 16 + (k % 8) * 2
    img[byte // 2] = b
    return img.view(np.int32)


def fragment_to_matrix(frag):
    """[128, n/2] accumulator fragments -> D [64, n]: element i of thread w is D[16*(w//32) +
    (w%32)//4 + 8*((i//2)%2), 8*(i//4) + 2*(w%4) + i%2]."""
    nacc = frag.shape[1]
    w, i = np.meshgrid(np.arange(128), np.arange(nacc), indexing="ij")
    d = np.full((64, 2 * nacc), np.nan)
    d[16 * (w // 32) + w % 32 // 4 + 8 * (i // 2 % 2), 8 * (i // 4) + 2 * (w % 4) + i % 2] = frag
    return d


def run(tag, n, trans_b, rng, spread=0):
    dt = DTYPE[tag]
    scale = lambda shape: 2.0 ** rng.uniform(-spread, spread, shape)  # noqa: E731
    a = (rng.standard_normal((WARPGROUPS, 64, 16)) * scale((WARPGROUPS, 64, 16))).astype(dt)
    b = (rng.standard_normal((16, n)) * scale((16, n))).astype(dt)
    words = np.stack([a_fragments(a[w]) for w in range(WARPGROUPS)])
    out = np.full((WARPGROUPS, 128, n // 2), np.nan, np.float32)
    d_out = cuda.to_device(out)
    compiled(tag, n, trans_b)[1, 128 * WARPGROUPS, 0, 32 * n](
        cuda.to_device(words), cuda.to_device(b_image(b, trans_b)), d_out)
    got = d_out.copy_to_host()
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for w in range(WARPGROUPS):
        want = 2 * a64[w] @ b64
        bound = 2 * np.abs(a64[w]) @ np.abs(b64) * 2.0 ** -20 + 1e-30  # fp32 sums of 32 terms
        d = fragment_to_matrix(got[w])
        assert not np.isnan(d).any(), "an output element was not written"
        assert (np.abs(d - want) <= bound).all(), (
            f"warpgroup {w}: max error {np.max(np.abs(d - want) / bound):.2f} x the bound")


@pytest.mark.kernel
@pytest.mark.parametrize("tag,n,trans_b", SIM_CASES)
def test_wgmma_rs(tag, n, trans_b, rng):
    run(tag, n, trans_b, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("tag,n,trans_b", CASES)
def test_gpu_wgmma_rs_draws(tag, n, trans_b, rng):
    if cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("wgmma needs sm_90")
    for spread in [0] * 5 + [6] * 15:
        run(tag, n, trans_b, rng, spread)


@pytest.mark.build
def test_wgmma_rs_builds_for_sm90a():
    """This file run as a script in a fresh process (no simulator): see build_check()."""
    from helpers import run_build_script

    run_build_script(__file__)


def build_check():
    """Compile every case for sm_90a with NVVM, link with nvJitLink, disassemble: two HGMMA
    with a register A operand (``HGMMA.64x{n}x16.F32[.BF16] R.., R..``), no serialisation
    warning. 0 when all pass, 1 if not, 77 if no toolchain."""
    from helpers import build_check_module
    from numba import types

    bc = build_check_module()
    missing = bc.toolchain_missing()
    if missing:
        print(f"NVVM/nvJitLink not available ({missing})")
        return 77
    sig = (types.Array(types.int32, 3, "C"), types.Array(types.int32, 1, "C"),
           types.Array(types.float32, 3, "C"))
    bad = 0
    for tag, n, trans_b in CASES:
        ptx_text, _ = cuda.compile_ptx(kernel_fn(tag, n, trans_b), sig, cc=(9, 0, "a"))
        sass, log = bc.build_sass(ptx_text)
        suffix = r"\.BF16" if tag == "bf16" else ""
        hgmma = len(re.findall(rf"HGMMA\.64x{n}x16\.F32{suffix} R\d+, R\d+,", sass))
        serial = "serialized" in log
        ok = hgmma == 2 and not serial
        bad += not ok
        print(f"{tag:4} n={n:3} trans_b={trans_b!s:5} register-A HGMMA={hgmma} "
              f"serialised={serial}  {'ok' if ok else 'FAIL (wanted 2, not serialised)'}")
    return 1 if bad else 0


@functools.lru_cache(maxsize=None)
def _scale_cols_kernel(n, nacc):
    scale = ptx.acc_scale_cols(n, nacc)
    ncol = nacc // 2

    @cuda.jit
    def kernel(out):
        t = ptx.opaque_i32(cuda.threadIdx.x)
        acc = cuda.local.array(n, float32)
        f = cuda.local.array(ncol, float32)
        for i in range(n):
            acc[i] = float32(i + 1)
        for j in range(ncol):  # the thread's columns, in the order the kernels keep them
            f[j] = float32(8 * (j // 2) + 2 * (t % 4) + j % 2 + 1)
        scale(acc, f)
        for i in range(n):
            out[t, i] = acc[i]

    return kernel


@pytest.mark.kernel
@pytest.mark.parametrize("n,nacc", [(128, 16), (64, 8)])
def test_acc_scale_cols_scales_each_column(n, nacc):
    """``ptx.acc_scale_cols``: every accumulator times the factor of its column, the column
    being the fragment's (module docstring of ptx/accumulators.py: 8 (k // 4) + 2 (lane % 4)
    + k % 2 for element k of a product of ``nacc``), over n / nacc products."""
    out = cuda.to_device(np.zeros((128, n), np.float32))
    _scale_cols_kernel(n, nacc)[1, 128](out)
    got = out.copy_to_host()
    for t in range(128):
        for i in range(n):
            k = i % nacc
            col = 8 * (k // 4) + 2 * (t % 4) + k % 2
            assert got[t, i] == (i + 1) * (col + 1), (t, i)


@pytest.mark.parametrize("n,trans_b,swizzle",
                         [(64, False, True), (256, True, True), (16, False, False),
                          (32, True, False)])
def test_twin_gathers_the_threads_cells_of_the_whole_product(n, trans_b, swizzle, rng):
    """The shared-memory wgmma's twin gathers only the 2 rows of A and n/4 columns of B that a
    thread holds: each of its accumulators must be the element of the whole product A @ B^T
    (both operands decoded in full from the descriptors) at that accumulator's place, for
    every thread of the warpgroup, overwriting and then adding. Plain NumPy (the twins
    themselves), so it runs with or without a GPU; small integers, so every sum is exact."""
    from numba_mla.ptx.accumulators import _acc_col, _acc_row
    from numba_mla.ptx.wgmma import (_desc_advance_twin, _operand_halves, _wgmma_desc_twin,
                                     _wgmma_twin)

    dtype = DTYPE["bf16"]
    values = rng.integers(-8, 9, 65536).astype(dtype)
    words = values.view(np.int32)
    # swizzled: 8-row atoms 1 KB apart along M/N; MN-major B's 64-column atoms 8 KB apart
    lbo, sbo = (8192, 1024) if swizzle else (128, 256)
    desc = _wgmma_desc_twin(lbo, sbo, swizzle)
    d_a = _desc_advance_twin(desc(4096), 32 if swizzle else 0)  # (a K step inside an atom)
    d_b = desc(32768)
    a = values[_operand_halves(d_a, 64, True)].astype(np.float64)
    b = values[_operand_halves(d_b, n, not trans_b)].astype(np.float64)
    whole = a @ b.T
    mma = _wgmma_twin(n, "bf16", trans_b)
    idx = np.arange(n // 2)
    for wtid in range(128):
        acc = np.full(n // 2, np.nan)
        mma(acc, words, d_a, d_b, 0, wtid)
        want = whole[_acc_row(idx, wtid), _acc_col(idx, wtid)]
        np.testing.assert_array_equal(acc, want)
        mma(acc, words, d_a, d_b, 1, wtid)
        np.testing.assert_array_equal(acc, 2 * want)


@pytest.mark.kernel
def test_desc_advance_lo_is_desc_advance():
    """``ptx.desc_advance_lo`` (a 32-bit add to the low word) gives ``desc_advance``'s
    descriptor for shared addresses and the steps the kernels take (a box's K steps of 32
    bytes, whole boxes of 8 KB), swizzled or not, wherever the sum stays in shared memory."""
    d0, d1 = ptx.wgmma_desc(16, 1024, True), ptx.wgmma_desc(LBO, SBO)
    addrs = np.array([0, 1024, 0x12000, 0x24000 + 4096, 0x2F000], np.int64)
    steps = np.array([0, 32, 64, 96, 8192, 8192 * 8 + 96], np.int64)

    @cuda.jit
    def k(addrs, steps, out):
        i = cuda.grid(1)
        if i < addrs.size * steps.size:
            a, s = addrs[i // steps.size], steps[i % steps.size]
            out[0, i] = ptx.desc_advance(d0(a), s)
            out[1, i] = ptx.desc_advance_lo(d0(a), s)
            out[2, i] = ptx.desc_advance(d1(a), s)
            out[3, i] = ptx.desc_advance_lo(d1(a), s)

    n = addrs.size * steps.size
    out = cuda.to_device(np.zeros((4, n), np.uint64))
    k[1, n](cuda.to_device(addrs), cuda.to_device(steps), out)
    got = out.copy_to_host()
    assert (got[0] == got[1]).all() and (got[2] == got[3]).all()
    assert len(set(got[0])) == len(set(int(a + t) for a in addrs for t in steps)), (
        "expected a distinct descriptor for each distinct address")


@pytest.mark.simulator
def test_desc_advance_lo_twin_refuses_a_carry():
    """The twin of ``desc_advance_lo`` fails where the address field (addr >> 4, 14 bits)
    would carry into the word's next field, which the 32-bit add would corrupt."""
    d = ptx.wgmma_desc(16, 1024, True)(0x3F000)
    assert ptx.desc_advance_lo(d, 0x800) == ptx.desc_advance(d, 0x800)
    with pytest.raises(AssertionError, match="carry"):
        ptx.desc_advance_lo(d, 0x1000)


if __name__ == "__main__":
    sys.exit(build_check())
