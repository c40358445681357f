"""Masks and score mods: each defined once, its NumPy form beside its device form.

Notation (SPEC.md): ``b`` sequence, ``h`` query head, ``q_pos`` absolute query position, ``k``
absolute key position. A mask says which (q_pos, k) pairs are kept; a score mod rewrites the
scaled score ``s``. The reference calls the NumPy forms on broadcast index arrays; the kernel
factory compiles the device forms into the kernel (``device_*`` methods return
``cuda.jit(device=True)`` functions, built fresh from the object's parameters, so nothing is
read from module globals at compile time).

Only the device forms need Numba, and they import it when they are built: the NumPy forms, the
tile rules and so the reference run with NumPy alone.

Beyond the element-wise rule, every mask answers two questions about whole tiles, so kernels
can skip work:

- ``classify(k0, k1, q_lo, q_hi)``: for keys ``[k0, k1)`` and every query position in
  ``[q_lo, q_hi]``, are all pairs kept (``FULL``), none (``EMPTY``) or some (``PARTIAL``)?
  The answer is always sound; for the built-in masks it is exact.
- ``key_range(q_lo, q_hi)``: a half-open interval of key positions outside which nothing is
  kept for those queries (the caller clips it to ``[0, length)``).

Internally every mask is applied through one uniform device signature,
``apply(s, b, h, i, q_pos, k, bias) -> s or -inf (or s + bias)``, where ``i`` is the query's
index within its sequence and ``bias`` is the materialized mask's array (a dummy otherwise).
"""
import inspect
import math
from typing import Any, Callable, Hashable, Union

import numpy as np
from numpy.typing import ArrayLike

from . import _compat  # noqa: F401  (NumPy shim, before a device form imports numba.cuda)

#: Tile classes returned by ``Mask.classify``.
EMPTY, PARTIAL, FULL = 0, 1, 2
#: "No bound" for key ranges (fits int32, so device code stays 32-bit).
KEY_MAX = 2**31 - 1

NEG_INF = -math.inf

#: What the ``device_*`` methods return: a ``cuda.jit(device=True)`` function.
DeviceFunction = Callable[..., Any]
#: A tile rule ``(k0, k1, q_lo, q_hi) -> EMPTY / PARTIAL / FULL``.
TileRule = Callable[[int, int, int, int], int]
#: A key-range rule ``(q_lo, q_hi) -> (k_start, k_end)``.
RangeRule = Callable[[int, int], tuple[int, int]]


def _device(fn: Callable[..., Any]) -> DeviceFunction:
    """``fn`` compiled as a device function. Numba is imported here, when the first device form
    is built, so that nothing else in this module needs it."""
    from numba import cuda

    return cuda.jit(device=True)(fn)


# Tile rules: plain functions of integers. Each serves as the host rule (``classify``,
# ``key_range``) and, compiled by ``_device``, as the device form: one definition, so the two
# can never disagree.
def _partial_tile(k0, k1, q_lo, q_hi):
    return PARTIAL


def _full_tile(k0, k1, q_lo, q_hi):
    return FULL


def _unbounded_range(q_lo, q_hi):
    return 0, KEY_MAX


def _causal_tile(k0, k1, q_lo, q_hi):
    if k0 > q_hi:
        return EMPTY
    return FULL if k1 - 1 <= q_lo else PARTIAL


def _causal_range(q_lo, q_hi):
    return 0, q_hi + 1


