"""Fuzzing the argument checks (SPEC.md, "Bad input") with hypothesis, and a few random valid
calls of the FMA kernel.

Every public entry point (``mla_decode``, ``mla_decode_ragged``, ``flare_mla_decoding`` with a
cache, with ragged q and with an array ``k``) and both cache constructors get random WRONG
arguments, one kind of fault per example: wrong shapes and ranks, wrong dtypes (ints, float64,
bool, complex, object, byte-swapped), lengths out of range, block tables pointing outside the
pages, bad windows and chunks, non-finite scales, bad row offsets, bad ``out`` buffers, bad
``num_partitions``, ``backend`` and ``return_lse``. Each must raise ValueError or TypeError
(the one the SPEC's rule gives: TypeError for a wrong kind or dtype, ValueError for a wrong
shape or value) whose message starts with the offending argument's name, never anything else,
and a sentinel-filled ``out`` must come back untouched. The kernels are replaced by a tripwire
(``no_launch``): a bad call that got through the checks fails at once instead of running.

The SPEC's other side is checked too: what it does not call an error (scale 0 or negative,
int scales, huge ``num_partitions``, int64 host lengths, non-contiguous host ``out``, anything
in unused block-table entries) is accepted.

``NUMBA_MLA_FUZZ_EXAMPLES`` multiplies the example counts (default 1: the check-only tests
take ~10 s); examples are derandomized (the same in every run) so a failure reproduces, and
hypothesis prints the failing one. The kernel part: 3 tiny examples in the simulator (~10 s),
more and larger on a GPU.
"""
import math
import os
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numba_mla as nm
from helpers import BF16, DTYPES, assert_three_way, f64, fp32_floor, make_bias, make_problem

#: Casting the NaN-filled cache to an integer dtype (a wrong dtype on purpose) warns.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")

#: Multiplies every example count below (a long local run: NUMBA_MLA_FUZZ_EXAMPLES=20).
SCALE = float(os.environ.get("NUMBA_MLA_FUZZ_EXAMPLES", "1"))


def fuzz(n):
    """Settings for a check-only fuzz test of about ``n`` examples (times SCALE)."""
    return settings(max_examples=max(1, int(n * SCALE)), deadline=None, derandomize=True,
                    database=None, suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.function_scoped_fixture])


SENTINEL = 7.0
BACKENDS = ("auto", "simt", "mma", "simple", "reference")
ENTRIES = ("decode", "ragged", "flare", "flare_ragged", "flare_array")
RAGGED = ("ragged", "flare_ragged")
FLARE = ("flare", "flare_ragged", "flare_array")
BAD_DTYPES = [np.dtype(d) for d in ("int8", "int16", "int32", "int64", "uint8", "uint16",
                                    "uint32", "uint64", "float64", "bool", "complex64",
                                    "complex128", "object", ">f4", ">f2")]
#: A cache's storage: uint8 is FP8 storage (its refusal without kv_scale: tests/test_fp8.py)
BAD_STORAGE_DTYPES = [d for d in BAD_DTYPES if d != np.dtype("uint8")]


def out_name(entry):
    return "output" if entry in FLARE else "out"


def offsets_name(entry):
    return "valid_length" if entry.startswith("flare") else "q_row_offsets"


# ---------------------------------------------------------------------------------------------
# The tripwire: no kernel may run in a check-only test
# ---------------------------------------------------------------------------------------------
class Launched(AssertionError):
    """The checks accepted a call and the kernels were about to run."""

    def __init__(self, call):
        super().__init__(f"the checks accepted the call and it was launched: backend "
                         f"{call.backend!r}, q {getattr(call.q, 'shape', None)}")
        self.call = call


@pytest.fixture
def no_launch(monkeypatch):
    """The kernels replaced by a tripwire for the whole test (all its hypothesis examples)."""
    from numba_mla import launch

    def tripwire(call):
        raise Launched(call)

    monkeypatch.setattr(launch, "run", tripwire)


# ---------------------------------------------------------------------------------------------
# A valid base call per example, then one fault
# ---------------------------------------------------------------------------------------------
@st.composite
def problems(draw, entry, min_sq=1, min_len=0, cache_kind=None):
    """A small valid problem for ``entry`` (a contiguous cache for ``flare_array``)."""
    dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    kind = cache_kind or ("contiguous" if entry == "flare_array" else
                          draw(st.sampled_from(["contiguous", "paged"])))
    page = draw(st.integers(1, 6))
    B, H = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    Sq = draw(st.integers(min_sq, 3))
    lo = max(Sq, min_len)
    length = st.integers(lo, 14) if min_len else st.one_of(st.just(0), st.integers(lo, 14))
    lengths = draw(st.lists(length, min_size=B, max_size=B))
    counts = None
    if entry in RAGGED:
        counts = [draw(st.integers(0, min(Sq, L) if L else Sq)) for L in lengths]
    seed = draw(st.integers(0, 2**32 - 1))
    return make_problem(np.random.default_rng(seed), B, Sq, H, lengths, dtype, kind, page,
                        ragged=entry in RAGGED, q_counts=counts)


def sentinel_out(p, shape=None, dtype=None):
    return np.full(p.out_shape if shape is None else shape, SENTINEL,
                   p.dtype if dtype is None else dtype)


