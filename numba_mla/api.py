"""The public entry points: check every argument, then run the chosen backend.

``mla_decode`` (padded q), ``mla_decode_ragged`` (row offsets) and ``flare_mla_decoding``
(Modular MAX's call shape, writing into ``output``). Checks come first and raise before any
launch or write (checks.py); ``"simt"`` (FMA), ``"mma"`` (tensor cores) and ``"auto"`` run the split-K kernels (launch.py),
``"reference"`` the NumPy reference.
"""
import threading
from typing import Any, Callable, Optional

import numpy as np

from . import heuristics, plans, reference
from .arrays import IO_DTYPES, dtype_of, is_array, is_device, shape_of
from .caches import D_QK, ContiguousKVCache, KVCache, check_lengths
from .checks import _check_bias, _check_lengths_vs_rows, check_decode, check_ragged
from .mods import MaskLike, ScoreModLike, as_mask, as_score_mod


def _family(q, cache, scale, mask, score_mod, num_partitions, return_lse, out, backend, entry,
            rows):
    """What a kept plan depends on apart from the lengths (plans.py): the entry point, thread,
    stream, options as (type, value) pairs, the mods' keys, the arrays' layouts and whether q
    and the cache start 16-byte aligned (the tensor-core kernels need it). None when the call
    cannot reuse a plan (host arrays, the reference backend)."""
    if backend == "reference" or not isinstance(cache, KVCache):
        return None
    q_layout, out_layout = plans.layout(q), plans.layout(out)
    if not q_layout or out_layout is False or not cache.layout_key[2]:
        return None
    bias_layout = plans.layout(mask.bias_array())
    if bias_layout is False:
        return None
    aligned = plans.aligned16(q) and plans.aligned16(cache.storage)
    return (entry, threading.get_ident(), plans.stream_of(q), backend,
            (type(num_partitions), num_partitions), (type(return_lse), return_lse),
            (type(scale), scale), mask.cache_key(), score_mod.cache_key(), q_layout,
            out_layout, bias_layout, aligned, cache.layout_key, rows)


def _plan_key(family, cache, mask, counts, num_partitions):
    """A family's key completed by its split-K schedule (chunk, P) for this cache's lengths,
    computed as the selector computes it (heuristics.balanced_split, from the key counts), or
    None while no plan of the family exists (its tile sizes are not known yet). Same lengths,
    same schedule: a result never depends on which plans were kept before."""
    geometry = plans.geometry(family)
    if geometry is None:
        return None
    if num_partitions:
        return family + ((0, int(num_partitions)),)
    block_n, groups = geometry
    schedule = cache.memo(
        ("schedule", mask.cache_key(), counts.tobytes(), block_n, groups),
        lambda: heuristics.balanced_split(
            heuristics.key_counts(mask, cache.lengths_host, counts,
                                  getattr(cache, "position_map", None)), block_n, groups))
    return family + (schedule,)


def _ragged_family(call):
    """``_family`` of a checked ragged call (its rows: the most a sequence has, and whether
    the row offsets live on the device)."""
    rows = (int(np.diff(call.q_offsets_host).max(initial=0)),
            plans.layout(call.q_offsets) or "host")
    return _family(call.q, call.cache, call.scale, call.mask, call.score_mod,
                   call.num_partitions, call.return_lse, call.out, call.backend, "ragged", rows)


def _fast_family(q, cache, scale, mask, score_mod, num_partitions, return_lse, out, backend):
    """``_family`` of an ``mla_decode`` call, from its raw arguments before any check, with the
    mods made of them; None (the checked path) for anything unexpected. A family equals a
    stored one only if every argument's kind, layout and value equals that of an earlier
    call that passed every check."""
    try:
        mask, score_mod = as_mask(mask), as_score_mod(score_mod)
        q_layout = plans.layout(q)
        if not q_layout:
            return None
        family = _family(q, cache, scale, mask, score_mod, num_partitions, return_lse, out,
                         backend, "decode", q_layout[1][1])
        if family is None:
            return None
        hash(family)
    except Exception:  # anything odd: the checked path says what is wrong
        return None
    return family, mask, score_mod