# ---------------------------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------------------------
class Mask:
    """Base class. Subclasses define ``keep`` (NumPy) and ``device_keep`` (device), and the
    tile rules when they can say more than "PARTIAL everywhere"."""

    #: Boolean masks compose with ``&``/``|``; the materialized (additive) mask does not.
    boolean = True
    #: True when ``classify`` never says PARTIAL for a tile inside ``key_range`` (NullMask).
    trivial = False

    # -- NumPy forms ----------------------------------------------------------------------
    def keep(self, b: ArrayLike, h: ArrayLike, q_pos: ArrayLike, k: ArrayLike) -> np.ndarray:
        """Boolean array, broadcast over the integer index arrays ``b, h, q_pos, k``."""
        raise NotImplementedError

    def bias(self, b: ArrayLike, h: ArrayLike, i: ArrayLike, q_pos: ArrayLike,
             k: ArrayLike) -> np.ndarray:
        """Additive float64 bias applied after the score mod: 0 where kept, -inf where not."""
        return np.where(self.keep(b, h, q_pos, k), 0.0, -np.inf)

    def classify(self, k0: int, k1: int, q_lo: int, q_hi: int) -> int:
        return self.tile_rule()(k0, k1, q_lo, q_hi)

    def key_range(self, q_lo: int, q_hi: int) -> tuple[int, int]:
        return self.range_rule()(q_lo, q_hi)

    def tile_rule(self) -> TileRule:
        """The plain function ``(k0, k1, q_lo, q_hi) -> EMPTY/PARTIAL/FULL`` behind both
        ``classify`` and ``device_classify``."""
        return _partial_tile

    def range_rule(self) -> RangeRule:
        """The plain function ``(q_lo, q_hi) -> (k_start, k_end)`` behind ``key_range``."""
        return _unbounded_range

    # -- device forms ---------------------------------------------------------------------
    def device_keep(self) -> DeviceFunction:
        """``keep(b, h, q_pos, k) -> bool`` for scalars, compiled."""
        raise NotImplementedError

    def device_apply(self) -> DeviceFunction:
        """``apply(s, b, h, i, q_pos, k, bias) -> s or -inf``, compiled."""
        from numba import float32

        keep = self.device_keep()

        def apply(s, b, h, i, q_pos, k, bias):
            return s if keep(b, h, q_pos, k) else float32(NEG_INF)

        return _device(apply)

    def device_classify(self) -> DeviceFunction:
        return _device(self.tile_rule())

    def device_key_range(self) -> DeviceFunction:
        return _device(self.range_rule())

    # -- identity, composition ------------------------------------------------------------
    def cache_key(self) -> Hashable:
        """Hashable description: equal keys compile to the same kernel."""
        return (type(self).__name__,)

    def bias_array(self) -> Any:
        """The materialized bias, or None."""
        return None

    def __and__(self, other: "MaskLike") -> "AndMask":
        return AndMask(self, as_mask(other))

    def __or__(self, other: "MaskLike") -> "OrMask":
        return OrMask(self, as_mask(other))

    def __rand__(self, other: "MaskLike") -> "AndMask":
        return AndMask(as_mask(other), self)

    def __ror__(self, other: "MaskLike") -> "OrMask":
        return OrMask(as_mask(other), self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NullMask(Mask):
    """Every key is kept."""

    trivial = True

    def keep(self, b, h, q_pos, k):
        return np.ones(np.broadcast_shapes(*(np.shape(a) for a in (b, h, q_pos, k))), bool)

    def tile_rule(self):
        return _full_tile

    def device_keep(self):
        def keep(b, h, q_pos, k):
            return True

        return _device(keep)


class CausalMask(Mask):
    """Keys at or before the query: ``k <= q_pos``."""

    def keep(self, b, h, q_pos, k):
        return np.asarray(k) <= np.asarray(q_pos)

    def tile_rule(self):
        return _causal_tile

    def range_rule(self):
        return _causal_range

    def device_keep(self):
        def keep(b, h, q_pos, k):
            return k <= q_pos

        return _device(keep)


class SlidingWindowCausalMask(Mask):
    """The last ``window`` keys up to the query: ``q_pos - window < k <= q_pos``."""

    def __init__(self, window: int):
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)):
            raise TypeError(f"window: expected an int, got {type(window).__name__}")
        if window <= 0:
            raise ValueError(f"window: expected a positive int, got {window}")
        self.window = int(window)

    def keep(self, b, h, q_pos, k):
        k, q_pos = np.asarray(k), np.asarray(q_pos)
        return (k <= q_pos) & (q_pos - k < self.window)

    def tile_rule(self):
        w = self.window

        def tile(k0, k1, q_lo, q_hi):
            # The kept keys of all queries together form [q_lo - w + 1, q_hi].
            if k0 > q_hi or k1 - 1 < q_lo - w + 1:
                return EMPTY
            return FULL if (k1 - 1 <= q_lo and q_hi - k0 < w) else PARTIAL

        return tile

    def range_rule(self):
        w = self.window

        def key_range(q_lo, q_hi):
            return max(0, q_lo - w + 1), q_hi + 1

        return key_range

    def cache_key(self):
        return (type(self).__name__, self.window)

    def device_keep(self):
        w = self.window

        def keep(b, h, q_pos, k):
            return k <= q_pos and q_pos - k < w

        return _device(keep)

    def __repr__(self):
        return f"SlidingWindowCausalMask({self.window})"


