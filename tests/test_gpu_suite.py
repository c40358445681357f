"""scripts/gpu_suite.py's reading of pytest-xdist logs: which tests an earlier call passed,
skipped or failed, ids with spaces, the short summary's messages, a later log's word last;
a collection error stops it."""
import importlib.util
import os

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "gpu_suite.py")
spec = importlib.util.spec_from_file_location("_gpu_suite", SCRIPT)
gpu_suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_suite)

#: (pytest-xdist ends a result line with a space)
FIRST = "\n".join([
    "tests/test_a.py::test_x[1]",
    "[gw0] [  1%] PASSED tests/test_a.py::test_x[1] ",
    "[gw3] [  2%] SKIPPED tests/test_a.py::test_y ",
    "[gw1] [  3%] FAILED tests/test_b.py::test_z[(1, 'bf16', [130])] ",
    "tests/test_b.py::test_w",
    "=========================== short test summary info ============================",
    "FAILED tests/test_b.py::test_z[(1, 'bf16', [130])] - AssertionError: max error 3"])
SECOND = ("[gw2] [ 50%] PASSED tests/test_b.py::test_z[(1, 'bf16', [130])] \n"
          # (a warning printed by the test on its result's line)
          "[gw9] [  0%] PASSED tests/test_c.py::test_v[some whole-2] /opt/x.py:31: "
          "DeprecationWarning: a [word] - and more\n")


def test_results_over_logs(tmp_path):
    first, second = tmp_path / "1.txt", tmp_path / "2.txt"
    first.write_text(FIRST)
    second.write_text(SECOND)
    z = "tests/test_b.py::test_z[(1, 'bf16', [130])]"
    assert gpu_suite.results([first]) == {"tests/test_a.py::test_x[1]": "PASSED",
                                          "tests/test_a.py::test_y": "SKIPPED", z: "FAILED"}
    after = gpu_suite.results([first, second])
    assert after[z] == "PASSED" and "tests/test_b.py::test_w" not in after  # (not reached)
    assert after["tests/test_c.py::test_v[some whole-2]"] == "PASSED"


def test_a_module_that_does_not_import_stops_the_run(tmp_path):
    """Collection errors are not passes: exit status 4, nothing run."""
    (tmp_path / "test_ok.py").write_text("def test_a():\n    pass\n")
    (tmp_path / "test_broken.py").write_text("import no_such_module_here\n")
    assert gpu_suite.main(["--list", str(tmp_path)]) == 4
    os.remove(tmp_path / "test_broken.py")
    assert gpu_suite.main(["--list", str(tmp_path)]) == 0


def test_a_keyword_selects_a_part(tmp_path, capsys):
    """``-k`` passes pytest's keyword expression to the collection: only the tests it selects
    are the suite (listed, counted, run)."""
    (tmp_path / "test_k.py").write_text("def test_mma_a():\n    pass\n\n"
                                        "def test_simt_b():\n    pass\n")
    assert gpu_suite.main(["--list", "-k", "mma", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 tests, 0 passed or skipped earlier, 1 to run" in out
    assert "test_mma_a" in out and "test_simt_b" not in out


def test_failures_tracebacks_written_as_they_come(tmp_path, monkeypatch):
    """A run writes each failure's traceback to LOG.tracebacks.txt as it is reported (here
    through pytest-xdist's controller, one worker), beside the verbose log: the failing
    assertion is there, the passing test is not."""
    (tmp_path / "test_f.py").write_text("def test_good():\n    pass\n\n"
                                        "def test_bad():\n    assert 1 + 1 == 3\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "test_f.py").rename(tmp_path / "tests" / "test_f.py")
    monkeypatch.setattr(gpu_suite, "ROOT", str(tmp_path))  # (its ids: tests/test_f.py::...)
    log = tmp_path / "suite.txt"
    assert gpu_suite.main(["--log", str(log), "--workers", "1", "--seconds", "120",
                           "tests"]) == 1
    assert "PASSED tests/test_f.py::test_good" in log.read_text()
    text = (tmp_path / "suite.txt.tracebacks.txt").read_text()
    assert "assert (1 + 1) == 3" in text and text.count("test_bad (call)") == 1
    assert "test_good" not in text


def test_gpu_runs_steps_name_what_exists(tmp_path):
    """scripts/gpu_runs.sh, the GPU session's steps: valid bash; an unknown step exits 2 naming
    the steps; the seesaw flags its ab8 step times and SET replaces are lines of
    numba_mla/kernels/seesaw.py (a renamed flag would leave the A/B timing the default twice),
    and the scripts and test files it runs exist."""
    import re
    import subprocess

    root = os.path.join(os.path.dirname(__file__), "..")
    script = os.path.join(root, "scripts", "gpu_runs.sh")
    subprocess.run(["bash", "-n", script], check=True)
    run = subprocess.run(["bash", script, str(tmp_path), "nonsense"], capture_output=True,
                         text=True, cwd=root)
    assert run.returncode == 2 and "sweeps, ab8, suite or sanitize" in run.stderr
    text = open(script).read()
    with open(os.path.join(root, "numba_mla", "kernels", "seesaw.py")) as f:
        seesaw = f.read()
    flags = set(re.findall(r"kernels\.seesaw\.(\w+)=", text.replace("$s.", "kernels.seesaw.")))
    assert flags == {"S8_PAIRS", "CODES_WIDE", "STAGE8"}
    for flag in flags:
        assert re.search(rf"^{flag} = ", seesaw, re.M), flag
    for path in set(re.findall(r"(?:scripts|tests)/\w+\.py", text)):
        assert os.path.exists(os.path.join(root, path)), path
