"""A configuration's inputs on the device, what a call must move and compute, and its float64
reference.

The paged layout (shuffled block table, unused entries out of range) is the one the tests
build (``numba_mla.testing.paged_layout``); here the data are drawn on the device (torch's
generator) when torch sees a GPU, since the large shapes hold gigabytes, else on the host.
"""
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..arrays import to_host
from ..testing import D_QK, D_V, UNUSED_PAGE, paged_layout  # noqa: F401  (UNUSED_PAGE re-exported)
from .configs import DTYPES, SCALE, make_mask


def count(lengths, sq, heads, mask, itemsize=2, row_bytes=None):
    """(bytes, flops) of one call, counted as docs/performance.md says: the fewest bytes that
    must move (each kept cache row read once, q read, out written) and ``2 * (576 + 512)``
    FLOPs per kept (query row, key) pair, per head. The keys a query keeps are the mask's key
    range cut to the length (exact for the built-in masks). With the null mask and Sq = 1
    this is ``B*L*576*2 + B*H*576*2 + B*H*512*2`` bytes and ``2*B*H*L*(576+512)`` FLOPs.
    ``row_bytes``: a cache row's bytes (default 576 x ``itemsize``; an FP8 row's 576 or 656)."""
    keys_read = pairs = 0
    for L in np.asarray(lengths).tolist():
        if L <= 0:
            continue
        k0, k1 = mask.key_range(L - sq, L - 1)
        keys_read += max(0, min(k1, L) - max(k0, 0))
        for i in range(sq):
            k0, k1 = mask.key_range(L - sq + i, L - sq + i)
            pairs += max(0, min(k1, L) - max(k0, 0))
    B = len(lengths)
    row_bytes = itemsize * D_QK if row_bytes is None else row_bytes
    nbytes = keys_read * row_bytes + itemsize * B * sq * heads * (D_QK + D_V)
    flops = 2 * heads * pairs * (D_QK + D_V)
    return int(nbytes), int(flops)


def draw_lengths(cfg, seed=0):
    """[B] int32 lengths of ``cfg``: all L, or with a spread uniform over
    ``cfg.length_range``, from a generator seeded by ``seed`` and the configuration (the same
    lengths for every provider and every run with that seed)."""
    if not cfg.varlen:
        return np.full(cfg.batch, cfg.seqlen, np.int32)
    lo, hi = cfg.length_range
    rng = np.random.default_rng([seed, cfg.batch, cfg.heads, cfg.seqlen,
                                 int(round(cfg.spread * 1000))])
    return rng.integers(lo, hi + 1, size=cfg.batch).astype(np.int32)