class ChunkedMask(Mask):
    """Query and key in the same chunk of ``chunk`` positions: ``q_pos // c == k // c``."""

    def __init__(self, chunk: int):
        if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)):
            raise TypeError(f"chunk: expected an int, got {type(chunk).__name__}")
        if chunk <= 0:
            raise ValueError(f"chunk: expected a positive int, got {chunk}")
        self.chunk = int(chunk)

    def keep(self, b, h, q_pos, k):
        return np.asarray(q_pos) // self.chunk == np.asarray(k) // self.chunk

    def tile_rule(self):
        c = self.chunk

        def tile(k0, k1, q_lo, q_hi):
            # Queries span chunks [q_lo//c, q_hi//c], keys [k0//c, (k1-1)//c]: some pair shares
            # a chunk iff these intervals meet; all pairs do iff both are one single chunk.
            if (k1 - 1) // c < q_lo // c or k0 // c > q_hi // c:
                return EMPTY
            if k0 // c == (k1 - 1) // c and q_lo // c == q_hi // c and k0 // c == q_lo // c:
                return FULL
            return PARTIAL

        return tile

    def range_rule(self):
        c = self.chunk

        def key_range(q_lo, q_hi):
            return max(0, (q_lo // c) * c), (q_hi // c + 1) * c

        return key_range

    def cache_key(self):
        return (type(self).__name__, self.chunk)

    def device_keep(self):
        c = self.chunk

        def keep(b, h, q_pos, k):
            return q_pos // c == k // c

        return _device(keep)

    def __repr__(self):
        return f"ChunkedMask({self.chunk})"


def _combined_tile_rule(tile_a, tile_b, conjunction):
    """The tile rule of ``a & b`` (``conjunction``) or ``a | b`` from the parts' rules: plain
    rules give the host rule, compiled ones the function to compile for the device. With
    EMPTY < PARTIAL < FULL, a tile of ``a & b`` is kept no more than its less kept part
    (``min``), one of ``a | b`` no less than its more kept part (``max``)."""

    def tile(k0, k1, q_lo, q_hi):
        ca, cb = tile_a(k0, k1, q_lo, q_hi), tile_b(k0, k1, q_lo, q_hi)
        return min(ca, cb) if conjunction else max(ca, cb)

    return tile


def _combined_range_rule(range_a, range_b, conjunction):
    """The key-range rule of ``a & b`` (the intersection of the parts' ranges) or ``a | b``
    (the smallest interval holding both), host or device as ``_combined_tile_rule``."""

    def key_range(q_lo, q_hi):
        a0, a1 = range_a(q_lo, q_hi)
        b0, b1 = range_b(q_lo, q_hi)
        if conjunction:
            return max(a0, b0), min(a1, b1)
        return min(a0, b0), max(a1, b1)

    return key_range


class CombinedMask(Mask):
    """Two boolean masks joined: kept where both keep (``a & b``, ``AndMask``) or where either
    keeps (``a | b``, ``OrMask``). Each form (NumPy, tile rules, device) is made from the
    parts' same form. ``conjunction`` is a constant of the compiled functions, so the branch
    on it is resolved at compile time."""

    #: True for ``a & b``, False for ``a | b`` (set by the two subclasses).
    conjunction = True
    symbol = "&"

    def __init__(self, a: "MaskLike", b: "MaskLike"):
        a, b = as_mask(a), as_mask(b)
        for m in (a, b):
            if not m.boolean:
                raise TypeError(
                    f"mask: {type(m).__name__} is additive and cannot be combined with & or |"
                )
        self.a, self.b = a, b

    def keep(self, b, h, q_pos, k):
        ka, kb = self.a.keep(b, h, q_pos, k), self.b.keep(b, h, q_pos, k)
        return ka & kb if self.conjunction else ka | kb

    def tile_rule(self):
        """The host rule only: a compiled function can call only compiled parts, so
        ``device_classify`` makes the same rule from the parts' device forms."""
        return _combined_tile_rule(self.a.tile_rule(), self.b.tile_rule(), self.conjunction)

    def range_rule(self):
        return _combined_range_rule(self.a.range_rule(), self.b.range_rule(), self.conjunction)

    def device_keep(self):
        ka, kb = self.a.device_keep(), self.b.device_keep()
        if self.conjunction:

            def keep(b, h, q_pos, k):
                return ka(b, h, q_pos, k) and kb(b, h, q_pos, k)  # kb asked only where ka keeps

        else:

            def keep(b, h, q_pos, k):
                return ka(b, h, q_pos, k) or kb(b, h, q_pos, k)  # kb asked only where ka drops

        return _device(keep)

    def device_classify(self):
        return _device(_combined_tile_rule(self.a.device_classify(), self.b.device_classify(),
                                           self.conjunction))

    def device_key_range(self):
        return _device(_combined_range_rule(self.a.device_key_range(),
                                            self.b.device_key_range(), self.conjunction))

    def cache_key(self):
        return (type(self).__name__, self.a.cache_key(), self.b.cache_key())

    def __repr__(self):
        return f"({self.a!r} {self.symbol} {self.b!r})"


class AndMask(CombinedMask):
    """Kept where both masks keep: ``a & b``."""

    conjunction = True
    symbol = "&"


class OrMask(CombinedMask):
    """Kept where either mask keeps: ``a | b``."""

    conjunction = False
    symbol = "|"


class ChunkedCausalMask(AndMask):
    """Same chunk and causal. Classification by the AndMask rule is exact here: the kept keys
    of all queries form one interval, [chunk start of q_lo, q_hi]."""

    def __init__(self, chunk: int):
        chunked = ChunkedMask(chunk)
        super().__init__(chunked, CausalMask())
        self.chunk = chunked.chunk

    def cache_key(self):
        return (type(self).__name__, self.chunk)

    def __repr__(self):
        return f"ChunkedCausalMask({self.chunk})"


class FunctionMask(Mask):
    """A user ``mask_mod(b, h, q_pos, k) -> bool`` (FlexAttention's signature).

    The reference calls it on broadcast NumPy index arrays when it can and element by element
    otherwise; the kernel factory compiles it as a device function."""

    def __init__(self, fn: Callable[[int, int, int, int], bool]):
        if not callable(fn):
            raise TypeError(f"mask: expected a Mask or a callable, got {type(fn).__name__}")
        _check_arity("mask", fn, 4)
        self.fn = fn

    def keep(self, b, h, q_pos, k):
        return _call_elementwise(self.fn, (b, h, q_pos, k), bool)

    def device_keep(self):
        return _device(self.fn)

    def cache_key(self):
        return (type(self).__name__, _function_key(self.fn))

    def __repr__(self):
        return f"FunctionMask({getattr(self.fn, '__qualname__', self.fn)!r})"


class MaterializedMask(Mask):
    """An additive float32 bias ``[B, Sq, S]`` or ``[B, H, Sq, S]`` (absolute key positions),
    added to the score after the score mod; ``-inf`` drops a key. For ragged queries the Sq axis
    is the row's index within its sequence."""

    boolean = False

    def __init__(self, bias: Any):
        from .arrays import dtype_of, is_array, shape_of

        if not is_array(bias):
            raise TypeError(f"bias: expected an array, got {type(bias).__name__}")
        if dtype_of(bias) != np.float32:
            raise TypeError(f"bias: expected dtype float32, got {dtype_of(bias)}")
        if len(shape_of(bias)) not in (3, 4):
            raise ValueError(f"bias: expected shape [B, Sq, S] or [B, H, Sq, S], got {shape_of(bias)}")
        self.array = bias
        self.per_head = len(shape_of(bias)) == 4

    def keep(self, b, h, q_pos, k):
        raise TypeError("MaterializedMask is additive: use bias(), not keep()")

    def bias(self, b, h, i, q_pos, k):
        from .arrays import to_host

        arr = np.asarray(to_host(self.array), np.float64)
        if not self.per_head:
            arr = arr[:, None]
        return arr[b, h if self.per_head else 0, i, k]

    def bias_array(self):
        return self.array

    def device_apply(self):
        from numba import float32

        # A key past the bias's last column (a length raised in device memory after the
        # checks) is dropped: the bias is never read outside its array.
        if self.per_head:

            def apply(s, b, h, i, q_pos, k, bias):
                if k >= bias.shape[3]:
                    return float32(NEG_INF)
                x = bias[b, h, i, k]
                return float32(NEG_INF) if x == NEG_INF else s + x  # dropped even if s is inf/NaN

        else:

            def apply(s, b, h, i, q_pos, k, bias):
                if k >= bias.shape[2]:
                    return float32(NEG_INF)
                x = bias[b, i, k]
                return float32(NEG_INF) if x == NEG_INF else s + x  # dropped even if s is inf/NaN

        return _device(apply)

    def cache_key(self):
        return (type(self).__name__, self.per_head)

    def __repr__(self):
        from .arrays import shape_of

        return f"MaterializedMask(bias of shape {shape_of(self.array)})"


# ---------------------------------------------------------------------------------------------
# Score mods
# ---------------------------------------------------------------------------------------------
class ScoreMod:
    """Base class: ``apply`` (NumPy, broadcasting) and ``device_fn`` (device)."""

    #: The kernel may fold ``scale`` into the exp2 constant only when the mod is the identity.
    identity = False

    def apply(self, s: ArrayLike, b: ArrayLike, h: ArrayLike, q_pos: ArrayLike,
              k: ArrayLike) -> np.ndarray:
        """The modified scores, broadcast over ``s`` and the integer index arrays."""
        raise NotImplementedError

    def device_fn(self) -> DeviceFunction:
        """``score_mod(s, b, h, q_pos, k) -> float`` for scalars, compiled."""
        raise NotImplementedError

    def cache_key(self) -> Hashable:
        return (type(self).__name__,)

    def check_heads(self, num_heads: int) -> None:
        """Raise if the mod cannot serve ``num_heads`` query heads."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class IdentityScoreMod(ScoreMod):
    identity = True

    def apply(self, s, b, h, q_pos, k):
        return s

    def device_fn(self):
        def score_mod(s, b, h, q_pos, k):
            return s

        return _device(score_mod)


def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi slopes (SPEC): ``2^(-8(h+1)/H)`` for power-of-two H; otherwise with P the largest
    power of two below H, ``2^(-8(h+1)/P)`` for h < P and ``2^(-8(2(h-P)+1)/(2P))`` after."""
    h = np.arange(num_heads, dtype=np.float64)
    p = 1 << (num_heads.bit_length() - 1)
    return np.where(h < p, 2.0 ** (-8.0 * (h + 1) / p), 2.0 ** (-8.0 * (2 * (h - p) + 1) / (2 * p)))


class AlibiScoreMod(ScoreMod):
    """``s + slope[h] * (k - q_pos)``: a linear penalty on distance, one slope per head."""

    def __init__(self, num_heads: int):
        if isinstance(num_heads, bool) or not isinstance(num_heads, (int, np.integer)):
            raise TypeError(f"num_heads: expected an int, got {type(num_heads).__name__}")
        if num_heads <= 0:
            raise ValueError(f"num_heads: expected a positive int, got {num_heads}")
        self.num_heads = int(num_heads)

    def slopes(self) -> np.ndarray:
        return alibi_slopes(self.num_heads)

    def apply(self, s, b, h, q_pos, k):
        return s + self.slopes()[h] * (np.asarray(k) - np.asarray(q_pos))

    def check_heads(self, num_heads):
        if num_heads != self.num_heads:
            raise ValueError(
                f"score_mod: AlibiScoreMod was built for num_heads={self.num_heads}, "
                f"but q has {num_heads} heads"
            )

    def device_fn(self):
        from numba import float32

        p = 1 << (self.num_heads.bit_length() - 1)

        def score_mod(s, b, h, q_pos, k):
            if h < p:
                e = float32(-8.0 * (h + 1) / p)
            else:
                e = float32(-8.0 * (2 * (h - p) + 1) / (2 * p))
            return s + math.exp2(e) * float32(k - q_pos)

        return _device(score_mod)

    def cache_key(self):
        return (type(self).__name__, self.num_heads)

    def __repr__(self):
        return f"AlibiScoreMod({self.num_heads})"


class SoftCapScoreMod(ScoreMod):
    """``cap * tanh(s / cap)``: squashes scores into (-cap, cap)."""

    def __init__(self, cap: float):
        if isinstance(cap, bool) or not isinstance(cap, (int, float, np.integer, np.floating)):
            raise TypeError(f"cap: expected a float, got {type(cap).__name__}")
        if not (math.isfinite(cap) and cap > 0):
            raise ValueError(f"cap: expected a finite positive float, got {cap}")
        self.cap = float(cap)

    def apply(self, s, b, h, q_pos, k):
        return self.cap * np.tanh(s / self.cap)

    def device_fn(self):
        from numba import float32

        cap = self.cap
        inv = 1.0 / cap

        def score_mod(s, b, h, q_pos, k):
            return float32(cap) * math.tanh(s * float32(inv))

        return _device(score_mod)

    def cache_key(self):
        return (type(self).__name__, self.cap)

    def __repr__(self):
        return f"SoftCapScoreMod({self.cap})"


class FunctionScoreMod(ScoreMod):
    """A user ``score_mod(s, b, h, q_pos, k) -> float`` (FlexAttention's signature)."""

    def __init__(self, fn: Callable[[float, int, int, int, int], float]):
        if not callable(fn):
            raise TypeError(f"score_mod: expected a ScoreMod or a callable, got {type(fn).__name__}")
        _check_arity("score_mod", fn, 5)
        self.fn = fn

    def apply(self, s, b, h, q_pos, k):
        return _call_elementwise(self.fn, (s, b, h, q_pos, k), np.float64)

    def device_fn(self):
        return _device(self.fn)

    def cache_key(self):
        return (type(self).__name__, _function_key(self.fn))

    def __repr__(self):
        return f"FunctionScoreMod({getattr(self.fn, '__qualname__', self.fn)!r})"


#: What ``mask=`` accepts: a Mask, a ``mask_mod(b, h, q_pos, k)`` callable, or None.
MaskLike = Union[Mask, Callable[[int, int, int, int], bool], None]
#: What ``score_mod=`` accepts: a ScoreMod, a ``score_mod(s, b, h, q_pos, k)`` callable, or None.
ScoreModLike = Union[ScoreMod, Callable[[float, int, int, int, int], float], None]


# ---------------------------------------------------------------------------------------------
# Coercion and helpers
# ---------------------------------------------------------------------------------------------
def as_mask(m: MaskLike) -> Mask:
    """A Mask from a Mask, a ``mask_mod`` callable, or None (NullMask)."""
    if m is None:
        return NullMask()
    if isinstance(m, Mask):
        return m
    if isinstance(m, ScoreMod):
        raise TypeError(f"mask: expected a Mask, got the score mod {m!r}")
    if callable(m):
        return FunctionMask(m)
    raise TypeError(f"mask: expected a Mask or a callable, got {type(m).__name__}")


def as_score_mod(m: ScoreModLike) -> ScoreMod:
    """A ScoreMod from a ScoreMod, a ``score_mod`` callable, or None (identity)."""
    if m is None:
        return IdentityScoreMod()
    if isinstance(m, ScoreMod):
        return m
    if isinstance(m, Mask):
        raise TypeError(f"score_mod: expected a ScoreMod, got the mask {m!r}")
    if callable(m):
        return FunctionScoreMod(m)
    raise TypeError(f"score_mod: expected a ScoreMod or a callable, got {type(m).__name__}")


def _check_arity(name, fn, n):
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    if len(params) != n:
        raise TypeError(f"{name}: expected a function of {n} arguments, got one of {len(params)}")


def _call_elementwise(fn, args, dtype):
    """``fn`` on broadcast arrays if it vectorises, else element by element."""
    shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    full = [np.broadcast_to(np.asarray(a), shape) for a in args]
    try:
        r = np.asarray(fn(*full))
        if r.shape == shape:
            return r.astype(dtype)
    except Exception:
        pass
    r = np.empty(shape, dtype)
    for idx in np.ndindex(*shape):
        r[idx] = fn(*(a[idx].item() for a in full))
    return r


def _function_key(fn):
    """A user function's identity for the kernel cache: its code and its closure's values."""
    code = getattr(fn, "__code__", None)
    cells = tuple(
        c.cell_contents if isinstance(c.cell_contents, (int, float, str, bool)) else id(c.cell_contents)
        for c in (getattr(fn, "__closure__", None) or ())
    )
    return (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None), id(code), cells)
