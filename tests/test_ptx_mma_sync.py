"""The warp-level tensor-core primitives of numba_mla/ptx/mma_sync.py (``mma.sync`` m16n8k16 and
``ldmatrix``), from one-warp kernels, against NumPy and against the PTX ISA's fragment layouts
written out here independently of numba_mla.ptx.

- ``kernel``: tiny; the plain-Python twins in the CUDA simulator (CI), the real instructions on
  a GPU when there is one.
- ``gpu``: the same kernels over many random draws, on a real GPU only.
- ``build``: the kernels compiled for sm_90a without a GPU (NVVM, nvJitLink, cuobjdump, as in
  tests/test_build.py): HMMA.16816 and LDSM in the SASS, no local memory, no spills.
  ``python tests/test_ptx_mma_sync.py`` runs that check by itself (exit status 77: no toolchain).
"""
import collections
import functools
import re
import sys

import ml_dtypes
import numpy as np
import pytest

from numba_mla import ptx  # before numba.cuda: applies numba_mla's environment shims
from numba_mla._compat import SIMULATOR
from numba import cuda, float32, int32

DTYPE = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}
M, N, K = 16, 16, 32  # the chain: two n8 tiles (acc[0:4], acc[4:8]), two k16 steps
B_OFF = M * K * 2  # shared memory: A [M, K] row-major at byte 0, then B at B_OFF
SMEM = B_OFF + K * N * 2
LD_ROWS = 64  # the ldmatrix test's shared image: 64 rows of 16 bytes
#: B in shared memory: "kmajor" stores B^T [N, K] (ldmatrix), "nmajor" B [K, N] (ldmatrix.trans);
#: x2: two ldmatrix.x2 per k step instead of one .x4.
CHAIN_CASES = [(tag, layout, x2) for tag in DTYPE for layout in ("kmajor", "nmajor")
               for x2 in (False, True)]


