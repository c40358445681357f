"""scripts/schedule_model.py: the what-if packing covers every sequence's tiles exactly once,
cuts only sequences that do not fit, and the report names the model's choice (on the CPU)."""
import importlib.util
import os

import numpy as np

from numba_mla import heuristics

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "schedule_model.py")
spec = importlib.util.spec_from_file_location("_schedule_model", SCRIPT)
schedule_model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(schedule_model)


def test_mixed_pack_covers_each_sequence_once():
    rng = np.random.default_rng(5)
    for _ in range(50):
        tiles = rng.integers(0, 120, size=int(rng.integers(1, 40))).astype(np.int64)
        nruns = int(rng.integers(1, 30))
        lo = -(-int(tiles.sum() + heuristics.RUN_ITEM_TILES * tiles.size) // nruns)
        cap = max(1, lo + int(rng.integers(0, 10)))
        runs = schedule_model.mixed_pack(tiles, nruns, cap)
        assert len(runs) == nruns
        covered = [[] for _ in tiles]
        for run in runs:
            for b, t0, t1 in run:
                covered[b].append((t0, t1))
        for b, spans in enumerate(covered):
            spans.sort()
            assert spans[0][0] == 0 and spans[-1][1] == tiles[b]  # (all, in order)
            assert all(a[1] == c[0] for a, c in zip(spans, spans[1:]))  # (no gap, no overlap)
            if len(spans) > 1:  # (a cut leaves pieces of RUN_MIN_PIECE tiles or more)
                assert min(t1 - t0 for t0, t1 in spans) >= heuristics.RUN_MIN_PIECE


def test_mixed_pack_cuts_only_what_does_not_fit():
    """Four sequences of 10 tiles and one of 30 on four runs at a cap of 22 (an item's cost is
    its tiles plus RUN_ITEM_TILES): the 30 is cut across runs, the 10s stay whole."""
    tiles = np.array([10, 10, 30, 10, 10], np.int64)
    runs = schedule_model.mixed_pack(tiles, 4, 22)
    pieces = np.bincount([b for run in runs for b, _, _ in run], minlength=5)
    assert pieces[2] > 1 and (pieces[[0, 1, 3, 4]] == 1).all()
    cost, ncut = schedule_model.mixed_cost(runs, tiles, 1, 4, share=0.0)
    assert ncut == 1


def test_report_names_the_choice(capsys):
    assert schedule_model.main(["--shapes", "64x128x4096,128x128x1024", "--spreads", "0,0.5",
                                "--what-if"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5
    assert "taken: balanced (P=1)" in out[1]  # (equal lengths, one wave: the grid)
    assert "taken: whole runs" in out[4] and "what-if" in out[4]
