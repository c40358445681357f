"""scripts/ab.py: each version's tree, the child's refusal to time a numba_mla from elsewhere,
the table, and (slow) a whole A/B of the checkout against HEAD."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "ab.py")
spec = importlib.util.spec_from_file_location("_ab", SCRIPT)
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)

in_git = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"],
                        capture_output=True).returncode == 0
needs_git = pytest.mark.skipif(not in_git, reason="not a git checkout")


@needs_git
@pytest.mark.parametrize("rev", ["HEAD", ab.WORKTREE])
def test_export_tree(rev, tmp_path):
    tree = ab.export_tree(rev, str(tmp_path / "t"))
    assert os.path.isfile(os.path.join(tree, "numba_mla", "__init__.py"))
    assert not any("__pycache__" in d for d, _, _ in os.walk(tree))
    assert ab.commit_of(rev).rstrip("+") == ab.commit_of("HEAD")


@pytest.mark.parametrize("label", [None, "abc1234"])
def test_a_directory_is_a_version(label, tmp_path):
    """A directory holding numba_mla (a branch exported elsewhere) is copied as it is and
    labelled by its COMMIT file, or else by its name."""
    src = tmp_path / "branch-x"
    (src / "numba_mla").mkdir(parents=True)
    (src / "numba_mla" / "__init__.py").write_text("MARK = 7\n")
    if label:
        (src / "COMMIT").write_text(label + "\nmore\n")
    assert ab.is_tree(str(src)) and not ab.is_tree(str(tmp_path))
    assert ab.commit_of(str(src)) == (label or "branch-x")
    tree = ab.export_tree(str(src), str(tmp_path / "t"))
    assert (tmp_path / "t" / "numba_mla" / "__init__.py").read_text() == "MARK = 7\n"
    assert tree == str(tmp_path / "t")


def test_child_refuses_a_numba_mla_from_elsewhere(tmp_path):
    """Started in an empty tree, the child finds numba_mla only through PYTHONPATH (the
    checkout): it must stop before timing anything."""
    tree = str(tmp_path)
    env = dict(os.environ, PYTHONPATH=REPO)
    r = subprocess.run(ab.bench_command(tree, "x", ["--sweep", "tiny"], str(tmp_path / "o")),
                       cwd=tree, env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "not the tree" in r.stderr
    assert not (tmp_path / "o").exists()


def _row(us, B=2, provider="numba_mla", backend="mma", spread=0.0):
    return {"provider": provider, "backend": backend, "batch": B, "heads": 16, "seqlen": 64,
            "sq": 1, "spread": spread, "mask": "null", "dtype": "bfloat16", "kv": "same",
            "page_size": 64, "us": us}


def test_table_rounds_and_ratios():
    runs = {"A": [{"rows": [_row(10.0), _row(40.0, B=4)]},
                  {"rows": [_row(12.0), _row(40.0, B=4)]}],
            "B": [{"rows": [_row(9.0), _row(44.0, B=4)]},
                  {"rows": [_row(13.0), _row(36.0, B=4)]}]}
    lines = ab.table(runs)[2:]  # (below the header and its rule)
    assert len(lines) == 2
    first = lines[0]
    assert first.split()[:2] == ["numba_mla:mma", "2x16x64"]
    assert "10.0 / 12.0" in first and "9.0 / 13.0 (1.000)" in first
    assert "44.0 / 36.0 (1.000)" in lines[1]
    runs["B"][0]["rows"][0]["us"] = 11.0  # B: 11 and 13, mean 12, over A's 11
    assert "(1.091)" in ab.table(runs)[2]


def test_table_keeps_configurations_apart():
    flash = _row(5.0, provider="flash_mla", backend=None)
    runs = {"A": [{"rows": [_row(10.0), _row(20.0, spread=0.5), flash]}],
            "B": [{"rows": [_row(11.0)]}]}
    lines = ab.table(runs)[2:]
    assert len(lines) == 3
    assert any("2x16x64 +-0.5L" in line for line in lines)
    assert any(line.split()[:2] == ["flash_mla", "2x16x64"] and line.rstrip().endswith("-")
               for line in lines)


def test_rounds_kept_as_they_finish(tmp_path, monkeypatch, capsys):
    """Each whole round is written to --out (and its table printed) before the next starts:
    a run stopped in its second round keeps the first."""
    calls = []

    def fake_run(tree, label, bench_args, out, cache_dir, pythonpath=()):
        calls.append(label)
        if len(calls) > 2:
            raise KeyboardInterrupt  # (a time limit, in the second round)
        return {"meta": {"commit": label}, "rows": [_row(10.0 + len(calls))]}

    for name, fn in (("run_one", fake_run), ("export_tree", lambda rev, dest: dest),
                     ("commit_of", lambda rev: rev.lower())):
        monkeypatch.setattr(ab, name, fn)
    out = tmp_path / "ab.json"
    with pytest.raises(KeyboardInterrupt):
        ab.main(["A", "B", "--rounds", "2", "--out", str(out), "--keep", str(tmp_path),
                 "--", "--sweep", "tiny"])
    data = json.loads(out.read_text())
    assert data["rounds"] == {"a": [[_row(11.0)]], "b": [[_row(12.0)]]}
    assert "11.0" in capsys.readouterr().err


def test_a_version_with_constants_set(tmp_path):
    """``REV+MODULE.NAME=VALUE``: the tree's line of that constant replaced (only it), the
    label gains the setting; a name with no single line, or a value that is no literal, is
    refused."""
    src = tmp_path / "tree"
    (src / "numba_mla" / "kernels").mkdir(parents=True)
    text = "FLAG = False  # a comment\nFLAG_B = 3\nX = FLAG\n"
    (src / "numba_mla" / "kernels" / "k.py").write_text(text)
    version = f"{src}+kernels.k.FLAG=True+kernels.k.FLAG_B=(4, 5)"
    rev, sets = ab.split_version(version)
    assert rev == str(src) and sets == [("kernels.k", "FLAG", "True"),
                                        ("kernels.k", "FLAG_B", "(4, 5)")]
    tree = ab.export_tree(rev, str(tmp_path / "t"))
    ab.set_constants(tree, sets)
    assert (tmp_path / "t" / "numba_mla" / "kernels" / "k.py").read_text() == (
        "FLAG = True\nFLAG_B = (4, 5)\nX = FLAG\n")
    assert ab.split_version(str(src)) == (str(src), [])
    with pytest.raises(ValueError, match="not a Python literal"):
        ab.split_version("HEAD+kernels.k.FLAG=os.system")
    with pytest.raises(ValueError, match="MODULE.NAME=VALUE"):
        ab.split_version("HEAD+FLAG=1")
    with pytest.raises(ValueError, match="no single line"):
        ab.set_constants(tree, [("kernels.k", "MISSING", "1")])


def test_constants_label_the_version(tmp_path, monkeypatch):
    """A version's settings are in its label (the bench's commit, the JSON)."""
    labels = []

    def fake_run(tree, label, bench_args, out, cache_dir, pythonpath=()):
        labels.append(label)
        return {"meta": {"commit": label}, "rows": [_row(10.0)]}

    for name, fn in (("run_one", fake_run), ("export_tree", lambda rev, dest: dest),
                     ("commit_of", lambda rev: "abc1234"), ("set_constants", lambda t, s: None)):
        monkeypatch.setattr(ab, name, fn)
    ab.main([ab.WORKTREE, "WORKTREE+kernels.m.F=1", "--rounds", "1", "--keep", str(tmp_path),
             "--worktree-label", "def5678", "--", "--sweep", "tiny"])
    assert labels == ["def5678", "def5678+F=1"]


def test_worktree_label(tmp_path, monkeypatch):
    """``--worktree-label`` names WORKTREE in the bench's commit and the JSON (a GPU machine's
    copy of the checkout may carry an older .git), and leaves the other versions' labels."""
    labels = []

    def fake_run(tree, label, bench_args, out, cache_dir, pythonpath=()):
        labels.append(label)
        return {"meta": {"commit": label}, "rows": [_row(10.0)]}

    for name, fn in (("run_one", fake_run), ("export_tree", lambda rev, dest: dest),
                     ("commit_of", lambda rev: "stale+")):
        monkeypatch.setattr(ab, name, fn)
    out = tmp_path / "ab.json"
    ab.main([ab.WORKTREE, "B", "--rounds", "1", "--out", str(out), "--keep", str(tmp_path),
             "--worktree-label", "abc1234+flag", "--", "--sweep", "tiny"])
    assert labels == ["abc1234+flag", "stale+"]
    assert json.loads(out.read_text())["versions"] == {ab.WORKTREE: "abc1234+flag", "B": "stale+"}


@pytest.mark.slow
@needs_git
def test_ab_of_the_checkout_against_head(tmp_path):
    """The whole script: two versions, one round each, one configuration."""
    out = tmp_path / "ab.json"
    r = subprocess.run([sys.executable, SCRIPT, "HEAD", ab.WORKTREE, "--rounds", "1",
                        "--out", str(out), "--keep", str(tmp_path / "trees"), "--",
                        "--sweep", "tiny", "--limit", "1", "--providers", "numba_mla:simt"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert set(data["versions"]) == {"HEAD", ab.WORKTREE}
    assert all(len(rounds) == 1 and rounds[0] for rounds in data["rounds"].values())
    assert "numba_mla:simt" in r.stdout
