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
    # (the last piece's merge: no cut sequence at equal lengths or in whole runs, no change;
    # at 64 x 128 x 4096, spread 0.5, one item's workspace of each of its cut pairs and the
    # merge kernel less than the mixed runs)
    from numba_mla.bench.configs import Config

    c = schedule_model.costs(Config(64, 128, 4096, spread=0.5, sweep="varlen"), 132)
    share = heuristics.WORKSPACE_TILES * heuristics._row_share(128, 2)
    assert c["fold"] == c["mixed runs"] - share * 2 * c["ncut"] / 132 - heuristics.MERGE_TILES
    assert c["fold_pieces"] == 2 and "merged by the last piece 76.0" in out[2]
    for line in (out[1], out[3], out[4]):
        mixed = line.split("mixed runs ")[1].split(" ")[0]
        assert f"merged by the last piece {mixed})" in line
    assert schedule_model.main(args + ["--no-mixed"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "MIXED_RUNS off" in out[0] and "taken: listed" in out[2]


def test_bench_rows_beside_the_model(capsys, monkeypatch):
    """--bench: each varlen row of the "mma" provider in a committed bench run, with the
    schedule the model takes and its modelled tile-times (as ``costs`` gives them for the
    run's draw and multiprocessors), and microseconds a tile-time that are the row's time
    over them (FlashMLA's likewise); with the flags of that run every row ran the schedule
    costed, and with the mixed runs on, the one row they change is marked as having run
    another."""
    import json

    from numba_mla.bench.configs import Config

    monkeypatch.setattr(heuristics, "MIXED_RUNS", heuristics.MIXED_RUNS)  # (restored after)
    path = os.path.join(os.path.dirname(__file__), "..", "plots",
                        "bench_varlen_d5e1d0c_h100.json")
    run = json.load(open(path))
    rows = [r for r in run["rows"] if r["provider"] == "numba_mla" and r["backend"] == "mma"]
    flash = {(r["batch"], r["heads"], r["seqlen"], r["spread"]): r["us"]
             for r in run["rows"] if r["provider"] == "flash_mla"}

    def table(args):
        assert schedule_model.main(args + ["--bench", path]) == 0
        out = capsys.readouterr().out.splitlines()
        assert "commit d5e1d0c" in out[0] and "132 multiprocessors" in out[0]
        lines = [line for line in out if line.startswith("| ") and " x " in line
                 and "B x H" not in line]
        assert len(lines) == len(rows) == 18
        return out[0], [[c.strip() for c in line.strip("|").split("|")] for line in lines]

    head, cells = table(["--no-mixed"])
    assert "MIXED_RUNS off" in head
    for cell, r in zip(cells, rows):
        key = (r["batch"], r["heads"], r["seqlen"], r["spread"])
        c = schedule_model.costs(Config(*key[:3], spread=key[3], sweep="varlen"), 132)
        assert cell[0] == f"{r['batch']} x {r['heads']} x {r['seqlen']}"
        assert cell[2] == c["taken"] and cell[3] == f"{c['taken_cost']:.1f}"
        assert cell[4] == f"{r['us']:.1f} ({r['num_partitions']})"
        assert cell[5] == f"{r['us'] / c['taken_cost']:.2f}"  # (not marked: the same schedule)
        assert cell[6] == f"{flash[key] / c['taken_cost']:.2f}"
    assert [cell[2] for cell in cells[:3]] == ["balanced (P=1)", "balanced (P=1)", "listed"]
    assert cells[2][3] == "95.4"
    head, cells = table(["--mixed"])
    marked = [i for i, cell in enumerate(cells) if "(ran another)" in cell[5]]
    assert marked == [2] and cells[2][2] == "mixed runs (P=2)"  # (64 x 128 x 4096 at 0.5)