@dataclass
class Problem:
    """One configuration's inputs. ``q``, ``pages``, ``block_table``, ``lengths`` live on the
    device as torch tensors when torch is used, else as NumPy arrays (numba_mla copies those
    in). ``cache`` is the numba_mla PagedKVCache over them: over ``pages`` in q's dtype, or
    over ``codes`` (``pages`` quantized into the configuration's FP8 layout, scale
    ``kv_scale``)."""

    config: Any
    device: Any
    q: Any                      # [B, Sq, H, 576]
    pages: Any                  # [P, page_size, 576]
    block_table: Any            # [B, max_pages] int32 (unused entries UNUSED_PAGE)
    lengths: Any                # [B] int32
    lengths_host: np.ndarray
    block_table_host: np.ndarray
    cache: Any
    mask: Any
    scale: float = SCALE
    ref_seqs: int = 2
    codes: Any = None           # [P, page_size, 576 or 656] FP8 rows (cfg.kv != "same")
    kv_scale: Any = None
    _reference: Any = field(default=None, repr=False)

    @property
    def dtype(self):
        return DTYPES[self.config.dtype]

    @property
    def page_size(self):
        return self.config.page_size

    @property
    def max_len(self):
        """The longest length (the key axis of contiguous copies and biases)."""
        return max(1, int(self.lengths_host.max()))

    @property
    def n_ref(self):
        return min(self.ref_seqs, self.config.batch)

    @property
    def ref_subset(self):
        B, n = self.config.batch, self.n_ref
        return "all" if n == B else f"sequences 0..{n - 1} of {B}, all heads"

    def counts(self):
        """(bytes, flops) of one call on these lengths (``count``)."""
        cfg = self.config
        return count(self.lengths_host, cfg.sq, cfg.heads, self.mask, self.dtype.itemsize,
                     cfg.row_bytes)

    def token_index(self):
        """[B, Lmax] int64 flat row of each token in ``pages.reshape(-1, 576)``; positions past a
        length point at the sequence's first token (finite data, masked by the caller)."""
        B, L, page = self.config.batch, self.max_len, self.page_size
        t = np.arange(L)
        idx = np.empty((B, L), np.int64)
        for b in range(B):
            n = int(self.lengths_host[b])
            tt = np.where(t < n, t, 0)
            idx[b] = self.block_table_host[b, tt // page].astype(np.int64) * page + tt % page
        return idx

    def keep_bias(self):
        """float32 [B, Sq, 1, Lmax]: 0 where query (b, i) keeps key k (mask and length), -inf
        elsewhere; None when every key is kept (null mask, all lengths equal)."""
        cfg = self.config
        L = self.max_len
        lengths = self.lengths_host
        if cfg.mask == "null" and (lengths == L).all():
            return None
        b = np.arange(cfg.batch)[:, None, None]
        q_pos = lengths[:, None, None] - cfg.sq + np.arange(cfg.sq)[None, :, None]
        k = np.arange(L)[None, None, :]
        keep = np.asarray(self.mask.keep(b, 0, q_pos, k)) & (k < lengths[:, None, None])
        return np.where(keep, 0.0, -np.inf).astype(np.float32)[:, :, None, :]

    def reference(self):
        """float64 out [n, Sq, H, 512] of the first ``n_ref`` sequences (computed once); of an
        FP8 cache, on its rows' exact values, as the library defines it."""
        if self._reference is None:
            import numba_mla as nm

            n, page = self.n_ref, self.page_size
            qh = np.asarray(to_host(self.q[:n]))
            lengths = self.lengths_host[:n]
            stored = self.pages if self.codes is None else self.codes
            width = D_QK if self.codes is None else self.config.row_bytes
            kv = np.zeros((n, max(1, int(lengths.max())), width),
                          self.dtype if self.codes is None else np.uint8)
            for b in range(n):
                used = -(-int(lengths[b]) // page)
                rows = np.asarray(self.block_table_host[b, :used], np.int64)
                if self.device.torch is not None:
                    sel = stored[self.device.torch.as_tensor(rows, device=stored.device)]
                else:
                    sel = stored[rows]
                sel = np.asarray(to_host(sel))
                if self.codes is not None:
                    sel = sel.view(np.uint8)
                kv[b, :lengths[b]] = sel.reshape(-1, width)[:lengths[b]]
            fp8 = {} if self.codes is None else dict(kv_scale=self.kv_scale,
                                                     fp8_layout=self.config.kv)
            cache = nm.ContiguousKVCache(kv, lengths, **fp8)
            self._reference = nm.reference.mla_decode(qh, cache, self.scale, mask=self.mask)
        return self._reference


def make_problem(cfg, dev, rng, settings, seed=0):
    """Random inputs for ``cfg`` (lengths from ``draw_lengths(cfg, seed)``, data from ``rng``):
    pages in a shuffled order with one spare page, unused block-table entries UNUSED_PAGE;
    with ``settings.nan_unused`` NaN in every slot past a length and in the spare page
    (numba_mla never reads them; a peer may; FP8 rows: all bytes 0xFF, a NaN code, scale and
    rope value)."""
    import numba_mla as nm

    B, H, sq, page = cfg.batch, cfg.heads, cfg.sq, cfg.page_size
    dtype = DTYPES[cfg.dtype]
    lengths = draw_lengths(cfg, seed)
    max_pages = max(1, -(-int(lengths.max()) // page))
    layout = paged_layout(rng, lengths, page, max_pages, spare_pages=1)
    bt, num_pages = layout.block_table, layout.num_pages
    unread = [(int(p), 0) for p in layout.spare] + layout.tails(lengths, page)
    torch = dev.torch
    if torch is not None:
        tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16,
               "float32": torch.float32}[cfg.dtype]
        g = torch.Generator(device="cuda")
        g.manual_seed(int(rng.integers(2**62)))
        pages = torch.randn((num_pages, page, D_QK), dtype=tdt, device="cuda", generator=g)
        q = torch.randn((B, sq, H, D_QK), dtype=tdt, device="cuda", generator=g)
        block_table = torch.as_tensor(bt, device="cuda")
        lengths_dev = torch.as_tensor(lengths, device="cuda")
    else:
        pages = rng.standard_normal((num_pages, page, D_QK), dtype=np.float32).astype(dtype)
        q = rng.standard_normal((B, sq, H, D_QK), dtype=np.float32).astype(dtype)
        block_table, lengths_dev = bt, lengths
    codes = kv_scale = None
    if cfg.kv != "same":
        from .. import fp8

        codes, kv_scale, _ = fp8.quantize(pages, cfg.kv, error=False)
    if settings.nan_unused:
        for p, s in unread:
            if codes is None:
                pages[p, s:] = float("nan")
            elif torch is not None:  # (device codes are uint8 bytes)
                codes[p, s:] = 0xFF
            else:
                codes.view(np.uint8)[p, s:] = 0xFF
    if codes is None:
        cache = nm.PagedKVCache(pages, block_table, lengths_dev)
    else:
        cache = nm.PagedKVCache(codes, block_table, lengths_dev, kv_scale=kv_scale,
                                fp8_layout=cfg.kv)
    return Problem(cfg, dev, q, pages, block_table, lengths_dev, lengths, bt, cache,
                   make_mask(cfg.mask), SCALE, settings.ref_seqs, codes, kv_scale)
