"""``MHAConfig``: a kernel's tuning, as Modular MAX's ``flare_mla_decoding`` takes it.

MAX's ``MHAConfig`` carries the tile sizes, pipeline depth and swizzle of its kernels. Ours
keeps the fields that mean something for these kernels; each is ``None`` (the library's
choice) or a value the chosen kernel can run. selector.py applies it: a value no kernel of
the call's backend can honour is refused with a ``ValueError`` naming ``config.<field>``.

=========================  ============================================================
field                      honoured by
=========================  ============================================================
``num_queries_per_block``  query rows a block: "simt" 16 or 32 (32: 16-bit data only),
                           "simple" its 8, "mma" its 64 (and 16 for "e4m3" FP8 caches:
                           the transposed kernel)
``num_keys_per_block``     keys a tile: each kernel has one per row count ("simt": 64 at
                           16 rows of 16-bit data, else 32; "mma" 64; "simple" 8)
``num_pipeline_stages``    key tiles in flight: 2 ("simt", "mma": double buffer), 1
                           ("simple")
``num_partitions``         the split-K factor, as the ``num_partitions`` argument
=========================  ============================================================
"""
from dataclasses import dataclass, fields
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class MHAConfig:
    """Tuning for one call; every field ``None`` means the library's choice."""

    num_queries_per_block: Optional[int] = None  # rows a block (MAX's BM)
    num_keys_per_block: Optional[int] = None  # keys a tile (MAX's BN)
    num_pipeline_stages: Optional[int] = None  # key tiles in flight
    num_partitions: Optional[int] = None  # split-K factor

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"config.{f.name}: expected None or an int, got "
                                f"{type(v).__name__}")
            if v < 1:
                raise ValueError(f"config.{f.name}: expected a positive int, got {v}")
            object.__setattr__(self, f.name, int(v))


def check_config(config, num_partitions):
    """The call's config (None stays None) and split-K factor: ``num_partitions`` and
    ``config.num_partitions`` may both be given only when they agree."""
    if config is None:
        return None, num_partitions
    if not isinstance(config, MHAConfig):
        raise TypeError(f"config: expected None or a numba_mla.MHAConfig, got "
                        f"{type(config).__name__}")
    if config.num_partitions is not None:
        if num_partitions is not None and num_partitions != config.num_partitions:
            raise ValueError(f"config.num_partitions: {config.num_partitions} disagrees with "
                             f"num_partitions = {num_partitions}; give one of them")
        num_partitions = config.num_partitions
    return config, num_partitions


def refuse(field, value, backend, accepted):
    """The error for a config value the chosen kernel cannot run."""
    return ValueError(f"config.{field}: the {backend!r} kernel for this call runs "
                      f"{' or '.join(map(str, accepted))}, got {value}")
