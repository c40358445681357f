"""The NumPy reference: the executable definition of MLA decode (SPEC.md), in float64.

MLA (DeepSeek V2/V3) caches one compressed row per token instead of per-head K and V:

    cache row  = [ latent c_kv (512) | rope k_pe (64) ]              # 576 wide
    K          = the whole row (576),  V = its first 512 dims           # one read serves both

and every query head attends to that one shared row ("absorbed" MLA): q is [.., H, 576], out
is [.., H, 512]. Per sequence b, query row i (absolute position q_pos = length[b] - n + i for
its n query rows), head h:

    s[j]  = scale * q[i, h] . K[j]                  for keys j < length[b]
    s[j]  = score_mod(s[j], b, h, q_pos, j);  dropped keys (mask) -> -inf
    out   = softmax(s) @ V,   lse = log(sum_j exp(s[j]))

A row that keeps no key returns out = 0 and lse = -inf (never NaN).

The entry points take exactly the library's arguments (and check them the same way), so any
call can be replayed here; ``compute_dtype=np.float32`` gives the same-precision run that the
tests use for three-way accuracy checks.

Only NumPy is needed here (with the argument checks, the caches' host side and the mods' NumPy
forms): no Numba, no GPU.
"""
from typing import Any, Optional, Union

import numpy as np
from numpy.typing import ArrayLike

from .arrays import to_host
from .caches import KVCache
from .checks import check_decode, check_ragged
from .constants import D_V
from .mods import Mask, MaskLike, ScoreMod, ScoreModLike

#: What the entry points return: out, or (out, lse) with ``return_lse=True``.
Result = Union[np.ndarray, tuple[np.ndarray, np.ndarray]]


def attend(q: np.ndarray, kv: np.ndarray, b: int, length: int, scale: float, mask: Mask,
           score_mod: ScoreMod, compute_dtype: type[np.floating] = np.float64
           ) -> tuple[np.ndarray, np.ndarray]:
    """Decode one sequence.

    q: [n, H, 576], its n query rows (the last n tokens of the sequence);
    kv: [length, 576], its valid cache rows. Returns out [n, H, 512] and lse [n, H].
    """
    n, heads, _ = q.shape
    K = np.asarray(kv, compute_dtype)                              # [L, 576] 512 latent + 64 rope
    V = K[:, :D_V]                                                 # [L, 512] V = K[..., :512]
    qf = np.asarray(q, compute_dtype)                              # [n, H, 576]
    s = compute_dtype(scale) * (qf @ K.T)                          # [n, H, L] scaled scores

    i = np.arange(n)[:, None, None]                                # [n, 1, 1] row in sequence
    q_pos = length - n + i                                         # [n, 1, 1] absolute position
    h = np.arange(heads)[None, :, None]                            # [1, H, 1]
    k = np.arange(length)[None, None, :]                           # [1, 1, L] absolute key pos
    s = np.asarray(score_mod.apply(s, b, h, q_pos, k), compute_dtype)       # [n, H, L]
    bias = np.asarray(mask.bias(b, h, i, q_pos, k), compute_dtype)         # [n, H, L] -inf: dropped
    # A dropped key is -inf whatever the score mod made of it (+inf + -inf would be NaN).
    with np.errstate(invalid="ignore"):
        s = np.where(np.isneginf(bias), -np.inf, s + bias)                  # [n, H, L]

    # Online-softmax-free form: subtract the row max for stability.
    m = s.max(axis=-1) if length else np.full((n, heads), -np.inf, compute_dtype)  # [n, H]
    empty = np.isneginf(m)                                         # [n, H] no kept key
    m_safe = np.where(empty, 0, m)                                 # [n, H] avoid -inf - -inf
    p = np.exp(s - m_safe[..., None])                              # [n, H, L] 0 where dropped
    l = p.sum(axis=-1)                                             # [n, H]
    # A key the mask drops takes no part: its V row is never multiplied in (0 x NaN would be
    # NaN). A kept key whose score came out -inf still does (0 x its V), as in the kernels.
    finite = np.isfinite(V).all(axis=1)                            # [L] V rows without NaN/inf
    pv = p @ np.where(finite[:, None], V, 0)                       # [n, H, 512] those rows
    if not finite.all():                                           # the others, where kept only
        bad = np.flatnonzero(~finite)                              # [nb]
        kept = ~np.isneginf(bias[..., bad])[..., None]             # [n, H, nb, 1] by the mask
        with np.errstate(invalid="ignore"):
            pv = pv + np.where(kept, p[..., bad, None] * V[bad], 0).sum(axis=-2)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = pv / l[..., None]                                    # [n, H, 512]
        lse = m_safe + np.log(l)                                   # [n, H]
    out = np.where(empty[..., None], 0, out)                       # empty row: out = 0
    lse = np.where(empty, -np.inf, lse)                            #            lse = -inf
    return out.astype(compute_dtype), lse.astype(compute_dtype)