def invoke(entry, p, **kw):
    """Call ``entry`` on problem p with any argument replaced through ``kw`` (``out``,
    ``q``, ``offsets``, ``k``, ``valid_length``, ``scale``, ``mask``, ``score_mod``,
    ``num_partitions``, ``return_lse``, ``backend``)."""
    a = dict(q=p.q, offsets=p.q_offsets, scale=p.scale, mask=None, score_mod=None,
             num_partitions=None, return_lse=False, backend="auto")
    if entry == "flare_array":
        a.update(k=p.cache.kv[:, :, None, :], valid_length=p.lengths)
    else:
        a.update(k=p.cache, valid_length=p.q_offsets if entry == "flare_ragged" else None)
    a.update(kw)
    if entry in FLARE:
        return nm.flare_mla_decoding(a["out"], a["q"], a["k"], a["mask"], a["score_mod"],
                                     a["valid_length"], a["scale"], a["num_partitions"],
                                     backend=a["backend"],
                                     use_score_mod=a["score_mod"] is not None)
    if entry == "ragged":
        return nm.mla_decode_ragged(a["q"], a["offsets"], a["k"], a["scale"], a["mask"],
                                    a["score_mod"], a["num_partitions"], a["return_lse"],
                                    a["out"], a["backend"])
    return nm.mla_decode(a["q"], a["k"], a["scale"], a["mask"], a["score_mod"],
                         a["num_partitions"], a["return_lse"], a["out"], a["backend"])


def assert_refused(fn, exc, names, out=None):
    """``fn()`` raises ``exc`` (a type or tuple) whose message starts with one of ``names``;
    any other exception propagates (and fails the test); a NumPy ``out`` is untouched."""
    names = (names,) if isinstance(names, str) else tuple(names)
    before = np.array(out, copy=True) if isinstance(out, np.ndarray) else None
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    assert re.match(rf"^(?:{'|'.join(map(re.escape, names))})\b", msg), (
        f"{type(info.value).__name__}({msg!r}) does not start with any of {names}")
    if before is not None:
        # (Byte comparison: NaN-safe, and object or complex sentinels compare too.)
        assert out.tobytes() == before.tobytes() if out.dtype != object else \
            all(a == b for a, b in zip(out.ravel(), before.ravel())), "out was written"
    return info.value


def refuse(entry, p, exc, names, **kw):
    """``invoke`` with a sentinel ``out`` (unless given) that must stay untouched."""
    out = kw.pop("out", None)
    if out is None:
        out = sentinel_out(p)
    return assert_refused(lambda: invoke(entry, p, out=out, **kw), exc, names, out)


entries = st.sampled_from(ENTRIES)
backends = st.sampled_from(BACKENDS)


def draw_problem(data, among=entries, **kw):
    """An entry point drawn from ``among`` and a problem for it (``problems``' keywords)."""
    entry = data.draw(among, "entry")
    return entry, data.draw(problems(entry, **kw), "problem")


def draw_fault(data, faults):
    """``draw_problem``'s entry and problem, and one of ``faults`` to plant in the call."""
    return (*draw_problem(data), data.draw(st.sampled_from(faults), "fault"))


# ---------------------------------------------------------------------------------------------
# q
# ---------------------------------------------------------------------------------------------
Q_FAULTS = ("head_dim", "rank", "batch_or_rows", "sq", "heads", "dtype", "kind")


@fuzz(250)
@given(data=st.data())
def test_fuzz_bad_q(no_launch, data):
    entry, p, fault = draw_fault(data, Q_FAULTS)
    shape, names, exc = list(p.q.shape), ["q"], ValueError
    if fault == "head_dim":
        shape[-1] = data.draw(st.integers(0, 1200).filter(lambda d: d != 576))
        q = np.zeros(shape, p.dtype)
    elif fault == "rank":
        rank = data.draw(st.sampled_from([r for r in range(7) if r != len(shape)]))
        q = np.zeros(data.draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
                     [:-1] + [576] if rank else [], p.dtype)
        if entry in FLARE and rank in (3, 4):      # the rank picks flare's overload
            names.append("valid_length")
    elif fault == "batch_or_rows":
        shape[0] = data.draw(st.integers(0, 6).filter(lambda n: n != p.q.shape[0]))
        q = np.zeros(shape, p.dtype)
        if entry in RAGGED:                       # T must be the offsets' end
            names = [offsets_name(entry)]
    elif fault == "sq":
        if entry in RAGGED:                       # rows per sequence: the offsets' business
            shape[-2] = 0
        else:
            shape[1] = data.draw(st.sampled_from([0, 9, 10, 16, 100]))
        q = np.zeros(shape, p.dtype)
    elif fault == "heads":
        shape[-2] = 0
        q = np.zeros(shape, p.dtype)
    elif fault == "dtype":
        exc = TypeError
        bad = data.draw(st.sampled_from(BAD_DTYPES + [d for d in DTYPES.values()
                                                      if d != p.dtype]))
        q = p.q.astype(bad)
    else:
        exc = TypeError
        q = data.draw(st.sampled_from([None, 3.0, 1, "q", b"q", {}, (1, 2), p.q.tolist(),
                                       [p.q], object()]))
    refuse(entry, p, exc, names, q=q, backend=data.draw(backends))


# ---------------------------------------------------------------------------------------------
# lengths against the query rows (0 < length < rows), at the call
# ---------------------------------------------------------------------------------------------
@fuzz(80)
@given(data=st.data())
def test_fuzz_length_below_query_rows(no_launch, data):
    entry, p = draw_problem(data, min_sq=2, min_len=3)
    counts = p.counts
    candidates = [b for b in range(p.batch) if counts[b] >= 2]
    if not candidates:                            # ragged with at most 1 row per sequence
        return
    b = data.draw(st.sampled_from(candidates))
    lengths = p.lengths.copy()
    lengths[b] = data.draw(st.integers(1, int(counts[b]) - 1))   # fewer keys, same pages
    if entry == "flare_array":
        refuse(entry, p, ValueError, "valid_length", valid_length=lengths)
        return
    if p.cache_kind == "paged":
        cache = nm.PagedKVCache(p.cache.pages, p.cache.block_table, lengths)
    else:
        cache = nm.ContiguousKVCache(p.cache.kv, lengths)
    e = refuse(entry, p, ValueError, "lengths", k=cache, backend=data.draw(backends))
    assert f"lengths[{b}] = {lengths[b]}" in str(e)


