"""A shard of a KV cache: one rank's share of every sequence's keys (decode context parallel).

``shard_cache(local, lengths, positions)`` wraps ``local``, a ContiguousKVCache or
PagedKVCache holding this rank's keys at local indices 0, 1, ... (its lengths are the local
counts), with the sequences' GLOBAL ``lengths`` and the ``PositionMap`` that places local keys
in the sequence (positions.py). The result is a KVCache that every entry point takes:
``mla_decode(q, shard, ...)`` attends to the shard's keys only, with the masks and score mods
seeing global key positions and the queries at their global positions, and returns the
shard's part of the answer; ``return_lse=True`` gives what the merge over shards needs
(distributed.py). A shard that holds no key of a sequence returns out = 0 and lse = -inf for its
rows (weight 0 in the merge).

The kernels read the shard's storage through the local cache's addressing; its lengths
argument is the global lengths, from which each kernel derives the local key count. The map
is compiled into the kernel: each map is its own cache class (``type(shard)``), which the
kernel factory keys on (factory.py). The NumPy reference does not take a shard (it would need
the other ranks' keys); check a shard's decode through the merge against the whole cache.
"""
import functools

import numpy as np

from .arrays import is_device
from .caches import KVCache, check_lengths
from .positions import PositionMap


class ShardedKVCache(KVCache):
    """One rank's shard: the local cache's storage with global lengths and a position map.
    Build it with ``shard_cache``; ``local`` is the wrapped cache, ``positions`` its map."""

    #: The class's position map (each map is a subclass: the kernel factory reads it there).
    position_map = None

    def __init__(self, local, lengths):
        positions = self.position_map
        if not isinstance(local, KVCache) or isinstance(local, ShardedKVCache):
            raise TypeError(f"cache: expected a ContiguousKVCache or PagedKVCache of local keys, "
                            f"got {type(local).__name__}")
        self.local = local
        self.positions = positions
        self.storage = local.storage
        self.block_table = local.block_table
        self.page_size = local.page_size
        for name in ("block_table_host", "num_pages", "kv", "pages"):
            if hasattr(local, name):
                setattr(self, name, getattr(local, name))
        self.lengths_host = check_lengths(lengths, local.batch, self.capacity)
        self.lengths = lengths if is_device(lengths) else self.lengths_host
        want = positions.local_count(self.lengths_host)
        bad = np.nonzero(local.lengths_host != want)[0]
        if bad.size:
            b = int(bad[0])
            raise ValueError(
                f"cache: sequence {b} of global length {self.lengths_host[b]} has "
                f"{want[b]} keys on this shard ({_describe(positions)}), but the local cache's "
                f"lengths[{b}] = {local.lengths_host[b]}")
        self._finish()
        # Plans (plans.py) key on the layout: shards of other maps run other kernels.
        self.layout_key = self.layout_key + (positions.cache_key(),)

    @property
    def capacity(self):
        """The longest global sequence this shard can hold its share of."""
        return self.position_map.global_capacity(self.local.capacity)

    def with_lengths(self, lengths):
        """The same shard for new global lengths (the local cache follows)."""
        from .arrays import to_host

        host = np.asarray(to_host(lengths))
        local = self.local.with_lengths(
            self.position_map.local_count(host).astype(np.int32))
        return type(self)(local, lengths)

    def rows(self, b, n):
        raise NotImplementedError(
            "cache: the NumPy reference needs a whole sequence's keys; a shard holds only its "
            "share: run the reference on the whole cache (and the kernels on the shards)")

    def __repr__(self):
        return f"ShardedKVCache({self.local!r}, {_describe(self.position_map)})"


@functools.lru_cache(maxsize=None)
def _shard_class(local_cls, positions):
    """The cache class of shards of ``local_cls`` caches under ``positions``: the kernel
    factory takes the addressing (``device_locate``) and the map from it."""
    return type(f"Sharded{local_cls.__name__}", (ShardedKVCache,),
                dict(kind=local_cls.kind, position_map=positions,
                     device_locate=staticmethod(local_cls.device_locate),
                     __module__=__name__))


def shard_cache(local, lengths, positions):
    """``local`` (a ContiguousKVCache or PagedKVCache of this rank's keys, lengths = the local
    counts) as the shard of sequences of global ``lengths`` under ``positions`` (a
    ``PositionMap``). The identity map gives ``local`` back (with its own lengths checked)."""
    if not isinstance(positions, PositionMap):
        raise TypeError(f"positions: expected a PositionMap, got {type(positions).__name__}")
    if isinstance(local, ShardedKVCache):
        raise TypeError("cache: already a shard")
    if not isinstance(local, KVCache):
        raise TypeError(f"cache: expected a ContiguousKVCache or PagedKVCache, "
                        f"got {type(local).__name__}")
    if positions.identity:  # today's kernels, no map compiled in
        return _identity_shard(local, lengths)
    return _shard_class(type(local), positions)(local, lengths)


def _identity_shard(local, lengths):
    from .arrays import to_host

    if not np.array_equal(np.asarray(to_host(lengths)), local.lengths_host):
        raise ValueError(f"lengths: a shard that holds every key (the identity map) has the "
                         f"local cache's lengths {local.lengths_host.tolist()}")
    return local


def local_rows(rows, positions):
    """The rows of one sequence (``rows`` [L, ...], all L keys) that the shard under
    ``positions`` holds, in local order."""
    return rows[positions.global_keys(positions.local_count(len(rows)))]


def _describe(positions):
    if positions.capacity is None:
        return f"global key = local key * {positions.stride} + {positions.offset}"
    return (f"global keys {positions.offset} + local key, at most {positions.capacity} "
            f"(stride {positions.stride})")
