"""The public entry points: check every argument, then run the chosen backend.

``mla_decode`` (padded q), ``mla_decode_ragged`` (row offsets) and ``flare_mla_decoding``
(Modular MAX's call shape, writing into ``output``). Checks come first and raise before any
launch or write (checks.py); ``"simt"`` (FMA), ``"mma"`` (tensor cores) and ``"auto"`` run the split-K kernels (launch.py),
``"reference"`` the NumPy reference.
"""
import threading
from typing import Any, Callable, Optional

import numpy as np

from . import heuristics, plans, reference, selector
from .arrays import IO_DTYPES, dtype_of, is_array, is_device, shape_of, to_host
from .caches import (D_QK, ContiguousKVCache, KVCache, RaggedKVCache, check_lengths,
                     host_offsets)
from .checks import MAX_SQ, _check_bias, _check_lengths_vs_rows, check_decode, check_ragged
from .config import check_config
from .mods import MaskLike, ScoreModLike, as_mask, as_score_mod
from .selector import check_warp_split


def _call_key(q, scale, mask, score_mod, num_partitions, return_lse, out, backend, entry, rows,
              q_layout=None):
    """What a kept plan depends on apart from the cache and the lengths (plans.py): the entry
    point, thread, stream, options as (type, value) pairs, the mods' keys, the arrays' layouts
    and whether q starts 16-byte aligned (the tensor-core kernels need it). None when the call
    cannot reuse a plan (host arrays, the reference backend). ``q_layout``: plans.layout(q),
    when the caller has it already."""
    if backend == "reference":
        return None
    q_layout, out_layout = q_layout or plans.layout(q), plans.layout(out)
    if not q_layout or out_layout is False:
        return None
    bias_layout = plans.layout(mask.bias_array())
    if bias_layout is False:
        return None
    return (entry, threading.get_ident(), plans.stream_of(q), backend,
            (type(num_partitions), num_partitions), (type(return_lse), return_lse),
            (type(scale), scale), mask.cache_key(), score_mod.cache_key(), q_layout,
            out_layout, bias_layout, plans.aligned16(q), rows)


def _family(call_key, cache):
    """A plan's family (plans.py): ``_call_key`` and the cache's layouts and alignment; None
    when either cannot reuse a plan."""
    if call_key is None or not isinstance(cache, KVCache) or not cache.layout_key[2]:
        return None
    return call_key + (cache.aligned16(), cache.layout_key)


def _plan_key(family, cache, mask, counts, num_partitions, sq=None):
    """A family's key completed by its split-K schedule (chunk, P) for this cache's lengths,
    computed as the selector computes it (heuristics.balanced_split, from the key counts), or
    None while no plan of the family exists (its tile sizes are not known yet). Same lengths,
    same schedule: a result never depends on which plans were kept before."""
    geometry = plans.geometry(family)
    if geometry is None:
        return None
    if num_partitions:
        return family + ((0, int(num_partitions)),)
    block_n, groups, rows, slots, listable = geometry
    counted = ("sq", sq) if counts is None else counts.tobytes()  # (None: Sq rows a sequence)
    schedule = cache.memo(
        ("schedule", mask.cache_key(), counted, block_n, groups, rows, slots, listable,
         selector.SEESAW_RUNS, heuristics.WHOLE_EQUAL, heuristics.MIXED_RUNS),
        lambda: _schedule(heuristics.key_counts(
            mask, cache.lengths_host, np.full(cache.batch, sq) if counts is None else counts,
            getattr(cache, "position_map", None)), block_n, groups, rows, slots, listable))
    return family + (schedule,)


