"""Decode context parallel: one sequence's cache spread over the ranks of a torch.distributed
group, by token.

Rank r of N holds a shard of every sequence's cache (sharding.py): token t on rank t % N
(interleaved, as vLLM lays it out) or tokens [r C, (r + 1) C) (blocks of C). A decode is then
split-K one level up:

1. (``q_heads="local"``) each rank holds the queries of its H / N heads; an all-gather over
   the group gives every rank all H heads;
2. each rank decodes its shard: ``mla_decode(q, shard, ..., return_lse=True)``, the masks and
   score mods seeing global key positions, the queries at their global positions;
3. the ranks exchange (out, lse): an all-gather (every rank gets all heads, ``out_heads="all"``)
   or an all-to-all over head groups (each rank gets its H / N heads, ``out_heads="local"``,
   the reduce-scatter form: 1/N of the traffic);
4. the N partial results of each row are merged by log-sum-exp with the library's split-K
   combine kernel (kernels/combine.py), on the device: out = sum_r w_r o_r / sum_r w_r with
   w_r = exp(lse_r - max lse). A shard without a key of the sequence (lengths below N) has
   lse = -inf: weight 0, never NaN.

The partial outputs travel in q's dtype (as in vLLM) and are merged in fp32; the LSEs travel
in fp32. Communication goes on the current stream (torch's, for NCCL): the call enqueues
work and does not synchronise. With ``check=False`` (after one checked call) the call is a
fixed sequence of collectives and kernel launches on fixed-size buffers, which is what a CUDA
graph capture of an NCCL group needs (``check=True`` exchanges Python objects: not
capturable). The gloo backend serves CPU tensors (tests, in Numba's CUDA simulator); an NCCL
group serves CUDA tensors. Padded q [B, Sq, H, 576] only.
"""
import numpy as np

from . import _compat  # noqa: F401
from . import factory, heuristics
from .api import mla_decode
from .arrays import BF16, dtype_of, is_device, is_torch, shape_of, to_host
from .caches import D_QK, D_V, KVCache
from .checks import check_decode
from .positions import PositionMap
from numba import cuda


# ---------------------------------------------------------------------------------------------
# The merge: N partial (out, lse) per row -> the whole, on the device
# ---------------------------------------------------------------------------------------------
def merge(outs, lses, dtype=None):
    """Merge partial results: ``outs`` [N, ..., 512] (each normalised over its own keys),
    ``lses`` [N, ...] (natural log; -inf: no key) -> (out [..., 512] in ``dtype``, default
    outs' dtype; lse [...] float32), with the split-K combine kernel. Torch CUDA tensors stay
    on the device (current stream) and come back as torch tensors; host arrays (NumPy, torch
    CPU) are merged on the device (or in the simulator) and come back as NumPy arrays."""
    from .kernels import combine
    from .launch import _as_device, current_stream

    shape = tuple(shape_of(outs))
    if len(shape) < 2 or shape[-1] != D_V or tuple(shape_of(lses)) != shape[:-1]:
        raise ValueError(f"outs, lses: expected shapes [N, ..., {D_V}] and [N, ...], got "
                         f"{list(shape)} and {list(shape_of(lses))}")
    n, rows = shape[0], int(np.prod(shape[1:-1], dtype=np.int64))
    dtype = np.dtype(dtype_of(outs) if dtype is None else dtype)
    tag = factory.dtype_tag(dtype)
    sixteen = tag != "f32"
    on_device = is_torch(outs) and is_device(outs)
    if on_device:
        import torch

        part_out = outs.reshape(n, rows, D_V).transpose(0, 1).to(torch.float32).contiguous()
        part_lse = lses.reshape(n, rows).transpose(0, 1).to(torch.float32).contiguous()
        out = torch.empty((rows, D_V), dtype=_torch_dtype(dtype), device=outs.device)
        lse = torch.empty((rows,), dtype=torch.float32, device=outs.device)
        args = (_as_device(part_out, False), _as_device(part_lse, False),
                _as_device(out, sixteen), _as_device(lse, False))
    else:
        part_out = np.ascontiguousarray(
            np.asarray(to_host(outs), np.float32).reshape(n, rows, D_V).transpose(1, 0, 2))
        part_lse = np.ascontiguousarray(
            np.asarray(to_host(lses), np.float32).reshape(n, rows).T)
        out = cuda.device_array((rows, D_V), np.int16 if sixteen else np.float32)
        lse = cuda.device_array((rows,), np.float32)
        args = (cuda.to_device(part_out), cuda.to_device(part_lse), out, lse)
    if rows:
        po, pl, o, ls = args  # the kernel's view: T = rows, H = 1, P = N
        few, groups = combine.variant(rows, n, heuristics.sm_count())
        stream = current_stream(outs) if on_device else 0
        if stream:
            stream = cuda.external_stream(stream)
        factory.combine_kernel(tag, few=few)[(rows, 1), (combine.NTHREADS, groups), stream](
            po.reshape((rows, 1, n, D_V)), pl.reshape((rows, 1, n)),
            o.reshape((rows, 1, D_V)), ls.reshape((rows, 1)))
    if on_device:
        return out.reshape(shape[1:]), lse.reshape(shape[1:-1])
    host = out.copy_to_host()
    return (host.view(dtype) if sixteen else host).reshape(shape[1:]), \
        lse.copy_to_host().reshape(shape[1:-1])