# ---------------------------------------------------------------------------------------------
# scale, num_partitions, backend, return_lse
# ---------------------------------------------------------------------------------------------
F32_MAX = float(np.finfo(np.float32).max)
NONFINITE = st.sampled_from([math.nan, math.inf, -math.inf]).flatmap(
    lambda x: st.sampled_from([x, np.float16(x), np.float32(x), np.float64(x)]))
BEYOND_F32 = st.floats(min_value=F32_MAX * 1.0001, allow_infinity=False).flatmap(
    lambda x: st.sampled_from([x, -x, np.float64(x)]))
HUGE_INTS = st.integers(min_value=2**128).flatmap(lambda n: st.sampled_from([n, -n]))
NOT_NUMBERS = st.one_of(
    st.text(max_size=5), st.none(), st.booleans(), st.just(np.bool_(True)),
    st.complex_numbers(allow_nan=False, max_magnitude=10), st.just(np.complex64(1)),
    st.just([0.1]), st.just(np.array(0.1)), st.just(np.array([0.1])), st.just(b"0.1"))


@fuzz(150)
@given(data=st.data())
def test_fuzz_bad_scale(no_launch, data):
    """SPEC: a non-finite scale is an error (finite means finite in float32, where the kernels
    multiply); a non-number is a TypeError. 0 and negative scales are allowed (below)."""
    entry, p = draw_problem(data)
    bad, exc = data.draw(st.one_of(
        st.tuples(st.one_of(NONFINITE, BEYOND_F32, HUGE_INTS), st.just(ValueError)),
        st.tuples(NOT_NUMBERS, st.just(TypeError))), "scale")
    refuse(entry, p, exc, "scale", scale=bad, backend=data.draw(backends))


@fuzz(100)
@given(data=st.data())
def test_fuzz_bad_num_partitions(no_launch, data):
    entry, p = draw_problem(data)
    bad, exc = data.draw(st.one_of(
        st.tuples(st.integers(max_value=0).flatmap(
            lambda n: st.sampled_from([n, np.int64(max(n, -2**63)), np.int32(max(n, -2**31))])),
                  st.just(ValueError)),
        st.tuples(st.one_of(st.floats(), st.booleans(), st.text(max_size=3), st.just(np.float64(2)),
                            st.just(np.bool_(True)), st.just([2]), st.just(2 + 0j)),
                  st.just(TypeError))), "num_partitions")
    refuse(entry, p, exc, "num_partitions", num_partitions=bad, backend=data.draw(backends))


@fuzz(100)
@given(data=st.data())
def test_fuzz_bad_backend(no_launch, data):
    entry, p = draw_problem(data)
    bad = data.draw(st.one_of(
        st.text(max_size=8).filter(lambda s: s not in BACKENDS),
        st.sampled_from(BACKENDS).map(str.upper), st.sampled_from(BACKENDS).map(" {}".format),
        st.sampled_from([None, 0, 1, 2.5, b"simt", ["simt"], ("simt",), {"simt": 1},
                         np.array(["simt"]), np.array(["simt", "mma"])])), "backend")
    refuse(entry, p, ValueError, "backend", backend=bad)


@fuzz(50)
@given(data=st.data())
def test_fuzz_bad_return_lse(no_launch, data):
    entry, p = draw_problem(data, st.sampled_from(["decode", "ragged"]))
    bad = data.draw(st.one_of(st.integers(), st.text(max_size=3), st.none(), st.floats(),
                              st.just(np.array(True)), st.just([True])))
    refuse(entry, p, TypeError, "return_lse", return_lse=bad, backend=data.draw(backends))


FIXED_BAD = {  # argument -> (value, exception): every one is tried for every entry point
    "scale": [(v, ValueError) for v in (math.nan, -math.inf, np.float16("inf"), np.float32("nan"),
                                        10**400, -(10**39), 1e39, -np.float64(3.5e38))]
    + [(v, TypeError) for v in (None, True, np.bool_(False), "0.1", b"0.1", 1j, np.complex64(1),
                                [0.1], np.array(0.1), np.array([0.1]))],
    "num_partitions": [(v, ValueError) for v in (0, -1, np.int64(0), np.int32(-7), -(2**70))]
    + [(v, TypeError) for v in (2.0, np.float64(2), True, np.bool_(True), "2", [2], 2j)],
    "backend": [(v, ValueError) for v in ("", "SIMT", " simt", "simt ", "cuda", "torch", None, 0,
                                          b"simt", ["simt"], ("simt",), np.array(["simt"]),
                                          np.array(["simt", "mma"]), {"simt"})],
    "return_lse": [(v, TypeError) for v in (None, 0, 1, "yes", 1.0, np.array(True), [True])],
}


@pytest.mark.parametrize("arg", sorted(FIXED_BAD))
@pytest.mark.parametrize("entry", ENTRIES)
def test_fixed_bad_values(no_launch, entry, arg, rng):
    """Every listed bad value (hypothesis samples these lists only here and there)."""
    if arg == "return_lse" and entry in FLARE:
        return                                     # flare_mla_decoding has no return_lse
    p = make_problem(rng, 2, 2, 2, [7, 0], BF16,
                     "contiguous" if entry == "flare_array" else "paged", 3,
                     ragged=entry in RAGGED, q_counts=[2, 1])
    for value, exc in FIXED_BAD[arg]:
        refuse(entry, p, exc, arg, **{arg: value})