def _finish(call, out: np.ndarray, lse: np.ndarray) -> Result:
    if call.out is not None:
        call.out[...] = out.astype(call.dtype)
    return (out, lse) if call.return_lse else out


def mla_decode(q: Any, cache: KVCache, scale: float, mask: MaskLike = None,
               score_mod: ScoreModLike = None, num_partitions: Optional[int] = None,
               return_lse: bool = False, out: Any = None, backend: str = "reference", *,
               compute_dtype: type[np.floating] = np.float64) -> Result:
    """Reference ``mla_decode``: q [B, Sq, H, 576] -> out [B, Sq, H, 512] (+ lse [B, Sq, H]).

    Returns ``compute_dtype`` arrays (float64 by default); ``num_partitions`` and ``backend``
    are accepted for call compatibility and do not change the result."""
    call = check_decode(q, cache, scale, mask, score_mod, num_partitions, return_lse, out,
                        "reference")
    return _finish(call, *compute(call, compute_dtype))


def compute(call, compute_dtype: type[np.floating] = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """(out, lse) of a checked call (checks.Call), padded or ragged, in ``compute_dtype``:
    what both entry points below and ``backend="reference"`` of the public ones run."""
    cache = call.cache
    qh = to_host(call.q)                                           # [B, Sq, H, 576] or [T, H, 576]
    H = call.heads
    if not call.ragged:
        B, Sq = call.batch, call.sq
        res = np.empty((B, Sq, H, D_V), compute_dtype)             # [B, Sq, H, 512]
        lse = np.empty((B, Sq, H), compute_dtype)                  # [B, Sq, H]
        for b in range(B):
            L = int(cache.lengths_host[b])
            res[b], lse[b] = attend(qh[b], cache.rows(b, L), b, L, call.scale, call.mask,
                                    call.score_mod, compute_dtype)
        return res, lse
    T = qh.shape[0]
    res = np.empty((T, H, D_V), compute_dtype)                     # [T, H, 512]
    lse = np.empty((T, H), compute_dtype)                          # [T, H]
    for b in range(call.batch):
        r0, n = call.rows_of(b)
        if n == 0:
            continue
        L = int(cache.lengths_host[b])
        res[r0:r0 + n], lse[r0:r0 + n] = attend(qh[r0:r0 + n], cache.rows(b, L), b, L,
                                                call.scale, call.mask, call.score_mod,
                                                compute_dtype)
    return res, lse


def mla_decode_ragged(q: Any, q_row_offsets: Any, cache: KVCache, scale: float,
                      mask: MaskLike = None, score_mod: ScoreModLike = None,
                      num_partitions: Optional[int] = None, return_lse: bool = False,
                      out: Any = None, backend: str = "reference", *,
                      compute_dtype: type[np.floating] = np.float64) -> Result:
    """Reference ``mla_decode_ragged``: q [T, H, 576], sequence b owning rows
    ``q_row_offsets[b]:q_row_offsets[b+1]`` -> out [T, H, 512] (+ lse [T, H])."""
    call = check_ragged(q, q_row_offsets, cache, scale, mask, score_mod, num_partitions,
                        return_lse, out, "reference")
    return _finish(call, *compute(call, compute_dtype))


def merge_partitions(outs: ArrayLike, lses: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-partition (out, lse) pairs into the whole by log-sum-exp (what the combine
    kernel does). outs [P, ..., 512] normalised per partition, lses [P, ...]; a partition with
    no kept key has lse = -inf and weight 0; if all are empty, out = 0 and lse = -inf."""
    outs, lses = np.asarray(outs, np.float64), np.asarray(lses, np.float64)
    m = lses.max(axis=0)                                           # [...]
    empty = np.isneginf(m)
    w = np.exp(lses - np.where(empty, 0, m))                       # [P, ...] 0 for empty parts
    total = w.sum(axis=0)                                          # [...]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.einsum("p...,p...d->...d", w, outs) / total[..., None]
        lse = np.where(empty, 0, m) + np.log(total)
    return np.where(empty[..., None], 0, out), np.where(empty, -np.inf, lse)