def _torch_dtype(dtype):
    import torch

    return {BF16: torch.bfloat16, np.dtype(np.float16): torch.float16,
            np.dtype(np.float32): torch.float32}[np.dtype(dtype)]


def _as_torch(x, like):
    """A result of mla_decode (torch already, or NumPy for a host caller) as a torch tensor
    on ``like``'s device."""
    import torch

    if is_torch(x):
        return x
    x = np.ascontiguousarray(x)
    if x.dtype == BF16:
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).to(like.device)
    return torch.from_numpy(x).to(like.device)


# ---------------------------------------------------------------------------------------------
# Collectives
# ---------------------------------------------------------------------------------------------
def _all_gather(x, group, world):
    """[N, *x.shape]: every rank's x, in rank order."""
    import torch
    import torch.distributed as dist

    x = x.contiguous()
    out = torch.empty((world,) + tuple(x.shape), dtype=x.dtype, device=x.device)
    if x.is_cuda:  # NCCL: one buffer, no list of tensors
        dist.all_gather_into_tensor(out, x, group=group)
    else:
        dist.all_gather(list(out.unbind(0)), x, group=group)
    return out


def _all_to_all(x, group, world):
    """``x`` [N, ...]: chunk s goes to rank s; returns [N, ...], chunk s from rank s."""
    import torch
    import torch.distributed as dist

    x = x.contiguous()
    out = torch.empty_like(x)
    # The single-tensor form: NCCL and gloo both have it (gloo's list form came late)
    dist.all_to_all_single(out, x, group=group)
    return out


# ---------------------------------------------------------------------------------------------
# Checks: the same verdict on every rank
# ---------------------------------------------------------------------------------------------
def _describe(q, shard, q_heads, out_heads, group, dist, decode_args):
    """What this rank's call looks like, and what is wrong with it locally (or None). With
    all heads at hand (``q_heads="all"``) the decode's own checks run here too, so that a bad
    scale, mask or bias is refused on every rank, not on one while the others wait."""
    d = dict(problem=None, positions=None, lengths=None, q=None)
    try:
        if not is_torch(q):
            raise TypeError(f"q: expected a torch tensor, got {type(q).__name__}")
        if not isinstance(shard, KVCache):
            raise TypeError(f"cache: expected a KV cache (a shard: sharding.shard_cache), got "
                            f"{type(shard).__name__}")
        if q_heads not in ("all", "local") or out_heads not in ("all", "local"):
            raise ValueError(f"q_heads, out_heads: expected 'all' or 'local', got "
                             f"{q_heads!r}, {out_heads!r}")
        backend = str(dist.get_backend(group)).lower()
        device = q.device.type
        if backend == "gloo" and device != "cpu":
            raise ValueError(f"group: a gloo group carries CPU tensors (merged in Numba's CUDA "
                             f"simulator); q is on {device}: use an NCCL group for CUDA tensors")
        if backend == "nccl" and device != "cuda":
            raise ValueError(f"group: an NCCL group carries CUDA tensors; q is on {device}: "
                             f"use a gloo group for CPU tensors")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"group: expected an NCCL or gloo group, got {backend}")
        if len(q.shape) != 4 or q.shape[-1] != D_QK:
            raise ValueError(f"q: expected shape [B, Sq, H, {D_QK}], got {list(q.shape)}")
        if q_heads == "all":
            check_decode(to_host(q) if device == "cpu" else q, shard, *decode_args)
        pm = getattr(type(shard), "position_map", None) or PositionMap()
        d.update(positions=(pm.stride, pm.offset, pm.capacity),
                 lengths=shard.lengths_host.tolist(),
                 q=(tuple(q.shape), str(q.dtype), q.device.type))
    except (TypeError, ValueError) as e:
        d["problem"] = f"{type(e).__name__}: {e}"
    return d