def _schedule(keys, block_n, groups, rows, slots, listable):
    """The split-K schedule the selector picks for these key counts: the balanced one's
    (chunk, P), or the listed one's pieces or the runs schedule's tiles where the family may
    take them and the model prefers them (as the selector decides)."""
    if listable and selector.SEESAW_RUNS:  # (the runs schedule: a function of the tiles)
        return ("runs", (-(-np.asarray(keys, np.int64) // block_n)).tobytes())
    split = heuristics.balanced_split(keys, block_n, groups, sms=slots, rows=rows)
    if listable:
        pieces = heuristics.listed_split(keys, block_n, groups, sms=slots, rows=rows,
                                         balanced=split)
        if selector.runs_table(keys, block_n, groups, slots, rows, split, pieces) is not None:
            return ("runs", (-(-np.asarray(keys, np.int64) // block_n)).tobytes())
        if pieces is not None:
            return ("listed", pieces.tobytes())
    return split


def _ragged_family(call):
    """``_family`` of a checked ragged call (its rows: the most a sequence has, and whether
    the row offsets live on the device)."""
    host = call.q_offsets_host  # (None: device offsets, unread; planned for call.sq rows)
    rows = (int(np.diff(host).max(initial=0)) if host is not None else ("at most", call.sq),
            plans.layout(call.q_offsets) or "host")
    family = _family(_call_key(call.q, call.scale, call.mask, call.score_mod,
                               call.num_partitions, call.return_lse, call.out, call.backend,
                               "ragged", rows), call.cache)
    config, warp_split_k = getattr(call, "config", None), getattr(call, "warp_split_k", False)
    if family and (config is not None or warp_split_k):
        family += ((config, warp_split_k),)
    return family


def _fast_key(q, cache, scale, mask, score_mod, num_partitions, return_lse, out, backend,
              offsets=None):
    """``_call_key`` of an ``mla_decode`` call, from its raw arguments before any check, with
    the mods made of them and the plan the cache object keeps for it (or None); None (the
    checked path) for anything unexpected. A key equals a stored one only if every argument's
    kind, layout and value equals that of an earlier call that passed every check. With
    ``offsets``: an ``mla_decode_ragged`` call whose row offsets are a device array (never
    read on the host, so their layout is all the key holds of them; planned for up to MAX_SQ
    rows a sequence, as check_ragged plans it)."""
    try:
        if not isinstance(cache, KVCache):
            return None
        mask, score_mod = as_mask(mask), as_score_mod(score_mod)
        q_layout = plans.layout(q)
        if not q_layout:
            return None
        if offsets is None:
            entry, rows = "decode", q_layout[1][1]
        else:
            offsets_layout = plans.layout(offsets)
            if not offsets_layout:
                return None
            entry = "ragged"
            rows = (("at most", min(MAX_SQ, q_layout[1][0])), offsets_layout)
        key = _call_key(q, scale, mask, score_mod, num_partitions, return_lse, out, backend,
                        entry, rows, q_layout)
        if key is None:
            return None
        plan = plans.kept(cache, key)  # (hashes the key: an unhashable argument goes below)
    except Exception:  # anything odd: the checked path says what is wrong
        return None
    return key, mask, score_mod, plan


def _values_ok(cache, mask, sq, heads, lengths_name="lengths"):
    """The checks of values a kept plan's key does not cover (the cache's lengths against the
    query count, a bias against the lengths): once per cache object, from its host copies."""
    cache.memo(("rows", sq, lengths_name),
               lambda: _check_lengths_vs_rows(cache, sq, lengths_name) or True)
    if mask.bias_array() is not None:
        cache.memo(("bias", plans.layout(mask.bias_array()), sq),
                   lambda: _check_bias(mask, cache.batch, heads, sq, cache) or True)


def _run(call, family, call_key=None):
    """Run a checked call: the reference, a kept or new plan (device arrays: ``family``), or a
    plan of its own (host arrays: copied in and out on every call anyway). ``call_key``: the
    plain call's ``_call_key``, under which the cache object remembers the plan."""
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
    host = call.q_offsets_host  # (None: padded q, or device offsets: call.sq rows a sequence)
    counts = None if host is None else np.diff(host)
    config = getattr(call, "config", None)
    fixed = call.num_partitions or (config.num_partitions if config is not None else None)
    key = _plan_key(family, call.cache, call.mask, counts, fixed, call.sq)
    plan = None if key is None else plans.lookup(key)
    if plan is None:
        plan = launch.Plan(call)
        spec = plan.spec
        plans.remember(family, (spec.block_n, spec.groups, spec.rows, spec.slots,
                                spec.listable))
        # (the family's first plan: its key now that the geometry is known, as the next
        # call's lookup computes it)
        key = key or _plan_key(family, call.cache, call.mask, counts, fixed, call.sq)
        plans.store(key, plan)
    if call_key is not None:
        plans.keep(call.cache, call_key, plan)
    offsets = None
    if call.ragged:
        offsets = (call.q_offsets if is_device(call.q_offsets)
                   else plan.device_offsets(call.q_offsets_host, call.q))
    return plans.run(plan, call.q, call.cache, call.mask.bias_array(), call.out, offsets,
                     family[2])


def mla_decode(q: Any, cache: KVCache, scale: float, mask: MaskLike = None,
               score_mod: ScoreModLike = None, num_partitions: Optional[int] = None,
               return_lse: bool = False, out: Any = None, backend: str = "auto") -> Any:
    """MLA decode: q [B, Sq, H, 576] against ``cache`` -> out [B, Sq, H, 512] in q's dtype
    (with ``return_lse``: ``(out, lse [B, Sq, H] float32)``). See SPEC.md for the semantics."""
    fast = _fast_key(q, cache, scale, mask, score_mod, num_partitions, return_lse, out, backend)
    if fast is not None:
        key, mask_, _, plan = fast  # plan: this cache object's plan for such calls
        if plan is None:
            family, sq = _family(key, cache), key[-1]
            plan_key = family and _plan_key(family, cache, mask_, None, num_partitions, sq)
            plan = plan_key and plans.lookup(plan_key)
            if plan is not None:
                _values_ok(cache, mask_, sq, plan.call.heads)
                plans.keep(cache, key, plan)
        if plan is not None:  # the plain call's fast path: see plans.py
            return plans.run(plan, q, cache, mask_.bias_array(), out, None, key[2])
    call = check_decode(q, cache, scale, mask, score_mod, num_partitions, return_lse, out, backend)
    return _run(call, fast and _family(fast[0], call.cache), fast and fast[0])


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
    fast = _fast_key(q, cache, scale, mask, score_mod, num_partitions, return_lse, out, backend,
                     q_row_offsets)
    if fast is not None and fast[3] is not None:  # device offsets, a kept plan: see plans.py
        key, mask_, _, plan = fast
        return plans.run(plan, q, cache, mask_.bias_array(), out, q_row_offsets, key[2])
    call = check_ragged(q, q_row_offsets, cache, scale, mask, score_mod, num_partitions,
                        return_lse, out, backend)
    unread = fast is not None and call.q_offsets_host is None  # (host offsets: read each call)
    return _run(call, _ragged_family(call), fast[0] if unread else None)


def _flag(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return bool(value)


def _index_array(name, x):
    """An int32 or uint32 index array as the checks take it: uint32 (MAX's dtype) and device
    arrays other than int32 are read to the host here (values past int32 refused there)."""
    if is_array(x) and is_device(x) and dtype_of(x) == np.uint32:
        return np.asarray(to_host(x))
    return x


def _check_q_max_seq_len(q_max_seq_len, longest):
    if q_max_seq_len is None:
        return
    if isinstance(q_max_seq_len, bool) or not isinstance(q_max_seq_len, (int, np.integer)):
        raise TypeError(f"q_max_seq_len: expected None or an int, got "
                        f"{type(q_max_seq_len).__name__}")
    if not longest <= q_max_seq_len <= np.iinfo(np.int32).max:
        raise ValueError(f"q_max_seq_len: expected at least the longest query run, {longest} "
                         f"(and below 2^31), got {q_max_seq_len}")


def flare_mla_decoding(output, q, k, mask, score_mod, valid_length, scale, num_partitions=None,
                       backend="auto", *, q_max_seq_len=None, kv_input_row_offsets=None,
                       use_score_mod=False, config=None, ragged=None,
                       decoding_warp_split_k=False):
    """Modular MAX's call shape, writing into ``output``; returns ``output``.

    ``k``: a KVCache (its lengths rule), a ``[B, S, 1, 576]`` array (MAX's second overload),
    or, with ``kv_input_row_offsets`` (B+1 int32/uint32), a ragged ``[rows, 1, 576]`` tensor:
    sequence b's keys at rows ``kv_input_row_offsets[b]:kv_input_row_offsets[b+1]``.
    Padded q ``[B, Sq, H, 576]``: ``valid_length`` is None or the per-sequence key counts (which
    must agree with a cache's lengths; with an array ``k``, None means all its keys). Ragged q
    ``[T, H, 576]``: ``valid_length`` is the B+1 row offsets. ``ragged`` (None: from q's rank)
    must agree with q; ``q_max_seq_len``, if given, bounds the longest query run;
    ``score_mod`` runs only with ``use_score_mod=True``; ``config`` (MHAConfig) fixes tiles
    and split-K; ``decoding_warp_split_k`` splits each block's keys over its warps. The
    rules, and every difference from MAX, are in the README ("Porting from Modular MAX").
    Errors name this function's arguments."""
    if output is None:
        raise TypeError("output: expected an array to write into, got None")
    # q's rank picks the overload, so it is checked first (else valid_length would be blamed).
    if not is_array(q):
        raise TypeError(f"q: expected an array, got {type(q).__name__}")
    if len(shape_of(q)) not in (3, 4):
        raise ValueError(f"q: expected shape [B, Sq, H, {D_QK}] or [T, H, {D_QK}] (ragged), "
                         f"got {list(shape_of(q))}")
    q_ragged = len(shape_of(q)) == 3
    if ragged is not None and _flag("ragged", ragged) != q_ragged:
        raise ValueError(f"ragged: {ragged} disagrees with q's shape {list(shape_of(q))} "
                         f"({'[T, H, 576]' if q_ragged else '[B, Sq, H, 576]'}); give "
                         f"ragged={q_ragged} or None")
    ragged = q_ragged
    use_score_mod = _flag("use_score_mod", use_score_mod)
    warp_split_k = _flag("decoding_warp_split_k", decoding_warp_split_k)
    if not use_score_mod and not as_score_mod(score_mod).identity:
        # MAX ignores the functor then; silently dropping a score mod is refused instead
        raise ValueError("use_score_mod: a score_mod was given but use_score_mod is False "
                         "(it runs only when set): pass use_score_mod=True, or no score_mod")
    config, num_partitions = check_config(config, num_partitions)
    valid_length = _index_array("valid_length", valid_length)
    plain = (not ragged and config is None and not warp_split_k and valid_length is None
             and kv_input_row_offsets is None and isinstance(k, KVCache))
    if plain:  # mla_decode(q, k, ..., out=output) in MAX's words: its fast path (plans.py)
        fast = _fast_key(q, k, scale, mask, score_mod, num_partitions, False, output, backend)
        if fast is not None and fast[3] is not None:
            _check_q_max_seq_len(q_max_seq_len, shape_of(q)[1])
            key, mask_, _, plan = fast
            plans.run(plan, q, k, mask_.bias_array(), output, None, key[2])
            return output
    lengths_name = "lengths"  # where the key counts came from, for the errors
    if kv_input_row_offsets is not None:
        if isinstance(k, KVCache):
            raise ValueError("kv_input_row_offsets: given with a KV cache object k; the row "
                             "offsets go with a ragged k tensor [rows, 1, 576] only")
        if not is_array(k):
            raise TypeError(f"k: expected an array, got {type(k).__name__}")
        shape = shape_of(k)
        if len(shape) != 3 or shape[1] != 1 or shape[2] != D_QK:
            raise ValueError(f"k: expected a ragged tensor [rows, 1, {D_QK}] with "
                             f"kv_input_row_offsets, got shape {list(shape)}")
        if dtype_of(k) not in IO_DTYPES:
            raise TypeError(f"k: expected dtype bfloat16, float16 or float32, got {dtype_of(k)}")
        offs = host_offsets("kv_input_row_offsets", kv_input_row_offsets, shape[0])
        batch = len(valid_length) - 1 if ragged and is_array(valid_length) else (
            shape_of(q)[0] if not ragged else None)
        if batch is not None and offs.shape[0] != batch + 1:
            raise ValueError(f"kv_input_row_offsets: expected shape [{batch + 1}] (B+1), got "
                             f"{list(offs.shape)}")
        lengths = None
        if not ragged and valid_length is not None:
            lengths = check_lengths(valid_length, offs.shape[0] - 1,
                                    int(np.diff(offs).max(initial=0)), name="valid_length")
            over = np.nonzero(lengths > np.diff(offs))[0]
            if over.size:
                b = int(over[0])
                raise ValueError(f"valid_length: valid_length[{b}] = {lengths[b]} exceeds "
                                 f"sequence {b}'s {np.diff(offs)[b]} rows of k "
                                 f"(kv_input_row_offsets)")
            lengths_name = "valid_length"
        cache = RaggedKVCache(k, offs, lengths)
    elif isinstance(k, KVCache):
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
        if len(shape) == 3 and shape[1:] == (1, D_QK):
            raise ValueError(f"k: a ragged tensor [rows, 1, {D_QK}] needs kv_input_row_offsets "
                             f"(B+1 row offsets), got None")
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
        _check_q_max_seq_len(q_max_seq_len, 0)  # (its kind and range, before it sizes a plan)
        call = check_ragged(q, valid_length, cache, scale, mask, score_mod, num_partitions,
                            False, output, backend, out_name="output", offsets_name="valid_length",
                            lengths_name=lengths_name, rows_bound=q_max_seq_len)
        _check_q_max_seq_len(q_max_seq_len, call.sq)
        if call.q_offsets_host is None and q_max_seq_len is not None and q_max_seq_len < 1:
            raise ValueError("q_max_seq_len: expected at least 1 with device row offsets "
                             "(they are not read: it sizes the grid), got 0")
        check_warp_split(warp_split_k, call.backend)
        call.config, call.warp_split_k = config, warp_split_k
        _run(call, _ragged_family(call))
    else:
        call = check_decode(q, cache, scale, mask, score_mod, num_partitions, False, output,
                            backend, out_name="output", lengths_name=lengths_name)
        _check_q_max_seq_len(q_max_seq_len, call.sq)
        check_warp_split(warp_split_k, call.backend)
        call.config, call.warp_split_k = config, warp_split_k
        fast = _fast_key(q, cache, scale, mask, score_mod, num_partitions, False, output,
                         backend)
        family = fast and _family(fast[0], cache)
        if family and (config is not None or warp_split_k):  # (mla_decode's have neither)
            family += ((config, warp_split_k),)
        _run(call, family, fast[0] if fast and plain else None)
    return output
