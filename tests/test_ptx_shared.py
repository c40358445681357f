"""The shared-memory primitives (``ptx.lds64``, ``lds128``, ``sts128``, ``lds32``): right values
at aligned addresses, in the simulator and on a GPU; and in the simulator a clear error for an
address not aligned to the access's size (a GPU faults there, so CI catches a layout that
would); and the staged rows' way out (``acc_store16``, ``bulk_store``)."""
import ml_dtypes
import numpy as np
import pytest

from numba_mla import ptx  # before numba.cuda: applies numba_mla's environment shims
from numba import cuda, float32, int32

from numba_mla._compat import SIMULATOR


@cuda.jit
def shuffle_words(src, out, offset):
    # out[t] = the word src[t] went through shared memory as a 16-, 8- and 4-byte access;
    # ``offset`` (bytes) shifts every access.
    sm = cuda.shared.array(260, float32)
    t = cuda.threadIdx.x  # 16 threads, 4 words each
    base = ptx.smem_addr(sm) + offset
    ptx.sts128(sm, base + 16 * t, src[4 * t], src[4 * t + 1], src[4 * t + 2], src[4 * t + 3])
    cuda.syncthreads()
    a0, a1 = ptx.lds64(sm, base + 16 * (15 - t))
    b0, b1, b2, b3 = ptx.lds128(sm, base + 16 * t)
    out[4 * t] = a0
    out[4 * t + 1] = a1
    out[4 * t + 2] = b2 + ptx.lds32(sm, base + 16 * (15 - t) + 12) - b3
    out[4 * t + 3] = b0 + b1


def run(offset, rng):
    src = rng.standard_normal(64).astype(np.float32)
    out = cuda.to_device(np.full(64, np.nan, np.float32))
    shuffle_words[1, 16](cuda.to_device(src), out, offset)
    return src.reshape(16, 4), out.copy_to_host().reshape(16, 4)


@pytest.mark.kernel
@pytest.mark.parametrize("offset", [0, 16, 32])
def test_aligned_accesses(offset, rng):
    src, out = run(offset, rng)
    rev = src[::-1]
    np.testing.assert_array_equal(out[:, :2], rev[:, :2])
    np.testing.assert_array_equal(out[:, 2], src[:, 2] + rev[:, 3] - src[:, 3])
    np.testing.assert_array_equal(out[:, 3], src[:, 0] + src[:, 1])


@pytest.mark.skipif(not SIMULATOR, reason="a GPU faults on a misaligned access: simulator only")
def test_misaligned_access_raises_in_simulator(rng):
    with pytest.raises(Exception, match=r"sts128: shared address \d+ is not 16-byte aligned"):
        run(8, rng)  # from inside a kernel
    words = np.arange(8, dtype=np.float32)
    for call, size in [(lambda: ptx.lds64(words, 4), 8), (lambda: ptx.lds128(words, 8), 16),
                       (lambda: ptx.sts128(words, 20, 0, 0, 0, 0), 16),
                       (lambda: ptx.lds32(words, 2), 4)]:
        with pytest.raises(RuntimeError, match=f"not {size}-byte aligned"):
            call()
    assert ptx.lds128(words, 16) == (4, 5, 6, 7)


