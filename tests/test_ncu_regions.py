"""scripts/ncu_regions.py on a small made-up source page: regions cut at block barriers and
around innermost loops, shares of samples and instructions, stalls and opcodes."""
import importlib.util
import os

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "ncu_regions.py")
spec = importlib.util.spec_from_file_location("_ncu_regions", SCRIPT)
regions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(regions)

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)",
          "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed",
          "stall_barrier", "stall_short_sb", "stall_selected", "stall_barrier (Not Issued)"]
#: (address, instruction, samples, executed, barrier, short_sb, selected stalls)
ROWS = [
    (0x00, "MOV R1, c[0x0][0x28]", 2, 10, 0, 0, 2),
    (0x10, "BAR.SYNC.DEFER_BLOCKING 0x0", 6, 10, 6, 0, 0),
    (0x20, "LDS.64 R2, [R0]", 4, 10, 0, 4, 0),
    (0x30, "FFMA R4, R2, R3, R4", 20, 40, 0, 0, 20),   # the loop: 0x30 .. 0x50
    (0x40, "FFMA R5, R2, R3, R5", 20, 40, 0, 0, 20),
    (0x50, "@P0 BRA 0x7f0030", 8, 40, 0, 0, 8),  # absolute, as ncu prints it
    (0x60, "EXIT", 0, 10, 0, 0, 0),
]


@pytest.fixture
def page(tmp_path):
    path = tmp_path / "ncu.csv"
    lines = ['"Kernel Name","k"', ",".join(f'"{h}"' for h in HEADER)]
    for a, text, s, e, bar, ssb, sel in ROWS:
        lines.append(",".join(f'"{v}"' for v in
                              (hex(0x7f0000 + a), text, s, 0, e, bar, ssb, sel, 0)))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_regions_and_shares(page):
    rows = regions.table(regions.read(page))
    assert [(r["offset"], r["name"]) for r in rows] == [
        (0x00, "start"), (0x10, "barrier"), (0x20, "after barrier"), (0x30, "loop"),
        (0x60, "after loop")]
    total_s, total_e = 60, 160
    loop = rows[3]
    assert loop["samples"] == pytest.approx(48 / total_s)
    assert loop["executed"] == pytest.approx(120 / total_e)
    assert loop["rate"] == pytest.approx((120 / total_e) / (48 / total_s))
    assert loop["ops"][0] == ("FFMA", pytest.approx(80 / 120))
    assert rows[1]["stalls"] == [("barrier", 1.0)]
    assert rows[2]["stalls"] == [("short_sb", 1.0)]
    assert rows[4]["samples"] == 0 and rows[4]["ops"] == [("EXIT", 1.0)]
    assert [r["runs"] for r in rows] == [10, 10, 10, 40, 10]  # (the loop's body ran 4 times)


def test_main_prints_a_table(page, capsys):
    regions.main([page, "--min", "0"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:6] == ["offset", "region", "samples", "instr", "issue", "runs"]
    assert any(line.split()[1] == "loop" and line.split()[5] == "40" and "FFMA 67%" in line
               for line in out[1:])