# ---------------------------------------------------------------------------------------------
# out
# ---------------------------------------------------------------------------------------------
class FakeDeviceArray:
    """Just enough of a device array for the checks: shape, dtype and a CUDA array interface
    describing ``host``'s layout (its pointer is never used: every call here is refused, or
    stopped by the tripwire)."""

    def __init__(self, host, readonly=False):
        self.shape, self.dtype = host.shape, host.dtype
        self.__cuda_array_interface__ = dict(
            shape=host.shape, typestr=host.dtype.str, version=3, data=(0x7F0000000000, readonly),
            strides=None if host.flags.c_contiguous else host.strides)


OUT_FAULTS = ("shape", "rank", "dtype", "kind", "read_only", "device_vs_host",
              "device_strided", "device_read_only")


@fuzz(250)
@given(data=st.data())
def test_fuzz_bad_out(no_launch, data):
    entry, p, fault = draw_fault(data, OUT_FAULTS)
    name, kw = out_name(entry), {"backend": data.draw(backends)}
    shape = list(p.out_shape)
    if fault == "shape":
        axis = data.draw(st.integers(0, len(shape) - 1))
        shape[axis] = data.draw(st.integers(0, 600).filter(lambda n: n != shape[axis]))
        refuse(entry, p, ValueError, name, out=sentinel_out(p, tuple(shape)), **kw)
    elif fault == "rank":
        rank = data.draw(st.sampled_from([r for r in range(6) if r != len(shape)]))
        bad = (shape + [2] * rank)[:rank] if rank > len(shape) else shape[len(shape) - rank:]
        refuse(entry, p, ValueError, name, out=sentinel_out(p, tuple(bad)), **kw)
    elif fault == "dtype":
        dt = data.draw(st.sampled_from(BAD_DTYPES + [d for d in DTYPES.values() if d != p.dtype]))
        refuse(entry, p, TypeError, name, out=sentinel_out(p, dtype=dt), **kw)
    elif fault == "kind":
        bad = data.draw(st.sampled_from([sentinel_out(p).tolist(), 0.0, "out", (1,), {}]))
        refuse(entry, p, TypeError, name, out=bad, **kw)
    elif fault == "read_only":
        out = sentinel_out(p)
        out.flags.writeable = False
        refuse(entry, p, ValueError, name, out=out, **kw)
    elif fault == "device_vs_host":                # a device out for host q, and the reverse
        if data.draw(st.booleans()):
            refuse(entry, p, TypeError, name, out=FakeDeviceArray(sentinel_out(p)), **kw)
        else:
            refuse(entry, p, TypeError, name, q=FakeDeviceArray(p.q), **kw)
    else:                                          # device q and out: out strided or read-only
        if fault == "device_strided":
            wide = list(shape)
            axis = data.draw(st.integers(0, len(shape) - 1))
            wide[axis] *= 2
            view = sentinel_out(p, tuple(wide))[tuple(slice(None, None, 2) if j == axis
                                                      else slice(None) for j in range(len(wide)))]
            if view.flags.c_contiguous:            # an axis of length 1 stays contiguous
                return
            out = FakeDeviceArray(view)
        else:
            out = FakeDeviceArray(sentinel_out(p), readonly=True)
        refuse(entry, p, ValueError, name, q=FakeDeviceArray(p.q), out=out, **kw)


def test_flare_output_none(no_launch, rng):
    p = make_problem(rng, 1, 1, 1, [3], np.float32)
    assert_refused(lambda: invoke("flare", p, out=None), TypeError, "output")


# ---------------------------------------------------------------------------------------------
# Ragged row offsets
# ---------------------------------------------------------------------------------------------
OFFSET_FAULTS = ("decreasing", "too_many_rows", "end", "start", "size", "dtype", "rank", "kind",
                 "int32")


@fuzz(200)
@given(data=st.data())
def test_fuzz_bad_row_offsets(no_launch, data):
    entry, p = draw_problem(data, st.sampled_from(RAGGED))
    fault = data.draw(st.sampled_from(OFFSET_FAULTS), "fault")
    offs, q, exc = p.q_offsets.astype(np.int64), p.q, ValueError
    B, T = p.batch, int(p.q_offsets[-1])
    if fault == "decreasing":                       # the ends right, one step down
        if B < 2:                                   # no inner offset to move
            return
        j = data.draw(st.integers(1, B - 1))
        offs[j] = offs[j + 1] + data.draw(st.integers(1, 5))
    elif fault == "too_many_rows":                  # 9+ rows for one sequence
        b = data.draw(st.integers(0, B - 1))
        extra = data.draw(st.integers(9, 12)) - int(offs[b + 1] - offs[b])
        offs[b + 1:] += extra
        q = np.zeros((int(offs[-1]),) + p.q.shape[1:], p.dtype)
    elif fault == "end":
        offs[-1] = data.draw(st.integers(-3, T + 5).filter(lambda n: n != T and n >= offs[-2]))
    elif fault == "start":
        offs[0] = data.draw(st.integers(-5, 5).filter(lambda n: n != 0 and n <= offs[1]))
    elif fault == "size":
        n = data.draw(st.integers(0, B + 4).filter(lambda n: n != B + 1))
        offs = np.arange(n, dtype=np.int64) if n else np.zeros(0, np.int64)
    elif fault == "dtype":
        exc = TypeError
        offs = offs.astype(data.draw(st.sampled_from(["float32", "float64", "bool", "complex64",
                                                      "object"])))
    elif fault == "rank":
        offs = offs[None] if data.draw(st.booleans()) else np.array(T)
    elif fault == "kind":
        exc = TypeError
        offs = data.draw(st.sampled_from([offs.tolist(), tuple(offs.tolist()), None, 3, "0,1"]))
        if offs is None and entry == "flare_ragged":   # flare: None is "no offsets given"
            exc = ValueError
    else:
        offs = offs.copy()
        offs[-1] = data.draw(st.sampled_from([2**31, 2**40, -(2**31) - 1]))
    refuse(entry, p, exc, offsets_name(entry), q=q, offsets=offs,
           valid_length=offs if entry == "flare_ragged" else None, backend=data.draw(backends))


