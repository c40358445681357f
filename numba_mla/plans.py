"""The plain call is the fast call: plans reused across calls of the same layouts.

A ``launch.Plan`` holds everything of a call that does not depend on the data: the checked
configuration, the chosen and compiled kernels, their packed parameters, grid and workspace.
``mla_decode`` (and its ragged and MAX-shaped siblings) on device arrays looks its plan up here
by a key of what the plan depends on:

- the entry point, the calling thread and stream, the options (backend, num_partitions,
  return_lse, scale), the mask's and score mod's cache keys;
- the *layouts* (array kind, shape, strides, dtype, device) of q, out and the cache's arrays,
  not their addresses (only whether q and the cache start 16-byte aligned): a decode loop's
  new q or new output each step hits the same plan;
- the split-K schedule (chunk, P) that the call's lengths get (heuristics.balanced_split over
  the key counts, for the tile size of the kernel the plan's *family* runs: everything above
  is the family). Lengths that change by a few tokens keep the schedule and so the plan; the
  same inputs always run the same schedule (bit-identical results, whatever plans were kept
  before). The schedule is computed once per cache object (its host lengths).

A cache object remembers the plans its own calls found (``kept``, at most PLANS_PER_CACHE,
weakly: a plan the shared store dropped is gone from there too), keyed by the call's other
arguments alone: a decode loop's repeated call finds its plan in one dict lookup, without
rebuilding the family or the schedule. (Such a hit does not refresh the plan's place in the
shared store's order: a plan used only through its cache object is dropped first there when
more than MAX_PLANS are made, and is made again by the next call.)

On a hit the plan's array arguments are re-pointed at this call's arrays (launch.Plan.rebind:
on a GPU a few integers in the packed parameters; the cache's arrays only when the cache
object is not the one the plan ran last), a new output is allocated (unless ``out`` was
given), and the kernels are enqueued: no device-to-host copy, no synchronisation. Checks
that depend on values (lengths against query counts, a bias against the lengths) run once
per cache object, on the host copies it made when it was built, before any plan is kept for
it.

The cache holds at most ``MAX_PLANS`` plans (least recently used dropped first) and is shared
by all threads (the thread is part of the key: a plan's workspace and parameters are used by
one thread at a time). NumPy inputs do not come here: they are copied to the device and back
on every call anyway.
"""
import threading
import weakref
from collections import OrderedDict

import numpy as np

from . import _compat
from .arrays import data_ptr, is_torch

#: Plans kept (each holds its compiled kernels' parameters and, split-K, a workspace view).
MAX_PLANS = 64
#: Plans a cache object remembers for its own calls (``kept``), most recent last.
PLANS_PER_CACHE = 4

_lock = threading.Lock()
_generation = [0]  # bumped by clear(): what cache objects remember from before is dropped
_plans = OrderedDict()
_geometry = {}  # family -> (keys a tile, row groups, rows, slots) of the kernel its plans run
_stream_queries = {}


def layout(x):
    """A hashable description of a device array's layout, None for None, False for anything
    the fast path does not take (host arrays)."""
    if x is None:
        return None
    if is_torch(x):
        if not x.is_cuda:
            return False
        return ("torch", x.shape, x.stride(), x.dtype, x.get_device())  # (Size: a tuple)
    if isinstance(x, np.ndarray) or not hasattr(x, "strides"):
        return False
    # Numba device arrays (the simulator's too) and CuPy arrays
    if not (hasattr(x, "__cuda_array_interface__") or hasattr(x, "copy_to_host")):
        return False
    # (the dtype by its number: str() and hash() of a NumPy dtype cost microseconds)
    return (type(x).__name__, tuple(x.shape), tuple(x.strides), x.dtype.num)


def stream_of(q):
    """The raw handle of the stream a call on ``q`` is ordered on (launch.current_stream),
    through a query made once per device."""
    if _compat.SIMULATOR or not is_torch(q):
        return 0
    dev = q.device.index
    query = _stream_queries.get(dev)
    if query is None:
        from . import launch

        query = _stream_queries[dev] = launch._stream_query(q)
    return query()


def aligned16(x):
    """Whether a device array starts 16-byte aligned (always, in the simulator)."""
    return _compat.SIMULATOR or data_ptr(x) % 16 == 0


def geometry(family):
    """(keys a tile, row groups, query rows of the longest sequence, blocks that run at once,
    whether the listed schedule may run) of the kernel a family's plans run, once one was
    built: what the split-K schedule of a new call of the family is computed from (as the
    selector computes it)."""
    return _geometry.get(family)


def remember(family, geometry):
    with _lock:
        if len(_geometry) >= 4 * MAX_PLANS:
            _geometry.clear()
        _geometry[family] = geometry


def lookup(key):
    with _lock:
        plan = _plans.get(key)
        if plan is not None:
            _plans.move_to_end(key)
        return plan


def store(key, plan):
    with _lock:
        _plans[key] = plan
        _plans.move_to_end(key)
        while len(_plans) > MAX_PLANS:
            _plans.popitem(last=False)


def kept(cache, key):
    """The plan a call of ``key`` (api._call_key) on this cache object found last, if it is
    still kept: everything else a plan depends on (the cache's layouts, the split-K schedule
    of its lengths, the value checks) is fixed for the cache object, so one dict lookup finds
    it."""
    hit = cache._plans.get(key)
    if hit is not None and hit[0] == _generation[0]:
        return hit[1]()  # (None once the plan was dropped)
    return None


def keep(cache, key, plan):
    """Remember ``plan`` for this cache object's calls of ``key`` (at most PLANS_PER_CACHE, the
    first remembered dropped first). Weakly: the shared store alone keeps plans alive (its
    bound, MAX_PLANS, bounds their memory), and a cache object does not keep itself alive
    through the plans that hold it."""
    with _lock:
        mine = cache._plans
        mine.pop(key, None)
        while len(mine) >= PLANS_PER_CACHE:
            del mine[next(iter(mine))]
        mine[key] = (_generation[0], weakref.ref(plan))


def clear():
    """Drop every kept plan (their kernels stay compiled)."""
    with _lock:
        _plans.clear()
        _geometry.clear()
        _generation[0] += 1


def size():
    with _lock:
        return len(_plans)


def run(plan, q, cache, bias, out, offsets, stream):
    """Run a kept plan on this call's arrays; returns out (and lse) as ``mla_decode`` does."""
    call = plan.call
    plan.rebind("q", q)
    if plan.cache is not cache:  # (a cache object's arrays never change)
        plan.cache = None  # until all three are bound (a failure between leaves them mixed)
        plan.rebind("storage", cache.storage)
        plan.rebind("lengths", cache.device_lengths())
        if cache.block_table is not None:
            plan.rebind("block_table", cache.device_block_table())
        plan.cache = cache
    if bias is not None:
        plan.rebind("bias", bias)
    if offsets is not None:
        plan.rebind("offsets", offsets)
    result = out if out is not None else plan.new_out(q)
    plan.rebind("out", result)
    lse = None
    if call.return_lse:
        from . import launch

        lse = launch._empty_lse_like_caller(q, call.out_shape[:-1])
        plan.rebind("lse", lse)
    plan.launch(stream)
    return (result, lse) if call.return_lse else result