# ---------------------------------------------------------------------------------------------
# Kernels (one warp)
# ---------------------------------------------------------------------------------------------
def chain_kernel_fn(tag, layout, x2):
    """out = A @ B + C: fragments loaded with ldmatrix, four mma (2 n8 tiles x 2 k16 steps)."""
    mma = ptx.mma_m16n8k16(tag)
    kmajor = layout == "kmajor"
    load_b2 = ptx.ldmatrix_x2 if kmajor else ptx.ldmatrix_x2_trans
    load_b4 = ptx.ldmatrix_x4 if kmajor else ptx.ldmatrix_x4_trans

    def kernel(a_w, b_w, c, out):
        sm = cuda.shared.array(0, int32)
        tid = cuda.threadIdx.x
        for j in range(tid, a_w.size, 32):
            sm[j] = a_w[j]
        for j in range(tid, b_w.size, 32):
            sm[B_OFF // 4 + j] = b_w[j]
        cuda.syncthreads()
        base = ptx.smem_addr(sm)
        g, t2 = tid // 4, 2 * (tid % 4)
        acc = cuda.local.array(8, float32)
        for i in range(8):  # the accumulator fragment: rows g, g+8; n8 tile i // 4
            acc[i] = c[g + 8 * ((i // 2) % 2), 8 * (i // 4) + t2 + i % 2]
        # ldmatrix: lane l gives row l % 8 of matrix l // 8; matrices 1 and 3 are 8 rows (A,
        # B [K, N]) or 8 columns (B^T [N, K]) further than 0 and 2.
        r8, h8 = tid % 8, 8 * ((tid // 8) % 2)
        for k0 in range(0, K, 16):
            # A's quarters: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15)
            a0, a1, a2, a3 = ptx.ldmatrix_x4(
                sm, base + (r8 + h8) * (2 * K) + (k0 + 8 * (tid // 16)) * 2, tid)
            # per n8 tile j: (k 0-7, n 8j..), (k 8-15, n 8j..): b0, b1 of tile j
            if kmajor:  # B^T [N, K]: a matrix row is one n, 8 k's
                row = base + B_OFF + r8 * (2 * K) + (k0 + h8) * 2
                tile = 8 * (2 * K)
            else:  # B [K, N]: a matrix row is one k, 8 n's; .trans pairs them along k
                row = base + B_OFF + (k0 + r8 + h8) * (2 * N)
                tile = 16
            if x2:
                p0, p1 = load_b2(sm, row, tid)
                q0, q1 = load_b2(sm, row + tile, tid)
            else:
                p0, p1, q0, q1 = load_b4(sm, row + (tid // 16) * tile, tid)
            mma(acc, 0, a0, a1, a2, a3, p0, p1, tid)
            mma(acc, 4, a0, a1, a2, a3, q0, q1, tid)
        for i in range(8):
            out[g + 8 * ((i // 2) % 2), 8 * (i // 4) + t2 + i % 2] = acc[i]

    return kernel


def mma_kernel_fn(tag):
    """One mma on fragments given per lane (frags [32, 6] words), into acc[4:8]; acc[0:4] must
    come back untouched."""
    mma = ptx.mma_m16n8k16(tag)

    def kernel(frags, acc_in, out):
        tid = cuda.threadIdx.x
        acc = cuda.local.array(8, float32)
        for i in range(8):
            acc[i] = acc_in[tid, i]
        mma(acc, 4, frags[tid, 0], frags[tid, 1], frags[tid, 2], frags[tid, 3],
            frags[tid, 4], frags[tid, 5], tid)
        for i in range(8):
            out[tid, i] = acc[i]

    return kernel


def ldmatrix_kernel_fn(num, trans):
    """Each lane's words of one ldmatrix whose lane l gives the row at byte rows[l]."""
    load = {(2, False): ptx.ldmatrix_x2, (2, True): ptx.ldmatrix_x2_trans,
            (4, False): ptx.ldmatrix_x4, (4, True): ptx.ldmatrix_x4_trans}[num, trans]

    def kernel(words, rows, out):
        sm = cuda.shared.array(0, int32)
        tid = cuda.threadIdx.x
        for j in range(tid, words.size, 32):
            sm[j] = words[j]
        cuda.syncthreads()
        r = load(sm, ptx.smem_addr(sm) + rows[tid], tid)
        for j in range(num):
            out[tid, j] = r[j]

    return kernel


@functools.lru_cache(maxsize=None)
def jitted(fn, *args):
    return cuda.jit(fn(*args))


# ---------------------------------------------------------------------------------------------
# The PTX ISA's layouts, lane l = 4g + t (for the host side; independent of numba_mla.ptx)
# ---------------------------------------------------------------------------------------------
def words(x):
    """16-bit values [..., 2] -> int32 words (element 0 in the low half)."""
    return np.ascontiguousarray(x).view(np.uint16).view(np.int32)[..., 0]


def a_b_fragments(a, b):
    """Lane l's a0..a3, b0, b1 (int32 [32, 6]) for A [16, 16] and B [16, 8]: "Matrix Fragments
    for mma.m16n8k16 with floating point type"."""
    frags = np.empty((32, 6), np.int32)
    for lane in range(32):
        g, t = divmod(lane, 4)
        c = 2 * t
        frags[lane, :4] = [words(a[g, c:c + 2]), words(a[g + 8, c:c + 2]),
                           words(a[g, c + 8:c + 10]), words(a[g + 8, c + 8:c + 10])]
        frags[lane, 4:] = [words(b[c:c + 2, g]), words(b[c + 8:c + 10, g])]
    return frags


def acc_position(lane, k):
    """(row, column) of D held in accumulator k = 0..3 of lane."""
    g, t = divmod(lane, 4)
    return g + 8 * (k // 2), 2 * t + k % 2


def ldmatrix_expected(img, rows, num, trans):
    """Lane l's words: matrix j's rows are at bytes rows[8j:8j+8]; word j of lane l = 4g + t
    is that matrix's (g, 2t), (g, 2t+1), or with .trans (2t, g), (2t+1, g)."""
    h = img.view(np.uint16)
    out = np.empty((32, num), np.int32)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for j in range(num):
            mat = np.stack([h[rows[8 * j + r] // 2:rows[8 * j + r] // 2 + 8] for r in range(8)])
            pair = mat[2 * t:2 * t + 2, g] if trans else mat[g, 2 * t:2 * t + 2]
            out[lane, j] = words(pair)
    return out


# ---------------------------------------------------------------------------------------------
# Runs and checks
# ---------------------------------------------------------------------------------------------
#: |error| allowed against float64, relative to the sum of |terms| (|A| @ |B| + |C|): the
#: products are exact. The twin rounds each mma's exact sum once (<= 2**-23 over two chained
#: mmas); the hardware's fp32 sum has its own order and rounding (it is reported to align the
#: addends to the largest and truncate), a few tens of ulps at worst. Either is far below
#: what a layout error gives (order 1).
REL_TOL = 2.0 ** -21 if SIMULATOR else 2.0 ** -16


def fp32_bound(a, b, c):
    f = np.float64
    return REL_TOL * (np.abs(a.astype(f)) @ np.abs(b.astype(f)) + np.abs(c.astype(f)))


def random16(rng, shape, tag, spread=0):
    """Normal values scaled by 2**u, u uniform in [-spread, spread] per element, in 16 bits."""
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread + 1, shape)
    return x.astype(DTYPE[tag])


def run_chain(tag, layout, x2, rng, spread=0):
    a = random16(rng, (M, K), tag, spread)
    b = random16(rng, (K, N), tag, spread)
    c = rng.standard_normal((M, N)).astype(np.float32)
    b_stored = np.ascontiguousarray(b.T) if layout == "kmajor" else b
    out = cuda.to_device(np.full((M, N), np.nan, np.float32))
    kern = jitted(chain_kernel_fn, tag, layout, x2)
    kern[1, 32, 0, SMEM](cuda.to_device(words(a.reshape(-1, 2))),
                         cuda.to_device(words(b_stored.reshape(-1, 2))), cuda.to_device(c), out)
    got = out.copy_to_host()
    ref = a.astype(np.float64) @ b.astype(np.float64) + c
    err = np.abs(got - ref)
    assert np.all(err <= fp32_bound(a, b, c)), (
        f"{tag} {layout} x2={x2}: max error {np.nanmax(err):.3g}, wrong at "
        f"{np.argwhere(~(err <= fp32_bound(a, b, c)))[:8].tolist()}")


def run_mma(tag, rng):
    a = random16(rng, (16, 16), tag)
    b = random16(rng, (16, 8), tag)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    acc_in = rng.standard_normal((32, 8)).astype(np.float32)  # acc[0:4]: must stay
    for lane in range(32):
        for k in range(4):
            acc_in[lane, 4 + k] = c[acc_position(lane, k)]
    out = cuda.to_device(np.full((32, 8), np.nan, np.float32))
    jitted(mma_kernel_fn, tag)[1, 32](cuda.to_device(a_b_fragments(a, b)),
                                      cuda.to_device(acc_in), out)
    got = out.copy_to_host()
    assert np.array_equal(got[:, :4], acc_in[:, :4]), "mma(acc, 4, ...) changed acc[0:4]"
    ref = a.astype(np.float64) @ b.astype(np.float64) + c
    bound = fp32_bound(a, b, c)
    for lane in range(32):
        for k in range(4):
            rc = acc_position(lane, k)
            assert abs(got[lane, 4 + k] - ref[rc]) <= bound[rc], (
                f"{tag}: lane {lane} acc[{4 + k}] = {got[lane, 4 + k]}, D{rc} = {ref[rc]}")


def run_ldmatrix(num, trans, rng):
    img = rng.integers(-2 ** 31, 2 ** 31, LD_ROWS * 4).astype(np.int32)
    # distinct rows in any order, 16-byte aligned; for x2, lanes 16-31 give other rows that
    # must be ignored
    rows = (16 * rng.permutation(LD_ROWS)[:32]).astype(np.int32)
    out = cuda.to_device(np.zeros((32, num), np.int32))
    jitted(ldmatrix_kernel_fn, num, trans)[1, 32, 0, img.nbytes](
        cuda.to_device(img), cuda.to_device(rows), out)
    np.testing.assert_array_equal(out.copy_to_host(), ldmatrix_expected(img, rows, num, trans))


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------
@pytest.mark.kernel
@pytest.mark.parametrize("tag,layout,x2", CHAIN_CASES)
def test_mma_chain(tag, layout, x2, rng):
    """ldmatrix (A; B stored either way), two n8 tiles x two accumulated k16 steps, C added."""
    run_chain(tag, layout, x2, rng)


@pytest.mark.kernel
@pytest.mark.parametrize("tag", list(DTYPE))
def test_mma_fragments(tag, rng):
    """One mma on fragments built from the PTX ISA's layout on the host, into acc[4:8]."""
    run_mma(tag, rng)


@pytest.mark.kernel
@pytest.mark.parametrize("num,trans", [(4, False), (4, True), (2, False), (2, True)])
def test_ldmatrix_fragments(num, trans, rng):
    """Each lane's words from rows scattered in shared memory, against the PTX ISA's layout."""
    run_ldmatrix(num, trans, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("tag,layout,x2", CHAIN_CASES)
def test_gpu_mma_chain_draws(tag, layout, x2, rng):
    """The chain over 50 draws, values spread over 2**-6 .. 2**6."""
    for spread in [0] * 10 + [6] * 40:
        run_chain(tag, layout, x2, rng, spread)


@pytest.mark.gpu
@pytest.mark.parametrize("tag", list(DTYPE))
def test_gpu_mma_fragments_draws(tag, rng):
    for _ in range(50):
        run_mma(tag, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("num,trans", [(4, False), (4, True), (2, False), (2, True)])
def test_gpu_ldmatrix_draws(num, trans, rng):
    for _ in range(50):
        run_ldmatrix(num, trans, rng)


@pytest.mark.build
def test_mma_sync_builds_for_sm90a():
    """This file run as a script in a fresh process (no simulator): see build_check()."""
    from helpers import run_build_script

    run_build_script(__file__)


# ---------------------------------------------------------------------------------------------
# The sm_90a build (run as a script)
# ---------------------------------------------------------------------------------------------
def build_check():
    """Compile the chain kernels for sm_90a with NVVM, link with nvJitLink, disassemble: per
    kernel 4 HMMA.16816 (one per mma), the expected LDSM forms, no local memory (the local
    accumulator array in registers), no spills. 0 when all pass, 1 if not, 77 if no toolchain."""
    from helpers import build_check_module
    from numba import types

    bc = build_check_module()
    missing = bc.toolchain_missing()
    if missing:
        print(f"NVVM/nvJitLink not available ({missing})")
        return 77
    w1, f2 = types.Array(types.int32, 1, "C"), types.Array(types.float32, 2, "C")
    bad = 0
    for tag, layout, x2 in CHAIN_CASES:
        ptx_text, _ = cuda.compile_ptx(chain_kernel_fn(tag, layout, x2), (w1, w1, f2, f2),
                                       cc=(9, 0, "a"))
        sass, log = bc.build_sass(ptx_text)
        suffix = ".BF16" if tag == "bf16" else ""
        hmma = len(re.findall(rf"HMMA\.16816\.F32{re.escape(suffix)}\s", sass))
        ldsm = re.findall(r"LDSM\.16\.(M\w*88)\.(\d)", sass)
        want = collections.Counter({("M88", "4"): 2})  # A: one .x4 per k step, B below
        want["M88" if layout == "kmajor" else "MT88", "2" if x2 else "4"] += 4 if x2 else 2
        got = collections.Counter(ldsm)
        local = len(re.findall(r"\b(?:LDL|STL)\b", sass)) + ptx_text.count(".local")
        _, local_bytes, _ = bc._resources(ptx_text, log)  # spill stores and stack frame
        ok = hmma == 4 and got == want and not local and not local_bytes
        bad += not ok
        verdict = "ok" if ok else f"FAIL (wanted 4 HMMA, LDSM {dict(want)})"
        print(f"{tag:4} {layout:6} x2={x2!s:5} HMMA.16816={hmma} LDSM={dict(got)} local={local} "
              f"local_bytes={local_bytes}  {verdict}")
    return 1 if bad else 0


@pytest.mark.kernel
@pytest.mark.parametrize("chains,ldsm", [(1, 0), (3, 0), (3, 1), (4, 2)])
def test_probe_mma_peak_products_right(chains, ldsm):
    """scripts/probe_mma_peak.py's kernel (two warps, three steps) against its NumPy model
    written from PTX's fragment layouts: each lane's sum of its accumulators, so its
    throughput figures are of products that multiplied the fragments it says (registers, B
    from ldmatrix rows that move with the pair and the step, or A too)."""
    from helpers import script_module

    probe = script_module("probe_mma_peak")
    out = np.zeros(64, np.float32)
    probe.make_kernel(chains, ldsm, 2)[1, 64](out, 3)
    want = np.concatenate([probe.expected(chains, ldsm, 3, warp) for warp in (0, 1)])
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert len(set(np.round(want, 3))) > 8  # (lanes and warps multiply different fragments)


if __name__ == "__main__":
    sys.exit(build_check())