def _values_ok(cache, mask, sq, heads, lengths_name="lengths"):
    """The checks of values a kept plan's key does not cover (the cache's lengths against the
    query count, a bias against the lengths): once per cache object, from its host copies."""
    cache.memo(("rows", sq, lengths_name),
               lambda: _check_lengths_vs_rows(cache, sq, lengths_name) or True)
    if mask.bias_array() is not None:
        cache.memo(("bias", plans.layout(mask.bias_array()), sq),
                   lambda: _check_bias(mask, cache.batch, heads, sq, cache) or True)


def _run(call, family):
    """Run a checked call: the reference, a kept or new plan (device arrays: ``family``), or a
    plan of its own (host arrays: copied in and out on every call anyway)."""
    if call.backend == "reference":  # checked once: the reference runs the checked call
        out, lse = reference.compute(call)
        if call.out is not None:
            call.out[...] = out.astype(call.dtype)
            out = call.out
        else:
            out = out.astype(call.dtype)
        return (out, lse.astype(np.float32)) if call.return_lse else out
    from . import launch

    if family is None:
        return launch.run(call)
    counts = np.diff(call.q_offsets_host) if call.ragged else np.full(call.batch, call.sq)
    key = _plan_key(family, call.cache, call.mask, counts, call.num_partitions)
    plan = None if key is None else plans.lookup(key)
    if plan is None:
        plan = launch.Plan(call)
        spec = plan.spec
        plans.remember(family, (spec.block_n, spec.groups))
        plans.store(family + ((spec.chunk, spec.num_partitions),), plan)
    offsets = None
    if call.ragged:
        offsets = call.q_offsets if is_device(call.q_offsets) else call.q_offsets_host
        if not is_device(offsets):
            from numba import cuda

            offsets = cuda.to_device(offsets)
    return plans.run(plan, call.q, call.cache, call.mask.bias_array(), call.out, offsets,
                     family[2])


def mla_decode(q: Any, cache: KVCache, scale: float, mask: MaskLike = None,
               score_mod: ScoreModLike = None, num_partitions: Optional[int] = None,
               return_lse: bool = False, out: Any = None, backend: str = "auto") -> Any:
    """MLA decode: q [B, Sq, H, 576] against ``cache`` -> out [B, Sq, H, 512] in q's dtype
    (with ``return_lse``: ``(out, lse [B, Sq, H] float32)``). See SPEC.md for the semantics."""
    fast = _fast_family(q, cache, scale, mask, score_mod, num_partitions, return_lse, out,
                        backend)
    if fast is not None:
        family, mask_, _ = fast
        sq = family[-1]
        key = _plan_key(family, cache, mask_, np.full(cache.batch, sq), num_partitions)
        plan = None if key is None else plans.lookup(key)
        if plan is not None:  # the plain call's fast path: see plans.py
            _values_ok(cache, mask_, sq, plan.call.heads)
            return plans.run(plan, q, cache, mask_.bias_array(), out, None, family[2])
    call = check_decode(q, cache, scale, mask, score_mod, num_partitions, return_lse, out, backend)
    return _run(call, fast and fast[0])


def prepare(q: Any, cache: KVCache, scale: float, mask: MaskLike = None,
            score_mod: ScoreModLike = None, num_partitions: Optional[int] = None,
            return_lse: bool = False, out: Any = None,
            backend: str = "auto") -> Callable[[], Any]:
    """``mla_decode`` prepared once for device arrays: returns a callable that enqueues the
    decode on the current stream and returns out (and lse), the same arrays every call. The
    per-call cost is the launches alone; the inputs' contents may change between calls (not
    their addresses), so the call can be captured in a CUDA graph."""
    from . import launch

    call = check_decode(q, cache, scale, mask, score_mod, num_partitions, return_lse, out, backend)
    if call.backend == "reference":
        raise ValueError("backend: prepare() runs a kernel backend ('auto', 'simt', 'mma', "
                         "'simple'), got 'reference'")
    return launch.Decoder(call)