@cuda.jit
def store_fours(out, flags):
    # thread t stores 4 values at out[t // 2, t % 2, 0, 4 * i .. 4 * i + 3] for i = 0, 1
    t = cuda.threadIdx.x
    flags[t] = ptx.aligned_x4(out)
    for i in range(2):
        v = float32(100 * t + 4 * i)
        ptx.st_global_x4(out, t // 2, t % 2, 0, 4 * i, v, v + 1, v + 2, v + 3)


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_global_stores_of_four(dtype):
    """``st_global_x4``: four elements of the last axis in one store (float32: 16 bytes, a
    16-bit dtype: 8), at the right places; ``aligned_x4`` true for an array allocated whole."""
    out = cuda.to_device(np.full((2, 2, 1, 8), np.nan, dtype))
    flags = cuda.to_device(np.zeros(4, np.int32))
    store_fours[1, 4](out, flags)
    expect = (100 * np.arange(4)[:, None] + np.arange(8)[None, :]).reshape(2, 2, 1, 8)
    np.testing.assert_array_equal(out.copy_to_host(), expect.astype(dtype))
    np.testing.assert_array_equal(flags.copy_to_host(), 1)


@cuda.jit
def store_pairs(out):
    # thread t stores 2 values at out[t // 2, t % 2, 0, 2 * i .. 2 * i + 1] for i = 0 .. 3
    t = cuda.threadIdx.x
    for i in range(4):
        v = float32(100 * t + 2 * i)
        ptx.st_global_x2(out, t // 2, t % 2, 0, 2 * i, v, v + 1)


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_global_stores_of_two(dtype):
    """``st_global_x2``: two elements of the last axis in one store (float32: 8 bytes, a
    16-bit dtype: 4), at the right places."""
    out = cuda.to_device(np.full((2, 2, 1, 8), np.nan, dtype))
    store_pairs[1, 4](out)
    expect = (100 * np.arange(4)[:, None] + np.arange(8)[None, :]).reshape(2, 2, 1, 8)
    np.testing.assert_array_equal(out.copy_to_host(), expect.astype(dtype))


@pytest.mark.skipif(not SIMULATOR, reason="a GPU faults on a misaligned access: simulator only")
def test_global_store_of_two_misaligned_raises_in_simulator():
    """An array that starts 4 bytes past an 8-byte boundary: a store of two float32 there
    raises (where the GPU would fault)."""
    whole = cuda.to_device(np.zeros(2 * 2 * 8 + 1, np.float32))
    out = whole[1:].reshape(2, 2, 1, 8)
    with pytest.raises(Exception, match=r"st_global_x2: global address \d+ is not 8-byte"):
        store_pairs[1, 4](out)


@cuda.jit
def load_fours(src, out):
    # thread t loads src[t // 2, t % 2, 1, 4 * i .. 4 * i + 3] for i = 0, 1 and writes them
    # to out[t, 4 * i ..] in reverse order within the four
    t = cuda.threadIdx.x
    for i in range(2):
        v = ptx.ld_global_x4(src, t // 2, t % 2, 1, 4 * i)
        for k in range(4):
            out[t, 4 * i + 3 - k] = v[k]


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_global_loads_of_four(dtype):
    """``ld_global_x4``: four elements of the last axis in one load, from the right places
    (the four in order: each thread writes them back reversed)."""
    src = np.arange(2 * 2 * 2 * 8).reshape(2, 2, 2, 8).astype(dtype)
    out = cuda.to_device(np.full((4, 8), np.nan, dtype))
    load_fours[1, 4](cuda.to_device(src), out)
    expect = src[:, :, 1, :].reshape(4, 2, 4)[:, :, ::-1].reshape(4, 8)
    np.testing.assert_array_equal(out.copy_to_host(), expect)


@pytest.mark.skipif(not SIMULATOR, reason="a GPU faults on a misaligned access: simulator only")
def test_global_load_of_four_misaligned_raises_in_simulator():
    """A source that starts 4 bytes past a 16-byte boundary: a load of four float32 there
    raises (where the GPU would fault)."""
    whole = cuda.to_device(np.zeros(2 * 2 * 2 * 8 + 1, np.float32))
    src = whole[1:].reshape(2, 2, 2, 8)
    out = cuda.to_device(np.zeros((4, 8), np.float32))
    with pytest.raises(Exception, match=r"ld_global_x4: global address \d+ is not 16-byte"):
        load_fours[1, 4](src, out)


@pytest.mark.skipif(not SIMULATOR, reason="a GPU faults on a misaligned access: simulator only")
def test_global_store_of_four_misaligned_raises_in_simulator():
    """An array that starts 4 bytes past a 16-byte boundary: ``aligned_x4`` says so, and a
    store of four float32 there raises (where the GPU would fault)."""
    whole = cuda.to_device(np.zeros(2 * 2 * 8 + 1, np.float32))
    out = whole[1:].reshape(2, 2, 1, 8)
    flags = cuda.to_device(np.ones(4, np.int32))
    with pytest.raises(Exception, match=r"st_global_x4: global address \d+ is not 16-byte"):
        store_fours[1, 4](out, flags)
    np.testing.assert_array_equal(flags.copy_to_host()[:1], 0)


@cuda.jit
def prefetch_then_load(table, out):
    # every thread prefetches one entry of a 2-D table, then reads another thread's
    t = cuda.threadIdx.x
    ptx.prefetch_l2(table, t // 8, t % 8)
    cuda.syncthreads()
    out[t] = table[(31 - t) // 8, (31 - t) % 8]


@pytest.mark.kernel
def test_prefetch_l2_changes_nothing(rng):
    """``ptx.prefetch_l2`` (``prefetch.global.L2``) compiles and runs, and the loads after it
    read what the table holds."""
    table = rng.integers(-1000, 1000, (4, 8)).astype(np.int32)
    out = cuda.to_device(np.zeros(32, np.int32))
    prefetch_then_load[1, 32](cuda.to_device(table), out)
    assert np.array_equal(out.copy_to_host(), table.ravel()[::-1])


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's bounds check: simulator only")
def test_prefetch_l2_out_of_bounds_raises_in_simulator():
    @cuda.jit
    def past_the_end(table):
        ptx.prefetch_l2(table, 0, 8)

    @cuda.jit
    def before_the_start(table):
        ptx.prefetch_l2(table, 0, -1)

    for kernel in (past_the_end, before_the_start):
        with pytest.raises(Exception, match="out of bounds"):
            kernel[1, 1](cuda.to_device(np.zeros((4, 8), np.int32)))


@cuda.jit
def prefetch_tiles_then_load(cache, out):
    # thread t prefetches the rows of page t // 4 from slot 4 (t % 4) on (four rows of 16
    # words), then every thread reads another's word
    t = cuda.threadIdx.x
    ptx.prefetch_bulk_l2(cache, t // 4, 4 * (t % 4), 4 * 16 * 4)
    cuda.syncthreads()
    out[t] = cache[(31 - t) // 16, (31 - t) % 16, 3]


@pytest.mark.kernel
def test_prefetch_bulk_l2_changes_nothing(rng):
    """``ptx.prefetch_bulk_l2`` (``cp.async.bulk.prefetch.L2``) compiles and runs, and the
    loads after it read what the array holds."""
    cache = rng.integers(-1000, 1000, (8, 16, 16)).astype(np.int32)
    out = cuda.to_device(np.zeros(32, np.int32))
    prefetch_tiles_then_load[1, 32](cuda.to_device(cache), out)
    t = np.arange(32)
    assert np.array_equal(out.copy_to_host(), cache[(31 - t) // 16, (31 - t) % 16, 3])


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's bounds checks: simulator only")
@pytest.mark.parametrize("i0, i1, nbytes, match", [
    (7, 15, 128, "pass the end"),  # the last row's 64 bytes, then 64 past the end
    (8, 0, 64, "out of bounds"),
    (0, -1, 64, "out of bounds"),
    (0, 0, 40, "multiple of 16"),
])
def test_prefetch_bulk_l2_outside_raises_in_simulator(i0, i1, nbytes, match):
    @cuda.jit
    def prefetch(cache):
        ptx.prefetch_bulk_l2(cache, i0, i1, nbytes)

    with pytest.raises(Exception, match=match):
        prefetch[1, 1](cuda.to_device(np.zeros((8, 16, 16), np.int32)))


@cuda.jit
def prefetch_lines_then_load(cache, out):
    # thread t prefetches the line of word 32 (t % 2) of row t // 2 of page 1, then every
    # thread reads another's word
    t = cuda.threadIdx.x
    ptx.prefetch_l2_3d(cache, 1, t // 2, 32 * (t % 2))
    cuda.syncthreads()
    out[t] = cache[1, (31 - t) // 2, 32 * ((31 - t) % 2) + 5]


@pytest.mark.kernel
def test_prefetch_l2_3d_changes_nothing(rng):
    """``ptx.prefetch_l2_3d`` (``prefetch.global.L2`` of a 3-D array's element) compiles and
    runs, and the loads after it read what the array holds."""
    cache = rng.integers(-1000, 1000, (2, 16, 64)).astype(np.int32)
    out = cuda.to_device(np.zeros(32, np.int32))
    prefetch_lines_then_load[1, 32](cuda.to_device(cache), out)
    t = np.arange(32)
    assert np.array_equal(out.copy_to_host(), cache[1, (31 - t) // 2, 32 * ((31 - t) % 2) + 5])


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's bounds check: simulator only")
@pytest.mark.parametrize("at", [(2, 0, 0), (0, 16, 0), (0, 0, 64), (0, -1, 0)])
def test_prefetch_l2_3d_out_of_bounds_raises_in_simulator(at):
    @cuda.jit
    def prefetch(cache):
        ptx.prefetch_l2_3d(cache, at[0], at[1], at[2])

    with pytest.raises(Exception, match="out of bounds"):
        prefetch[1, 1](cuda.to_device(np.zeros((2, 16, 64), np.int32)))


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's alignment check: simulator only")
def test_prefetch_bulk_l2_misaligned_raises_in_simulator():
    """An array that starts 4 bytes past a 16-byte boundary: a bulk prefetch from its first
    row raises (the GPU needs the global address 16-byte aligned)."""
    @cuda.jit
    def prefetch(cache):
        ptx.prefetch_bulk_l2(cache, 0, 0, 64)

    whole = cuda.to_device(np.zeros(8 * 16 * 16 + 1, np.int32))
    with pytest.raises(Exception, match=r"prefetch_bulk_l2: global address \d+ is not 16-byte"):
        prefetch[1, 1](whole[1:].reshape(8, 16, 16))


@cuda.jit
def copy_in_groups(src, out):
    # one thread: two groups of 16-byte copies into shared memory (words 0-3, then 4-7), over
    # words that hold -1; what it reads before each wait, after waiting for all but the newest
    # group, after waiting for all
    sm = cuda.shared.array(8, int32)
    for i in range(8):
        sm[i] = -1
    base = ptx.smem_addr(sm)
    g = ptx.global_addr(src, 0, 0, 0)
    ptx.cp_async16_at(sm, base, g, True)
    ptx.cp_async_commit()
    ptx.cp_async16_at(sm, base + 16, g + 16, True)
    ptx.cp_async_commit()
    ptx.cp_async_wait_one()
    for i in range(8):
        out[0, i] = sm[i]
    ptx.cp_async_wait_all()
    for i in range(8):
        out[1, i] = sm[i]


@pytest.mark.skipif(not SIMULATOR, reason="when a copy lands on a GPU is not observable: "
                    "simulator only")
def test_async_copies_land_at_their_wait():
    """The simulator's ``cp.async`` twin writes the copy's words only when a wait of its
    thread completes the copy's group, and NaN words from its issue until then (on the GPU
    the destination is undefined in between), so a kernel that waits for too few groups,
    reads before its wait, or still reads what was there once the copy is issued, reads NaN:
    after ``wait_one`` the first group is in and the second not yet, after ``wait_all``
    both."""
    from numba_mla.ptx.shared import IN_FLIGHT

    src = np.arange(8, dtype=np.int32).reshape(1, 1, 8) + 10
    out = np.zeros((2, 8), np.int32)
    copy_in_groups[1, 1](src, out)
    np.testing.assert_array_equal(out[0], [10, 11, 12, 13] + [IN_FLIGHT] * 4)
    assert np.isnan(np.array([IN_FLIGHT], np.int32).view(np.float32)).all()
    assert np.isnan(np.array([IN_FLIGHT], np.int32).view(np.float16)).all()
    np.testing.assert_array_equal(out[1], np.arange(8) + 10)


@cuda.jit
def index_ops(a, b, c, out):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i, 0] = ptx.min_i32(a[i] + b[i], c[i])
        out[i, 1] = 1 if ptx.lt_i32(a[i] + b[i], c[i]) else 0
        out[i, 2] = ptx.row_addr(1 << 40, a[i] & 0xFFFF, b[i] & 0x1FFFF, c[i] & 0xFFFF, 1152)


@pytest.mark.kernel
def test_index_ops(rng):
    """``ptx.min_i32`` and ``lt_i32`` take the low 32 bits of their arguments (a sum past 2^31
    wraps, as 32-bit instructions do), and ``ptx.row_addr`` gives base + (page rows + slot)
    bytes, the row index unsigned 32-bit (the copy's addresses in kernels/mma_sync_roles.py;
    indices in [2^31, 2^32) zero-extended, past 2^32 wrapped): in the simulator and on a GPU
    alike."""
    a = np.concatenate([rng.integers(-2**30, 2**30, 60),
                        [2**31 - 1, 5, -7, 0, 40000, 65535]]).astype(np.int64)
    b = np.concatenate([rng.integers(-2**30, 2**30, 60),
                        [1, 5, -7, 0, 65536, 131071]]).astype(np.int64)
    c = np.concatenate([rng.integers(-2**30, 2**30, 60),
                        [0, 10, -14, 0, 7, 65535]]).astype(np.int64)
    out = cuda.to_device(np.zeros((66, 3), np.int64))
    index_ops[1, 128](cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), out)
    got = out.copy_to_host()
    s = (a + b + 2**31) % 2**32 - 2**31  # (the sum as 32-bit arithmetic wraps it)
    assert np.array_equal(got[:, 0], np.minimum(s, c))
    assert np.array_equal(got[:, 1], (s < c).astype(np.int64))
    assert got[60, 0] == -2**31 and got[60, 1] == 1  # (2^31 - 1 + 1 wraps to -2^31 < 0)
    rows = ((a & 0xFFFF) * (b & 0x1FFFF) + (c & 0xFFFF)) % 2**32
    assert 2**31 <= rows[64] < 2**32 and (65535 * 131071 + 65535) // 2**32 == 1  # (both cases)
    assert np.array_equal(got[:, 2], (1 << 40) + rows * 1152)


def _probe_cp_async():
    """scripts/probe_cp_async.py, loaded as a module."""
    from helpers import script_module

    return script_module("probe_cp_async")


@pytest.mark.kernel
def test_probe_cp_async_copies_land_right(rng):
    """scripts/probe_cp_async.py's copies (8, 16 or 32 lanes a row, ``cg`` and ``ca``, the
    zero-fill predicate at run time or constant, padded, 128-byte-aligned or XOR-swizzled
    rows) land
    every word of every tile where its read-back looks: three tiles over two blocks, each
    block's sum of its tiles as NumPy's, so its timings and wavefront counts are of copies
    that did their work."""
    probe = _probe_cp_async()
    for lanes, op, pred, layout in probe.VARIANTS:
        out, src, _ = probe.run(lanes, op, 3, 2, rng, pred=pred, layout=layout)
        assert np.array_equal(out, probe.expected(src, 2)), (lanes, op, pred, layout)


def _stage_and_copy_out(tag):
    """A kernel for one warpgroup: a 16-accumulator fragment (element i of thread t holds
    its row % 8 * 32 + column, exact in 16 bits) staged in ``tag``'s type by
    ``acc_store16`` ("f32": ``acc_store``) in rows 16 bytes past a multiple of 128 apart,
    then row r copied out by thread r's ``bulk_store`` to ``out[r // 16, r % 16, 0, :]``."""
    n = 16
    width = 4 if tag == "f32" else 2
    pitch = 32 * width + 16 * (2 if tag == "f32" else 1)
    store = ptx.acc_store(n) if tag == "f32" else ptx.acc_store16(n, tag)

    @cuda.jit
    def kernel(out, flags):
        sm = cuda.shared.array(64 * 40, float32)
        t = cuda.threadIdx.x
        acc = cuda.local.array(n, float32)
        for i in range(n):
            acc[i] = float32(ptx.acc_row(i, t) % 8 * 32 + ptx.acc_col(i, t))
        base = ptx.smem_addr(sm)
        store(acc, sm, base + ptx.acc_row(0, t) * pitch + width * ptx.acc_col(0, t), pitch)
        ptx.fence_proxy_async()
        cuda.syncthreads()
        flags[t] = ptx.aligned16(out)
        if t < 64:
            ptx.bulk_store(sm, base + t * pitch, out, t // 16, t % 16, 0, 0, 32 * width)
            ptx.bulk_commit()
            ptx.bulk_wait_read()

    return kernel


@pytest.mark.kernel
@pytest.mark.parametrize("tag", ["bf16", "f16", "f32"])
def test_staged_rows_copied_out_whole(tag):
    """``acc_store16`` (rounded to the 16-bit type) or ``acc_store`` stage a fragment as rows,
    and ``bulk_store`` copies each row to its place: every element lands where the
    fragment's layout puts it; ``aligned16`` true for an array allocated whole."""
    if not SIMULATOR and cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("bulk copies out of shared memory need sm_90")
    dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}[tag]
    # (bfloat16 travels as int16 bits: a GPU's arrays have no bfloat16 type)
    out = cuda.to_device(np.full((4, 16, 1, 32), np.nan, dtype).view(
        np.int16 if tag == "bf16" else dtype))
    flags = cuda.to_device(np.zeros(128, np.int32))
    _stage_and_copy_out(tag)[1, 128](out, flags)
    rows = np.arange(64)[:, None] % 8 * 32 + np.arange(32)[None, :]
    got = out.copy_to_host().view(dtype)
    np.testing.assert_array_equal(got.astype(np.float32).reshape(64, 32), rows)
    np.testing.assert_array_equal(flags.copy_to_host(), 1)


@pytest.mark.skipif(not SIMULATOR, reason="a GPU faults on a misaligned copy: simulator only")
def test_bulk_store_misaligned_raises_in_simulator():
    """An array that starts 4 bytes past a 16-byte boundary: ``aligned16`` says so, and a
    bulk copy to it raises (where the GPU would fault)."""
    whole = cuda.to_device(np.zeros(4 * 16 * 32 + 2, np.float16))
    out = whole[2:].reshape(4, 16, 1, 32)
    flags = cuda.to_device(np.ones(128, np.int32))
    with pytest.raises(Exception, match=r"bulk_store: global address \d+ is not 16-byte aligned"):
        _stage_and_copy_out("f16")[1, 128](out, flags)
    np.testing.assert_array_equal(flags.copy_to_host()[:1], 0)
