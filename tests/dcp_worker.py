"""One rank of a gloo group, started by test_dcp_gloo.py as its own process:

    python dcp_worker.py RANK WORLD RENDEZVOUS_FILE CASE_JSON OUT_PREFIX

Every rank builds the same random problem from the case's seed, keeps its shard of the cache
(and, with ``q_heads="local"``, its heads of q), first makes the case's bad calls (each must
raise on every rank: the message is recorded) and then the good one, whose out and lse it saves
as OUT_PREFIX.npz. Every collective has the group's timeout (60 s)."""
import datetime
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(rank, world, rendezvous, case, prefix):
    import torch
    import torch.distributed as dist

    import numba_mla as nm
    from numba_mla import distributed
    from numba_mla.sharding import shard_cache

    from helpers import DTYPES, MASKS, SCORE_MODS, make_problem
    from test_dcp import local_cache, positions_of

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    rng = np.random.default_rng(case["seed"])
    p = make_problem(rng, case["B"], case["Sq"], case["H"], case["lengths"],
                     DTYPES[case["dtype"]], "contiguous")
    mask = MASKS[case["mask"]].make(p, rng)
    score_mod = SCORE_MODS[case["mod"]].make(p)
    own = np.random.default_rng([case["seed"], rank])  # this rank's page shuffle

    def shard_of(problem, layout):
        pm = positions_of(layout, rank, world, problem.lengths)
        return shard_cache(local_cache(own, problem, pm, case["kind"]), problem.lengths, pm)

    def torch_q(x):
        x = np.ascontiguousarray(x)
        if x.dtype == DTYPES["bf16"]:
            return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(x)

    q = torch_q(p.q)
    shard = shard_of(p, case["layout"])
    errors = []
    for bad in case.get("bad", []):
        bq, bshard = q, shard
        if bad == "lengths" and rank == world - 1:  # one rank sees other global lengths
            other = make_problem(np.random.default_rng(1), case["B"], case["Sq"], case["H"],
                                 [L + 1 for L in case["lengths"]], DTYPES[case["dtype"]])
            bshard = shard_of(other, case["layout"])
        elif bad == "layout" and rank == world - 1:  # one rank lays its shard out in blocks
            bshard = shard_of(p, "blocks" if case["layout"] == "interleaved" else "interleaved")
        elif bad == "device" and rank == world - 1:  # not a CPU tensor, in a gloo group
            bq = q.to("meta")
        scale = float("nan") if bad == "scale" and rank == 0 else p.scale
        try:
            distributed.decode(bq, bshard, scale, mask=mask, score_mod=score_mod)
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))

    if case["q_heads"] == "local":
        h = p.heads // world
        q = q[:, :, rank * h:(rank + 1) * h]
    out, lse = distributed.decode(q, shard, p.scale, mask=mask, score_mod=score_mod,
                                  q_heads=case["q_heads"], out_heads=case["out_heads"],
                                  return_lse=True)
    assert isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)
    if out.dtype == torch.bfloat16:
        out = out.view(torch.int16).numpy().view(DTYPES["bf16"])
    else:
        out = out.numpy()
    np.savez(prefix + ".npz", out=out.astype(np.float32), lse=lse.numpy(),
             errors=np.array(json.dumps(errors)))
    dist.destroy_process_group()
    del nm


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), sys.argv[5])