def mla_decode_ragged(q: Any, q_row_offsets: Any, cache: KVCache, scale: float,
                      mask: MaskLike = None, score_mod: ScoreModLike = None,
                      num_partitions: Optional[int] = None, return_lse: bool = False,
                      out: Any = None, backend: str = "auto") -> Any:
    """Ragged MLA decode: q [T, H, 576], sequence b owning rows
    ``q_row_offsets[b]:q_row_offsets[b+1]`` (0 to 8 each) -> out [T, H, 512]."""
    call = check_ragged(q, q_row_offsets, cache, scale, mask, score_mod, num_partitions,
                        return_lse, out, backend)
    return _run(call, _ragged_family(call))


def flare_mla_decoding(output, q, k, mask, score_mod, valid_length, scale, num_partitions=None,
                       backend="auto"):
    """Modular MAX's call shape, writing into ``output``.

    ``k``: a KVCache (its lengths rule) or a ``[B, S, 1, 576]`` array (MAX's second overload).
    Padded q ``[B, Sq, H, 576]``: ``valid_length`` is None or the per-sequence key counts (which
    must agree with a cache's lengths; with an array ``k``, None means all S keys). Ragged q
    ``[T, H, 576]``: ``valid_length`` is the B+1 row offsets. Returns ``output``. Errors name
    this function's arguments (``output``, ``valid_length``)."""
    if output is None:
        raise TypeError("output: expected an array to write into, got None")
    # q's rank picks the overload, so it is checked first (else valid_length would be blamed).
    if not is_array(q):
        raise TypeError(f"q: expected an array, got {type(q).__name__}")
    if len(shape_of(q)) not in (3, 4):
        raise ValueError(f"q: expected shape [B, Sq, H, {D_QK}] or [T, H, {D_QK}] (ragged), "
                         f"got {list(shape_of(q))}")
    ragged = len(shape_of(q)) == 3
    lengths_name = "lengths"  # where the key counts came from, for the errors
    if isinstance(k, KVCache):
        cache = k
        if not ragged and valid_length is not None:
            vl = check_lengths(valid_length, cache.batch, cache.capacity, name="valid_length")
            if not np.array_equal(vl, cache.lengths_host):
                raise ValueError(
                    f"valid_length: expected None or the cache's lengths {cache.lengths_host.tolist()}, "
                    f"got {vl.tolist()}"
                )
    elif is_array(k):
        shape = shape_of(k)
        if len(shape) != 4 or shape[2] != 1 or shape[3] != D_QK:
            raise ValueError(f"k: expected a KV cache or an array [B, S, 1, {D_QK}], got shape {list(shape)}")
        if dtype_of(k) not in IO_DTYPES:  # named here: the cache built below would say "kv"
            raise TypeError(f"k: expected dtype bfloat16, float16 or float32, got {dtype_of(k)}")
        if ragged or valid_length is None:
            lengths = np.full(shape[0], shape[1], np.int32)
        else:
            lengths = check_lengths(valid_length, shape[0], shape[1], name="valid_length")
            lengths_name = "valid_length"
        cache = ContiguousKVCache(k[:, :, 0, :], lengths)
    else:
        raise TypeError(f"k: expected a KV cache or an array, got {type(k).__name__}")
    if ragged:
        if valid_length is None:
            raise ValueError("valid_length: ragged q [T, H, 576] needs the B+1 row offsets, got None")
        call = check_ragged(q, valid_length, cache, scale, mask, score_mod, num_partitions,
                            False, output, backend, out_name="output", offsets_name="valid_length",
                            lengths_name=lengths_name)
        _run(call, _ragged_family(call))
    else:
        call = check_decode(q, cache, scale, mask, score_mod, num_partitions, False, output,
                            backend, out_name="output", lengths_name=lengths_name)
        fast = _fast_family(q, cache, scale, mask, score_mod, num_partitions, False, output,
                            backend)
        _run(call, fast and fast[0])
    return output
