"""The decode twins of ``numba_mla/ptx/conversions.py`` (tables of every code's value) and the
integer twin of ``byte_perm``, against NumPy and ml_dtypes on every code: the simulator must
give what the GPU's ``cvt`` and ``prmt`` give (tests/test_fp8.py compares those on a GPU)."""
import ml_dtypes
import numpy as np
import pytest

from numba_mla.ptx import arith, conversions

BF16, E4M3 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn


def as_int32(words):
    return np.asarray(words, np.int64).astype(np.uint32).view(np.int32)


@pytest.mark.parametrize("dtype,pair,single", [
    (BF16, conversions._unpack_twin(BF16), conversions._bf16_to_f32_twin),
    (np.float16, conversions._unpack_twin(np.float16), conversions._f16_to_f32_twin)],
    ids=["bf16", "f16"])
def test_16_bit_decodes_give_every_codes_value(dtype, pair, single):
    """Every 16-bit code, alone (as an int16) and as either half of a word (NaN codes give
    NaN), as the Python float of its exact value."""
    codes = np.arange(1 << 16, dtype=np.uint16)
    with np.errstate(invalid="ignore"):  # (NaN codes)
        want = codes.view(dtype).astype(np.float64)
    words = as_int32(codes.astype(np.int64) | (codes[::-1].astype(np.int64) << 16))
    got = np.array([pair(w) for w in words])
    assert np.array_equal(got[:, 0], want, equal_nan=True)
    assert np.array_equal(got[:, 1], want[::-1], equal_nan=True)
    alone = np.array([single(c) for c in codes.view(np.int16)])
    assert np.array_equal(alone, want, equal_nan=True)
    assert all(type(v) is float for v in (*pair(words[0]), alone[0].item()))


def test_e4m3_decodes_give_every_codes_value():
    """Every e4m3 code in each byte of a word: four floats, and two words of 16-bit pairs in
    either 16-bit type, each the code's exact value (NaN codes give NaN)."""
    codes = np.arange(256, dtype=np.uint8)
    for shift in range(4):  # (code c in byte `shift`, its neighbours in the others)
        raw = np.stack([np.roll(codes, k - shift) for k in range(4)], axis=1)  # [word, byte]
        words = raw.copy().view(np.int32)[:, 0]
        with np.errstate(invalid="ignore"):
            want = raw.view(E4M3).astype(np.float64)
        got = np.array([conversions._e4m3x4_to_f32_twin(w) for w in words])
        assert np.array_equal(got, want, equal_nan=True)
        for dtype in (BF16, np.float16):
            twin = conversions._e4m3x4_to_16x4_twin(dtype)
            pairs = np.array([twin(w) for w in words], np.int32)
            assert np.array_equal(pairs.view(dtype).astype(np.float64), want, equal_nan=True)


def test_byte_perm_twin_picks_bytes(rng):
    """prmt on random words and selectors: byte k of the result is byte ``(sel >> 4k) & 7`` of
    the eight bytes of (a, b), a's low byte first, as a signed int32."""
    a, b = (rng.integers(-2 ** 31, 2 ** 31, 500) for _ in range(2))
    for sel in [0x5140, 0x7362, 0x3210, 0x7654] + list(rng.integers(0, 8, (40, 4)) @ [1, 16, 256, 4096]):
        twin = arith._byte_perm_twin(int(sel))
        picks = [(int(sel) >> (4 * k)) & 7 for k in range(4)]
        src = np.stack([as_int32(a), as_int32(b)], axis=1).view(np.uint8)  # [n, 8]
        want = src[:, picks].copy().view(np.int32)[:, 0]
        got = [twin(x, y) for x, y in zip(a.tolist(), b.tolist())]
        assert got == want.tolist()
        assert all(twin(np.int32(x), np.int32(y)) == w for x, y, w in zip(a[:5], b[:5], want[:5]))


@pytest.mark.gpu
@pytest.mark.parametrize("tag,dtype", [("bf16", BF16), ("f16", np.float16)])
def test_16_bit_decodes_match_their_twins_on_the_gpu(tag, dtype):
    """The PTX decodes of every 16-bit code (alone, and as each half of a word) give the
    twins' values."""
    from numba import cuda

    from numba_mla import ptx

    pair = ptx.bf16x2_to_f32 if tag == "bf16" else ptx.f16x2_to_f32
    single = ptx.bf16_to_f32 if tag == "bf16" else ptx.f16_to_f32

    @cuda.jit
    def decode(words, halves, out):
        i = cuda.grid(1)
        if i < words.shape[0]:
            out[i, 0], out[i, 1] = pair(words[i])
            out[i, 2] = single(halves[i])

    codes = np.arange(1 << 16, dtype=np.uint16)
    words = as_int32(codes.astype(np.int64) | (codes[::-1].astype(np.int64) << 16))
    out = cuda.device_array((1 << 16, 3), np.float32)
    decode[256, 256](cuda.to_device(words), cuda.to_device(codes.view(np.int16)), out)
    twin_pair, twin_single = conversions._unpack_twin(dtype), conversions._values(dtype)
    want = np.array([(*twin_pair(w), twin_single[c]) for w, c in zip(words, codes)], np.float32)
    assert np.array_equal(out.copy_to_host(), want, equal_nan=True)


def test_word_in_a_float_round_trips(rng):
    """``f32_as_i32`` undoes ``i32_as_f32`` (twins): every word that is not a NaN's pattern
    comes back whole, denormals and both zeros included; the seesaw kernel keeps a packed
    16-bit pair of P (never a NaN's pattern: P is finite and >= 0) in a float's register
    this way (seesaw.PACK_P)."""
    words = np.concatenate([rng.integers(-2 ** 31, 2 ** 31, 2000), [0, 1, -2 ** 31, 0x7f7fffff,
                                                                    0x007fffff, 0x3f80_3f80]])
    floats = as_int32(words)
    keep = ~np.isnan(floats.view(np.float32))
    for w in floats[keep].tolist():
        x = conversions._i32_as_f32_twin(w)
        assert conversions._f32_as_i32_twin(np.float32(x)) == w
        assert conversions._f32_as_i32_twin(x) == w


@pytest.mark.gpu
def test_word_in_a_float_round_trips_on_the_gpu(rng):
    """On the GPU the two bitcasts give back every word, NaN patterns included, through a
    float32 local."""
    from numba import cuda

    from numba_mla import ptx

    @cuda.jit
    def trip(words, out, floats):
        i = cuda.grid(1)
        if i < words.shape[0]:
            x = ptx.i32_as_f32(words[i])
            floats[i] = x
            out[i] = ptx.f32_as_i32(x)

    words = as_int32(rng.integers(-2 ** 31, 2 ** 31, 1 << 16))
    out = cuda.device_array(words.shape, np.int32)
    floats = cuda.device_array(words.shape, np.float32)
    trip[256, 256](cuda.to_device(words), out, floats)
    assert np.array_equal(out.copy_to_host(), words)
    assert np.array_equal(floats.copy_to_host().view(np.int32), words)