# ---------------------------------------------------------------------------------------------
# Masks and score mods
# ---------------------------------------------------------------------------------------------
BAD_SIZES = st.one_of(
    st.tuples(st.integers(max_value=0), st.just(ValueError)),
    st.tuples(st.one_of(st.floats(), st.booleans(), st.text(max_size=2), st.none(),
                        st.just(np.float32(4)), st.just([4])), st.just(TypeError)))


@fuzz(100)
@given(bad=BAD_SIZES, which=st.sampled_from(["window", "chunk", "chunk_causal", "alibi", "cap"]))
def test_fuzz_bad_mod_parameters(bad, which):
    value, exc = bad
    make, name = {"window": (nm.SlidingWindowCausalMask, "window"),
                  "chunk": (nm.ChunkedMask, "chunk"),
                  "chunk_causal": (nm.ChunkedCausalMask, "chunk"),
                  "alibi": (nm.AlibiScoreMod, "num_heads"),
                  "cap": (nm.SoftCapScoreMod, "cap")}[which]
    if which == "cap":   # a float parameter: positive finite floats are fine, NaN and inf not
        if isinstance(value, (float, np.floating)):
            if math.isfinite(value) and value > 0:
                return
            exc = ValueError
    assert_refused(lambda: make(value), exc, name)


MOD_FAULTS = ("mask_kind", "mask_is_score_mod", "score_mod_kind", "score_mod_is_mask",
              "mask_arity", "score_mod_arity", "alibi_heads", "bias_shape", "bias_dtype",
              "bias_rank", "combined_bias")


@fuzz(200)
@given(data=st.data())
def test_fuzz_bad_mask_and_score_mod(no_launch, data):
    entry, p, fault = draw_fault(data, MOD_FAULTS)
    kw = {"backend": data.draw(backends)}
    if fault == "mask_kind":
        kw["mask"] = data.draw(st.sampled_from([3, 2.5, "causal", b"x", np.zeros(3, bool), [1]]))
        exc, name = TypeError, "mask"
    elif fault == "mask_is_score_mod":
        kw["mask"] = data.draw(st.sampled_from([nm.IdentityScoreMod(), nm.SoftCapScoreMod(2.0)]))
        exc, name = TypeError, "mask"
    elif fault == "score_mod_kind":
        kw["score_mod"] = data.draw(st.sampled_from([3, "alibi", np.ones(2), [1]]))
        exc, name = TypeError, "score_mod"
    elif fault == "score_mod_is_mask":
        kw["score_mod"] = data.draw(st.sampled_from([nm.CausalMask(), nm.ChunkedMask(2)]))
        exc, name = TypeError, "score_mod"
    elif fault in ("mask_arity", "score_mod_arity"):
        want = 4 if fault == "mask_arity" else 5
        n = data.draw(st.integers(0, 7).filter(lambda n: n != want))
        fn = eval("lambda " + ", ".join(f"a{j}" for j in range(n)) + ": True")  # noqa: S307
        name = fault[:-len("_arity")]
        kw[name], exc = fn, TypeError
    elif fault == "alibi_heads":
        kw["score_mod"] = nm.AlibiScoreMod(data.draw(
            st.integers(1, 200).filter(lambda h: h != p.heads)))
        exc, name = ValueError, "score_mod"
    elif fault == "bias_shape":
        B, H, Sq, S = p.batch, p.heads, p.sq, int(p.lengths.max())
        per_head = data.draw(st.booleans())
        good = [B, H, Sq, S] if per_head else [B, Sq, S]
        axis = data.draw(st.integers(0, len(good) - 1))
        if axis == len(good) - 1:                   # S may exceed the longest length, not fall short
            if S == 0:
                return
            good[axis] = data.draw(st.integers(0, S - 1))
        else:
            good[axis] = data.draw(st.integers(0, 5).filter(lambda n, g=good[axis]: n != g))
        kw["mask"] = nm.MaterializedMask(np.zeros(good, np.float32))
        exc, name = ValueError, "bias"
    elif fault == "bias_dtype":
        dt = data.draw(st.sampled_from(BAD_DTYPES + [BF16, np.dtype(np.float16)]))
        assert_refused(lambda: nm.MaterializedMask(np.zeros((1, 1, 1), dt)), TypeError, "bias")
        return
    elif fault == "bias_rank":
        rank = data.draw(st.sampled_from([0, 1, 2, 5, 6]))
        assert_refused(lambda: nm.MaterializedMask(np.zeros((1,) * rank, np.float32)),
                       ValueError, "bias")
        return
    else:                                           # an additive mask cannot be combined
        bias = nm.MaterializedMask(make_bias(np.random.default_rng(0), p, False))
        other = data.draw(st.sampled_from([nm.CausalMask(), nm.NullMask()]))
        op = data.draw(st.sampled_from(["&", "|", "r&", "r|"]))
        fn = {"&": lambda: bias & other, "|": lambda: bias | other,
              "r&": lambda: other & bias, "r|": lambda: other | bias}[op]
        assert_refused(fn, TypeError, "mask")
        return
    refuse(entry, p, exc, name, **kw)


