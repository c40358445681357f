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


def test_bench_rows_beside_the_model(capsys, monkeypatch):
    """--bench: each varlen row of the "mma" provider in a committed bench run, with the
    schedule the model takes, its modelled tile-times, and microseconds a tile-time that are
    the row's time over them (FlashMLA's likewise)."""
    import json

    path = os.path.join(os.path.dirname(__file__), "..", "plots",
                        "bench_varlen_d5e1d0c_h100.json")
    assert schedule_model.main(["--no-mixed", "--bench", path]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "commit d5e1d0c" in out[0] and "MIXED_RUNS off" in out[0]
    lines = [line for line in out if line.startswith("| ") and "x" in line.split("|")[1]
             and "---" not in line and "B x H" not in line]
    rows = [r for r in json.load(open(path))["rows"]
            if r["provider"] == "numba_mla" and r["backend"] == "mma"]
    flash = {(r["batch"], r["heads"], r["seqlen"], r["spread"]): r["us"]
             for r in json.load(open(path))["rows"] if r["provider"] == "flash_mla"}
    assert len(lines) == len(rows) == 18
    for line, r in zip(lines, rows):
        cells = [c.strip() for c in line.strip("|").split("|")]
        modelled, per_tile, fm = float(cells[3]), float(cells[5]), float(cells[6])
        assert cells[0] == f"{r['batch']} x {r['heads']} x {r['seqlen']}"
        assert cells[4].startswith(f"{r['us']:.1f} ({r['num_partitions']})")
        slack = 0.0051 + 0.05 * per_tile / modelled  # (both printed rounded)
        assert abs(per_tile - r["us"] / modelled) < slack
        key = (r["batch"], r["heads"], r["seqlen"], r["spread"])
        assert abs(fm - flash[key] / modelled) < 0.0051 + 0.05 * fm / modelled
