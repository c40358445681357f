"""Run one decode configuration a few times (for Nsight Compute).
Usage: python scripts/profile_one.py B H L [dtype] [backend]"""
import os
import sys

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
import numpy as np
import torch

import numba_mla as nm
from numba_mla.testing import DTYPES

B, H, L = (int(a) for a in sys.argv[1:4])
dtype = DTYPES[sys.argv[4] if len(sys.argv) > 4 else "bf16"]
backend = sys.argv[5] if len(sys.argv) > 5 else "auto"
rng = np.random.default_rng(0)
page = 64
npages = B * (-(-L // page))
pages = rng.standard_normal((npages, page, 576), np.float32).astype(dtype)
bt = rng.permutation(npages).astype(np.int32).reshape(B, -1)
q = rng.standard_normal((B, 1, H, 576), np.float32).astype(dtype)
as_t = lambda a: torch.as_tensor(a.view(np.int16)).cuda().view(torch.bfloat16) if a.dtype.itemsize == 2 and dtype.name == "bfloat16" else torch.as_tensor(a).cuda()
cache = nm.PagedKVCache(as_t(pages), torch.as_tensor(bt).cuda(), torch.full((B,), L, dtype=torch.int32).cuda())
tq = as_t(q)
for _ in range(3):
    nm.mla_decode(tq, cache, 0.1352, backend=backend)
torch.cuda.synchronize()