# ---------------------------------------------------------------------------------------------
# flare_mla_decoding's own arguments
# ---------------------------------------------------------------------------------------------
FLARE_FAULTS = ("valid_length_mismatch", "valid_length_dtype", "valid_length_shape",
                "valid_length_above_S", "k_shape", "k_dtype", "k_kind", "ragged_no_offsets")


@fuzz(150)
@given(data=st.data())
def test_fuzz_bad_flare_arguments(no_launch, data):
    fault = data.draw(st.sampled_from(FLARE_FAULTS), "fault")
    entry = {"valid_length_mismatch": "flare", "ragged_no_offsets": "flare_ragged"}.get(
        fault, "flare_array")
    p = data.draw(problems(entry), "problem")
    kw, exc, name = {"backend": data.draw(backends)}, ValueError, "valid_length"
    S = p.cache.capacity
    if fault == "valid_length_mismatch":            # a cache's lengths rule: others differ
        vl = p.lengths.copy()
        b = data.draw(st.integers(0, p.batch - 1))
        vl[b] = data.draw(st.integers(0, S).filter(lambda n: n != p.lengths[b]))
        kw["valid_length"] = vl
    elif fault == "valid_length_dtype":
        kw["valid_length"] = p.lengths.astype(data.draw(st.sampled_from(
            ["float32", "float64", "bool", "complex64"])))
        exc = TypeError
    elif fault == "valid_length_shape":
        n = data.draw(st.integers(0, 5).filter(lambda n: n != p.batch))
        kw["valid_length"] = np.ones(n, np.int32) if data.draw(st.booleans()) else \
            np.ones((1, p.batch), np.int32)
    elif fault == "valid_length_above_S":
        vl = p.lengths.copy()
        vl[data.draw(st.integers(0, p.batch - 1))] = data.draw(st.integers(S + 1, S + 100))
        kw["valid_length"] = vl
    elif fault == "k_shape":
        kv = p.cache.kv
        shape = data.draw(st.sampled_from([kv.shape, kv.shape[:2] + (2, 576),
                                           kv.shape[:2] + (1, 512), kv.shape[:2] + (1, 1, 576),
                                           (576,)]))
        kw["k"] = np.zeros(shape, p.dtype)
        name = "k"
    elif fault == "k_dtype":
        kw["k"] = p.cache.kv[:, :, None, :].astype(data.draw(st.sampled_from(BAD_DTYPES)))
        exc, name = TypeError, "k"
    elif fault == "k_kind":
        kw["k"] = data.draw(st.sampled_from([None, "kv", 3, p.cache.kv.tolist()]))
        exc, name = TypeError, "k"
    else:
        kw["valid_length"] = None
    refuse(entry, p, exc, name, **kw)


# ---------------------------------------------------------------------------------------------
# Cache constructors
# ---------------------------------------------------------------------------------------------
CACHE_FAULTS = ("storage_shape", "storage_dtype", "storage_kind", "lengths_value",
                "lengths_shape", "lengths_dtype", "lengths_kind", "lengths_int32",
                "block_table_used_entry", "block_table_shape", "block_table_dtype",
                "block_table_kind", "block_table_rows", "page_size")


