"""Run the whole test suite on a GPU machine over several calls of limited length.

A fresh GPU machine compiles every kernel the tests ask for, so the whole suite (``-m "gpu or
not gpu"``) takes longer than one call of the device tool allows (more than 860 s of tests on
the H200 at 16 workers). Each run writes pytest's verbose log; the next run, given the logs so
far, runs only the tests that none of them reports as passed or skipped (failed ones again,
and those the time limit cut off), so that the calls together cover every test once.

Usage (on a GPU machine, in the repository root):
    python scripts/gpu_suite.py --log $OUT/suite_1.txt --seconds 450
    (copy suite_1.txt back into the next call's tree, e.g. under an ignored .out/)
    python scripts/gpu_suite.py --log $OUT/suite_2.txt --done .out/suite_1.txt --seconds 450
Prints the counts and the failures (a test that failed in one log and passed in a later one
is named too); each failure's traceback is also written to ``LOG.tracebacks.txt`` the moment
it is reported (this module is loaded into the run as a pytest plugin), so that a run the time
limit stops before pytest's own report at the end keeps them. Exit status 0 when every test
has passed or been skipped in one of the logs, 1 when some failed, 3 when some were not
reached in time, 4 when collection failed (a module that does not import). ``--list``
prints the tests still to run, without running them. Paths and ``-k EXPR`` (pytest's keyword
expression) make the suite a part of the whole, e.g. one backend's tests after a change to
its kernel.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKS = "gpu or not gpu"
#: a result line of pytest-xdist's verbose log, "[gw3] [ 12%] PASSED tests/x.py::test_y[...]",
#: or of its short summary, "FAILED tests/x.py::test_y[...] - message"; ids may hold spaces
#: inside their brackets, and a warning the test printed may follow the id on the same line
#: (the id is then the module's path, the test's name and its whole bracket, the shortest
#: that leaves a space or the line's end after it)
OK = ("PASSED", "SKIPPED", "XFAIL")  # outcomes that need no rerun
BAD = ("FAILED", "ERROR", "XPASS")
RESULT = re.compile(r"^(?:\[gw\d+\] \[\s*\d+%\] )?(PASSED|SKIPPED|FAILED|ERROR|XFAIL|XPASS) "
                    r"(tests/\S*?(?:\[.*?\])?)(?: .*)?$", re.M)


#: the file ``pytest_runtest_logreport`` appends each failure's traceback to (set for the run)
TRACEBACKS = "GPU_SUITE_TRACEBACKS"


_WORKER = []  # (pytest_configure: whether this process is a pytest-xdist worker)


def pytest_configure(config):
    """(A pytest hook.) Note whether this process is one of pytest-xdist's workers."""
    _WORKER[:] = [hasattr(config, "workerinput")]


def pytest_runtest_logreport(report):
    """(A pytest hook: this module is loaded into the run by ``-p gpu_suite``.) A failed
    report's traceback, appended at once to the file that $GPU_SUITE_TRACEBACKS names; in the
    controlling process only (pytest-xdist hands it every worker's reports)."""
    path = os.environ.get(TRACEBACKS)
    if not path or any(_WORKER) or not report.failed:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{'=' * 20} {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


def collect(paths, keyword=None):
    """Every test id the suite has (those ``keyword`` selects, as pytest's ``-k``), in
    collection order."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", MARKS,
                        "-p", "no:cacheprovider", *(["-k", keyword] if keyword else []),
                        *paths], capture_output=True, text=True, cwd=ROOT)
    ids = [line.strip() for line in r.stdout.splitlines() if "::" in line]
    if r.returncode != 0 or not ids:  # (a module that fails to import is an error, not a pass)
        print(f"gpu_suite: collection failed (pytest exit {r.returncode}):\n"
              f"{r.stdout[-3000:]}{r.stderr[-2000:]}")
        return None
    return ids


def results(logs):
    """{test id: its last outcome} over the logs, in order."""
    seen = {}
    for log in logs:
        with open(log, encoding="utf-8", errors="replace") as f:
            for m in RESULT.finditer(f.read()):
                seen[m.group(2)] = m.group(1)
    return seen


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", help="the verbose pytest log this run writes")
    ap.add_argument("--done", nargs="*", default=[], help="logs of earlier runs")
    ap.add_argument("--seconds", type=int, default=450,
                    help="stop pytest after this long (SIGINT: results so far are kept)")
    ap.add_argument("--workers", type=int, default=16, help="pytest-xdist workers")
    ap.add_argument("--list", action="store_true", help="print the tests still to run")
    ap.add_argument("-k", dest="keyword", default=None,
                    help="only the tests this pytest -k expression selects (a part of the suite)")
    ap.add_argument("paths", nargs="*", default=["tests"])
    args = ap.parse_args(argv)

    ids = collect(args.paths, args.keyword)
    if ids is None:
        return 4
    per_log = [results([log]) for log in args.done]  # (each log read once)
    earlier = {i: o for r in per_log for i, o in r.items()}  # (a later log's word last)
    todo = [i for i in ids if earlier.get(i) not in OK]
    print(f"gpu_suite: {len(ids)} tests, {len(ids) - len(todo)} passed or skipped earlier, "
          f"{len(todo)} to run")
    if args.list:
        print("\n".join(todo))
        return 0
    if not args.log:
        ap.error("--log is needed to run")
    tracebacks = args.log + ".tracebacks.txt"
    if todo:
        if os.path.exists(tracebacks):
            os.remove(tracebacks)
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, **{TRACEBACKS: os.path.abspath(tracebacks)},
                   PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
        with open(args.log, "w") as out:
            cmd = ["timeout", "-s", "INT", "-k", "30", str(args.seconds), sys.executable,
                   "-m", "pytest",
                   "-n", str(args.workers), "-v", "-rfE", "-m", MARKS, "-p", "no:cacheprovider",
                   "-p", "gpu_suite", *todo]
            subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    now = {**earlier, **(results([args.log]) if todo else {})}
    passed = [i for i in ids if now.get(i) in OK]
    failed = [i for i in ids if now.get(i) in BAD]
    missing = [i for i in ids if i not in now]
    print(f"gpu_suite: {len(passed)} passed or skipped, {len(failed)} failed, "
          f"{len(missing)} not reached (of {len(ids)})")
    for i in failed:
        print(f"FAILED {i}")
    if failed and todo and os.path.exists(tracebacks):
        print(f"gpu_suite: tracebacks in {tracebacks}")
    failed_before = {i for r in per_log for i, o in r.items() if o in BAD}
    for i in passed:
        if i in failed_before:
            print(f"passed after failing in an earlier log: {i}")
    return 1 if failed else 3 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
