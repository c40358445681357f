"""Check that compiled kernels load from Numba's disk cache in a new process.
Usage: python scripts/disk_cache_check.py   (runs itself twice; prints both first-call times)"""
import os
import subprocess
import sys
import time

if len(sys.argv) > 1 and sys.argv[1] == "--child":
    import numpy as np

    import numba_mla as nm

    rng = np.random.default_rng(0)
    kv = rng.standard_normal((2, 100, 576)).astype(np.float16)
    q = rng.standard_normal((2, 1, 16, 576)).astype(np.float16)
    t0 = time.perf_counter()
    nm.mla_decode(q, nm.ContiguousKVCache(kv, np.array([100, 57], np.int32)), 0.1,
                  mask=nm.SlidingWindowCausalMask(33), score_mod=nm.SoftCapScoreMod(4.0))
    print(f"{time.perf_counter() - t0:.2f}")
else:
    env = dict(os.environ, NUMBA_CACHE_DIR=os.environ.get("NUMBA_CACHE_DIR", "/tmp/numba_mla_cache"))
    times = [float(subprocess.run([sys.executable, __file__, "--child"], env=env, check=True,
                                  capture_output=True, text=True).stdout.split()[-1])
             for _ in range(2)]
    print(f"first call, new process: {times[0]:.2f} s (compiles), then {times[1]:.2f} s (disk cache)")
