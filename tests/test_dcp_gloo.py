"""Decode context parallel through torch.distributed: 2 and 3 processes in a gloo group (CPU
tensors, kernels in Numba's CUDA simulator), each holding one shard; every rank's result is
checked three ways against the float64 reference of the whole cache. Bad calls (global lengths
that disagree, shards of unequal layouts, a tensor a gloo group cannot carry) must raise the
same error on every rank, and nothing may hang: every collective has a 60 s timeout and every
process a deadline. Skipped where torch is not installed."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import DTYPES, MASKS, SCORE_MODS, assert_three_way, fp32_floor, make_problem, \
    references

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch was built without torch.distributed", allow_module_level=True)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dcp_worker.py")
DEADLINE_S = 600  # the slowest process's whole life (the simulator is slow; 2 CPU cores)


def run_group(tmp_path, world, case):
    """Start ``world`` worker processes on ``case``; their (out, lse, errors) by rank."""
    root = os.path.dirname(os.path.dirname(WORKER))
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", OMP_NUM_THREADS="1",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rendezvous = str(tmp_path / "rendezvous")
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), str(world), rendezvous,
                               json.dumps(case), str(tmp_path / f"rank{r}")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=DEADLINE_S)[0])
    finally:
        for proc in procs:  # only on a timeout or an error above: none is left running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for r, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {r} failed:\n{logs[r][-4000:]}"
    results = []
    for r in range(world):
        z = np.load(tmp_path / f"rank{r}.npz")
        results.append((z["out"], z["lse"], json.loads(str(z["errors"]))))
    return results


def check_group(tmp_path, world, case):
    rng = np.random.default_rng(case["seed"])  # the workers' problem, drawn the same way
    p = make_problem(rng, case["B"], case["Sq"], case["H"], case["lengths"],
                     DTYPES[case["dtype"]], "contiguous")
    mask = MASKS[case["mask"]].make(p, rng)
    golden, same = references(p, mask, SCORE_MODS[case["mod"]].make(p))
    results = run_group(tmp_path, world, case)
    h = p.heads // world
    for r, (out, lse, _) in enumerate(results):
        heads = slice(r * h, (r + 1) * h) if case["out_heads"] == "local" else slice(None)
        g = (golden[0][:, :, heads], golden[1][:, :, heads])
        s = (same[0][:, :, heads], same[1][:, :, heads])
        assert_three_way(out.astype(p.dtype), s[0], g[0], floor=fp32_floor(golden[0]),
                         what=f"rank {r} out")
        assert_three_way(lse, s[1], g[1], floor=fp32_floor(golden[1]), what=f"rank {r} lse")
    return results


def test_two_ranks_interleaved_with_bad_calls(tmp_path):
    """Interleaved paged shards, q gathered from each rank's heads, all heads out; a length
    shorter than N (rank 1 holds nothing of sequence 1). First four bad calls, each refused
    with the same message on both ranks (the last one by the decode's own checks, on rank 0
    only: rank 1 must not be left waiting)."""
    case = dict(seed=11, B=2, Sq=1, H=2, lengths=[6, 1], dtype="fp32", layout="interleaved",
                kind="paged", mask="causal", mod="alibi", q_heads="local", out_heads="all",
                bad=["lengths", "layout", "device", "scale"])
    results = check_group(tmp_path, 2, case)
    errors = [r[2] for r in results]
    assert errors[0] == errors[1], errors
    lengths, layout, device, scale = errors[0]
    assert lengths.startswith("decode: lengths: the ranks must agree on the global lengths")
    assert layout.startswith("decode: cache: the shards' layouts do not make one cache")
    assert device.startswith("decode: rank 1: ValueError: group: a gloo group carries CPU "
                             "tensors")
    assert scale.startswith("decode: rank 0: ValueError: scale: expected a finite float")


def test_three_ranks_blocks_local_heads_out(tmp_path):
    """Blocks of contiguous shards, bf16, each rank gets its own heads (all-to-all)."""
    case = dict(seed=12, B=1, Sq=3, H=3, lengths=[8], dtype="bf16", layout="blocks",
                kind="contiguous", mask="window3", mod="softcap", q_heads="all",
                out_heads="local")
    check_group(tmp_path, 3, case)
