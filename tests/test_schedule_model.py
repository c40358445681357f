"""scripts/schedule_model.py: the report names each schedule's modelled time and the model's
choice, with heuristics.MIXED_RUNS off and on (on the CPU)."""
import importlib.util
import os

from numba_mla import heuristics

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "schedule_model.py")
spec = importlib.util.spec_from_file_location("_schedule_model", SCRIPT)
schedule_model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(schedule_model)


def test_report_names_the_choice(capsys, monkeypatch):
    monkeypatch.setattr(heuristics, "MIXED_RUNS", False)  # (--mixed sets it; restored after)
    args = ["--shapes", "64x128x4096,128x128x1024", "--spreads", "0,0.5"]
    assert schedule_model.main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5
    assert "taken: balanced (P=1)" in out[1]  # (equal lengths, one wave: the grid)
    assert "taken: listed" in out[2] and "mixed runs" in out[2]
    assert "taken: whole runs" in out[4]
    assert schedule_model.main(args + ["--mixed"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "MIXED_RUNS on" in out[0] and "taken: mixed runs (P=2)" in out[2]
    assert schedule_model.main(args + ["--no-mixed"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "MIXED_RUNS off" in out[0] and "taken: listed" in out[2]
