"""Run one decode configuration a few times, for Nsight Compute (``scripts/ncu_source.sh``
profiles the second partition-kernel launch).

The inputs are the benchmark's (``numba_mla.bench.make_problem``: bf16 by default, page size
64, a shuffled block table, every sequence of length L).

Usage: python scripts/profile_one.py B H L [dtype: bf16|fp16|fp32] [backend: auto|simt|mma|...]
                                     [kv: same|e4m3|v32 (the cache quantized into FP8)]
backend ``flash_mla`` runs FlashMLA's call instead, as the benchmark's provider makes it
(``flash_mla`` importable; bf16 or fp16, page size 64).
"""
import os
import sys

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

import numpy as np  # noqa: E402

import numba_mla as nm  # noqa: E402
from numba_mla import bench  # noqa: E402

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def main(argv):
    B, H, L = (int(a) for a in argv[:3])
    dtype = DTYPES[argv[3] if len(argv) > 3 else "bf16"]
    backend = argv[4] if len(argv) > 4 else "auto"
    kv = argv[5] if len(argv) > 5 else "same"
    dev = bench.Device()
    cfg = bench.Config(B, H, L, dtype=dtype, kv=kv, sweep="profile")
    p = bench.make_problem(cfg, dev, np.random.default_rng(0), bench.Settings.gpu())
    if backend == "flash_mla":
        from numba_mla.bench import providers

        run = providers.flash_mla(p).run
    else:
        def run():
            nm.mla_decode(p.q, p.cache, p.scale, backend=backend)
    for _ in range(3):
        run()
    dev.sync()


if __name__ == "__main__":
    main(sys.argv[1:])