@fuzz(300)
@given(data=st.data())
def test_fuzz_bad_cache(data):
    kind = data.draw(st.sampled_from(["contiguous", "paged"]), "kind")
    fault = data.draw(st.sampled_from([f for f in CACHE_FAULTS if kind == "paged" or
                                       not f.startswith(("block_table", "page_size"))]), "fault")
    p = data.draw(problems("decode", cache_kind=kind), "problem")
    if kind == "paged":
        a = dict(storage=p.cache.pages, block_table=p.cache.block_table, lengths=p.lengths)
        storage_name = "pages"
    else:
        a = dict(storage=p.cache.kv, lengths=p.lengths)
        storage_name = "kv"
    exc, names = ValueError, ["lengths"]
    cap, B = p.cache.capacity, p.batch
    if fault == "storage_shape":
        shape = list(a["storage"].shape)
        choice = data.draw(st.sampled_from(["width", "rank"]))
        if choice == "width":
            shape[-1] = data.draw(st.integers(0, 1200).filter(lambda d: d != 576))
        else:
            rank = data.draw(st.sampled_from([0, 1, 2, 4, 5]))
            shape = ([2] * rank)[:-1] + [576] if rank else []
        a["storage"], names = np.zeros(shape, p.dtype), [storage_name]
        if kind == "paged" and len(shape) == 3 and shape[1] == 0:
            names = ["page_size"]
    elif fault == "storage_dtype":
        a["storage"] = a["storage"].astype(data.draw(st.sampled_from(BAD_STORAGE_DTYPES)))
        exc, names = TypeError, [storage_name]
    elif fault == "storage_kind":
        a["storage"] = data.draw(st.sampled_from([None, a["storage"].tolist(), 3.0, "kv"]))
        exc, names = TypeError, [storage_name]
    elif fault == "lengths_value":
        lengths = p.lengths.astype(np.int64)
        b = data.draw(st.integers(0, B - 1))
        lengths[b] = data.draw(st.one_of(st.integers(-2**31, -1), st.integers(cap + 1, 2**31 - 1)))
        a["lengths"] = lengths
    elif fault == "lengths_shape":
        n = data.draw(st.integers(0, 5).filter(lambda n: n != B))
        a["lengths"] = np.zeros(n, np.int32) if data.draw(st.booleans()) else \
            np.zeros((1, B), np.int32)
    elif fault == "lengths_dtype":
        a["lengths"] = p.lengths.astype(data.draw(st.sampled_from(
            ["float16", "float32", "float64", "bool", "complex64", "object"])))
        exc = TypeError
    elif fault == "lengths_kind":
        a["lengths"] = data.draw(st.sampled_from([p.lengths.tolist(), None, 3, "7"]))
        exc = TypeError
    elif fault == "lengths_int32":
        lengths = p.lengths.astype(np.int64)
        lengths[data.draw(st.integers(0, B - 1))] = data.draw(st.sampled_from([2**31, 2**40]))
        a["lengths"] = lengths
    elif fault == "block_table_used_entry":
        used = [(b, j) for b in range(B) for j in range(-(-int(p.lengths[b]) // p.page_size))]
        if not used:
            return
        b, j = data.draw(st.sampled_from(used))
        P = a["storage"].shape[0]
        bt = a["block_table"].copy()
        bt[b, j] = data.draw(st.one_of(st.integers(P, 2**31 - 1), st.integers(-2**31, -1)))
        a["block_table"], names = bt, ["block_table"]
    elif fault == "block_table_shape":
        a["block_table"] = a["block_table"][0] if data.draw(st.booleans()) else \
            a["block_table"][..., None]
        names = ["block_table"]
    elif fault == "block_table_dtype":
        a["block_table"] = a["block_table"].astype(data.draw(st.sampled_from(
            ["float32", "float64", "bool", "complex64"])))
        exc, names = TypeError, ["block_table"]
    elif fault == "block_table_kind":
        a["block_table"] = data.draw(st.sampled_from([a["block_table"].tolist(), None, 0]))
        exc, names = TypeError, ["block_table"]
    elif fault == "block_table_rows":               # one length per block-table row
        rows = data.draw(st.integers(0, 5).filter(lambda n: n != B))
        a["block_table"] = np.zeros((rows, a["block_table"].shape[1]), np.int32)
        names = ["lengths", "block_table"]
    else:
        a["storage"], names = np.zeros((3, 0, 576), p.dtype), ["page_size"]
    if kind == "paged":
        build = lambda: nm.PagedKVCache(a["storage"], a["block_table"], a["lengths"])  # noqa: E731
    else:
        build = lambda: nm.ContiguousKVCache(a["storage"], a["lengths"])  # noqa: E731
    assert_refused(build, exc, names)


# ---------------------------------------------------------------------------------------------
# What the SPEC does not call an error is accepted
# ---------------------------------------------------------------------------------------------
GOOD_SCALES = st.one_of(
    st.just(0), st.just(0.0), st.just(-0.0),
    st.floats(min_value=-F32_MAX, max_value=F32_MAX, allow_nan=False),
    st.integers(-1000, 1000), st.sampled_from([np.float16(0.5), np.float32(-2), np.int8(3),
                                               np.uint64(1), np.float64(1e-30)]))


@fuzz(60)
@given(data=st.data())
def test_fuzz_unusual_valid_arguments_are_accepted(no_launch, data):
    """The checks accept the call (the tripwire stops it there, with the normalised
    arguments), and the reference backend runs it, writing ``out``."""
    entry, p = draw_problem(data, st.sampled_from(["decode", "ragged"]))
    scale = data.draw(GOOD_SCALES, "scale")
    num_partitions = data.draw(st.one_of(st.none(), st.integers(1, 2**62),
                                         st.just(np.int64(3)), st.just(np.uint8(200))))
    return_lse = data.draw(st.sampled_from([True, False, np.bool_(True)]))
    out = sentinel_out(p)
    if data.draw(st.booleans(), "strided host out"):
        wide = sentinel_out(p, p.out_shape[:-1] + (1024,))
        out = wide[..., ::2]
        assert not out.flags.c_contiguous
    backend = data.draw(st.sampled_from(["auto", "simt", np.str_("simt"), "simple"]))
    cache = p.cache
    if p.cache_kind == "paged" and data.draw(st.booleans(), "junk in unused entries"):
        bt = p.cache.block_table.copy()
        for b in range(p.batch):
            used = -(-int(p.lengths[b]) // p.page_size)
            bt[b, used:] = data.draw(st.integers(-2**31, 2**31 - 1))
        cache = nm.PagedKVCache(p.cache.pages, bt, p.lengths.astype(np.int64))
    kw = dict(k=cache, scale=scale, num_partitions=num_partitions, return_lse=return_lse)
    with pytest.raises(Launched) as info:
        invoke(entry, p, out=out, backend=backend, **kw)
    call = info.value.call
    assert call.scale == float(scale) and call.out is out
    assert call.num_partitions == (None if num_partitions is None else int(num_partitions))
    res = invoke(entry, p, out=out, backend="reference", **kw)
    want = p.run(nm.reference, scale=float(scale))
    got = res[0] if return_lse else res
    assert got is out
    np.testing.assert_array_equal(f64(out), f64(want.astype(p.dtype)))


# ---------------------------------------------------------------------------------------------
# Regressions the fuzzing found (each was another exception, or an accepted bad call)
# ---------------------------------------------------------------------------------------------
def test_regressions_from_fuzzing(no_launch, rng):
    p = make_problem(rng, 2, 1, 2, [7, 3], np.float32, "paged", 3)
    # An int beyond float64 raised OverflowError; 1e39 (inf in float32) was accepted.
    for scale in (10**400, -10**400, 1e39, -np.float64(3.5e38)):
        refuse("decode", p, ValueError, "scale", scale=scale)
    # A read-only out failed after the launch ("assignment destination is read-only").
    out = sentinel_out(p)
    out.flags.writeable = False
    refuse("decode", p, ValueError, "out", out=out, backend="reference")
    # An array backend raised NumPy's "truth value of an array ... is ambiguous".
    refuse("decode", p, ValueError, "backend", backend=np.array(["simt", "mma"]))
    # flare_mla_decoding with a float64 array k blamed "kv", an argument it does not have.
    k = np.zeros((2, 8, 1, 576))
    assert_refused(lambda: nm.flare_mla_decoding(sentinel_out(p), p.q, k, None, None, None, 0.1),
                   TypeError, "k")
    # flare_mla_decoding with a non-array or 5-D q blamed valid_length.
    for q in (p.q.tolist(), p.q[None]):
        assert_refused(lambda: nm.flare_mla_decoding(sentinel_out(p), q, p.cache, None, None,
                                                     np.array([0, 1, 2]), 0.1),
                       (TypeError, ValueError), "q")
    # A paged cache with a length near 2^31: (length + page_size - 1) overflowed int32, so the
    # block-table entries it uses went unchecked. (Zero-stride pages: shape without memory.)
    pages = np.broadcast_to(np.zeros((1, 1, 576), np.float32), (2, 2**30, 576))
    assert_refused(lambda: nm.PagedKVCache(pages, np.array([[0, 5]], np.int32),
                                           np.array([2**31 - 1], np.int32)),
                   ValueError, "block_table")


# ---------------------------------------------------------------------------------------------
# Random valid calls of the FMA kernel (simulator: a few; GPU: more and larger)
# ---------------------------------------------------------------------------------------------
MASKS = {
    "null": lambda p: nm.NullMask(),
    "causal": lambda p: nm.CausalMask(),
    "window": lambda p: nm.SlidingWindowCausalMask(max(1, int(p.lengths.max()) // 3)),
    "chunked_causal": lambda p: nm.ChunkedCausalMask(7),
    "bias": lambda p: nm.MaterializedMask(make_bias(np.random.default_rng(1), p, True)),
}


@st.composite
def valid_calls(draw, max_b, max_h, long_lengths, max_other, max_sq):
    """(problem, mask, num_partitions). One sequence (at a random place) has a length drawn
    from ``long_lengths``, the others 0 or up to ``max_other``: the simulator's cost is their
    32-key tiles, and hypothesis's first (simplest) example still has work to do."""
    B, H = draw(st.integers(1, max_b)), draw(st.integers(1, max_h))
    Sq = draw(st.integers(1, max_sq))
    lengths = draw(st.lists(st.one_of(st.just(0), st.integers(Sq, max(Sq, max_other))),
                            min_size=B, max_size=B))
    lengths[draw(st.integers(0, B - 1))] = draw(long_lengths.filter(lambda n: n >= Sq))
    ragged = draw(st.booleans())
    counts = None
    if ragged:
        counts = [draw(st.integers(0, min(Sq, L) if L else Sq)) for L in lengths]
    dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    kind = draw(st.sampled_from(["paged", "contiguous"]))
    page = draw(st.sampled_from([16, 1, 3, 64]))
    seed = draw(st.integers(0, 2**32 - 1))
    p = make_problem(np.random.default_rng(seed), B, Sq, H, lengths, dtype, kind, page,
                     ragged=ragged, q_counts=counts)
    mask = MASKS[draw(st.sampled_from(sorted(MASKS)))](p)
    num_partitions = draw(st.sampled_from([None, 2, 1, 5]))
    return p, mask, num_partitions


def check_valid_call(p, mask, num_partitions, backend="simt"):
    kw = dict(mask=mask, return_lse=True)
    golden = p.run(nm.reference, **kw)
    low = p.run(nm.reference, compute_dtype=np.float32, **kw)
    out = np.full(p.out_shape, np.nan, p.dtype)
    got, lse = p.run(nm, out=out, num_partitions=num_partitions, backend=backend, **kw)
    assert got is out
    assert_three_way(out, low[0].astype(p.dtype), golden[0], floor=fp32_floor(golden[0]),
                     what="out")
    assert_three_way(lse, low[1], golden[1], floor=fp32_floor(golden[1]), what="lse")


#: Simulator-sized valid calls, three each, the same three for every backend.
SIMULATOR_SETTINGS = settings(max_examples=3, deadline=None, derandomize=True, database=None,
                              suppress_health_check=[HealthCheck.too_slow])
SIMULATOR_CALLS = valid_calls(max_b=2, max_h=2, long_lengths=st.integers(33, 40), max_other=20,
                              max_sq=2)


@pytest.mark.kernel
@SIMULATOR_SETTINGS
@given(case=SIMULATOR_CALLS)
def test_fuzz_valid_calls_simt(case):
    check_valid_call(*case)


@pytest.mark.kernel
@SIMULATOR_SETTINGS
@given(case=SIMULATOR_CALLS)
def test_fuzz_valid_calls_simple(case):
    check_valid_call(*case, backend="simple")


@pytest.mark.gpu
@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=valid_calls(max_b=4, max_h=64, long_lengths=st.integers(1, 2000),
                        max_other=2000, max_sq=4),
       backend=st.sampled_from(["simt", "auto", "simple"]))
def test_gpu_fuzz_valid_calls(case, backend):
    check_valid_call(*case, backend=backend)