def _verdict(descs):
    """The first problem of the group's calls (the same text on every rank), or None."""
    world = len(descs)
    for r, d in enumerate(descs):
        if d["problem"]:
            return f"rank {r}: {d['problem']}"
    d0 = descs[0]
    for r, d in enumerate(descs):
        if d["lengths"] != d0["lengths"]:
            return (f"lengths: the ranks must agree on the global lengths; rank 0 has "
                    f"{d0['lengths']}, rank {r} {d['lengths']}")
        if d["q"] != d0["q"]:
            return f"q: the ranks must agree on q's shape, dtype and device; rank 0 has " \
                   f"{d0['q']}, rank {r} {d['q']}"
    strides = {d["positions"][0] for d in descs}
    caps = {d["positions"][2] for d in descs}
    offsets = [d["positions"][1] for d in descs]
    layouts = ", ".join(f"rank {r}: stride {s}, offset {o}, block {c}"
                        for r, (s, o, c) in enumerate(d["positions"] for d in descs))
    interleaved = strides == {world} and caps == {None} and offsets == list(range(world))
    cap = next(iter(caps))
    blocks = (strides == {1} and len(caps) == 1 and cap is not None
              and offsets == [r * cap for r in range(world)])
    if world > 1 and not (interleaved or blocks):
        return (f"cache: the shards' layouts do not make one cache of {world} ranks (rank r "
                f"must hold global keys j * {world} + r, or [r * C, (r + 1) * C) with one C); "
                f"got {layouts}")
    if blocks and d0["lengths"] and max(d0["lengths"]) > world * cap:
        return (f"lengths: {max(d0['lengths'])} keys do not fit {world} blocks of {cap}")
    return None


# ---------------------------------------------------------------------------------------------
# The call
# ---------------------------------------------------------------------------------------------
def decode(q, shard, scale, group=None, mask=None, score_mod=None, *, q_heads="all",
           out_heads="all", return_lse=False, num_partitions=None, backend="auto",
           check=True):
    """Decode context parallel over ``group`` (default: the world group).

    ``q``: torch [B, Sq, H, 576] (``q_heads="all"``) or this rank's heads
    [B, Sq, H / N, 576] (``q_heads="local"``: rank r holds heads [r H / N, (r + 1) H / N),
    gathered inside); ``shard``: this rank's cache (``sharding.shard_cache``); the ranks'
    shards must make one cache (interleaved: rank r holds global keys j N + r; or blocks of
    one size C in rank order) and agree on the global lengths. ``mask``, ``score_mod``,
    ``scale``, ``num_partitions``, ``backend``: as for ``mla_decode`` (global positions).

    Returns out [B, Sq, H, 512] (``out_heads="all"``) or this rank's heads [B, Sq, H / N,
    512] (``out_heads="local"``), in q's dtype, on q's device; with ``return_lse`` also the
    global LSE (float32). ``check``: first compare every rank's call (an object all-gather,
    not capturable in a CUDA graph); a bad call raises the same error on every rank."""
    import torch.distributed as dist

    if group is None:
        group = dist.group.WORLD
    world = dist.get_world_size(group)
    if check:
        descs = [None] * world
        args = (scale, mask, score_mod, num_partitions, True, None, backend)
        dist.all_gather_object(descs, _describe(q, shard, q_heads, out_heads, group, dist, args),
                               group=group)
        problem = _verdict(descs)
        if problem:
            raise ValueError(f"decode: {problem}")
    B, Sq, Hq = (int(s) for s in q.shape[:3])
    if q_heads == "local":  # [N, B, Sq, H/N, 576] -> [B, Sq, H, 576], rank r's heads r-th
        q = _all_gather(q, group, world).permute(1, 2, 0, 3, 4).reshape(B, Sq, world * Hq, D_QK)
    H = int(q.shape[2])
    if out_heads == "local" and H % world:
        raise ValueError(f"out_heads: 'local' needs H divisible by {world} ranks, got H = {H}")
    # (CPU tensors, gloo: the kernels take NumPy host arrays, copied to the simulator's device)
    out, lse = mla_decode(q if q.is_cuda else to_host(q), shard, scale, mask, score_mod,
                          num_partitions, return_lse=True, backend=backend)
    out, lse = _as_torch(out, q), _as_torch(lse, q)
    if out_heads == "local":  # chunk s of my heads' axis -> rank s: [N, B, Sq, H/N, ...]
        Hl = H // world
        outs = _all_to_all(out.reshape(B, Sq, world, Hl, D_V).permute(2, 0, 1, 3, 4),
                           group, world)
        lses = _all_to_all(lse.reshape(B, Sq, world, Hl).permute(2, 0, 1, 3), group, world)
    else:
        outs, lses = _all_gather(out, group, world), _all_gather(lse, group, world)
    out, lse = merge(outs, lses, dtype_of(q))
    out, lse = _as_torch(out, q), _as_torch(lse, q)
    return (out, lse) if return_lse else out
