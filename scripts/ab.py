"""Time two or more versions of numba_mla in one session: ``numba-mla bench`` for each, rounds
interleaved (A, B, A, B, ...), each version imported from a tree of its own, then one table.

Why a script: an A/B is only worth the noise it beats, and runs on different machines (or far
apart on one) differ by more than a change often gains; and a tree put on ``PYTHONPATH`` loses
to the checkout in the current directory, which ``python -c`` puts first on ``sys.path``, so
every "version" silently runs the checkout. Here each run starts in its own tree and checks
that the numba_mla it imported is that tree's before it times anything.

A version is a git revision (anything ``git archive`` takes), ``WORKTREE`` (the checkout's
numba_mla as it is now, uncommitted edits included), or a directory holding a ``numba_mla``
folder (a tree exported elsewhere, e.g. a branch's, for a machine whose copy of the repository
has only the checked-out branch; labelled by the first line of its ``COMMIT`` file if it has
one, else by its name). Any of these may be followed by module constants to set in its tree,
``REV+MODULE.NAME=VALUE[+...]`` with MODULE relative to numba_mla and VALUE a Python literal,
e.g. ``WORKTREE+kernels.mma_sync_roles.SCORE_QUARTERS=True``: the line ``NAME = ...`` of that
module (exactly one) is replaced, and the label gains ``+NAME=VALUE``; so an A/B of a flag
needs no tree made by hand.

Usage: python scripts/ab.py REV [REV ...] [--rounds 2] [--out ab.json] [--pythonpath DIR]
                            [--worktree-label LABEL] -- BENCH ARGS (e.g. --sweep default --providers numba_mla:mma)
Prints one row per configuration: each version's median GPU microseconds, round by round,
and its mean over the first version's. ``--pythonpath`` is added after the version's tree (a
peer's module, e.g. FlashMLA's build); ``--out`` keeps every round's rows and the versions'
commits as JSON. After each whole round (every version once) the JSON is written and the
table so far printed to stderr, so a run stopped by a time limit keeps the rounds it
finished.
"""
import argparse
import ast
import json
import re
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKTREE = "WORKTREE"

#: the child: refuse to time a numba_mla from anywhere but its tree, then run the bench CLI
CHILD = """import os, sys
import numba_mla
tree = os.path.realpath(sys.argv.pop(1))
if not os.path.realpath(numba_mla.__file__).startswith(tree + os.sep):
    sys.exit(f"ab.py: imported {numba_mla.__file__}, not the tree {tree}")
from numba_mla.cli import main
sys.exit(main())
"""


def split_version(version):
    """(rev, [(module, name, value), ...]) of ``REV+MODULE.NAME=VALUE+...`` (a directory that
    holds numba_mla is a rev as it is, whatever its name)."""
    if is_tree(version) or "+" not in version:
        return version, []
    rev, *sets = version.split("+")
    out = []
    for item in sets:
        lhs, eq, value = item.partition("=")
        module, dot, name = lhs.rpartition(".")
        if not (eq and dot and module and name.isidentifier()):
            raise ValueError(f"ab.py: {item!r} is not MODULE.NAME=VALUE")
        try:
            ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise ValueError(f"ab.py: {value!r} ({item}) is not a Python literal") from None
        out.append((module, name, value))
    return rev, out


def set_constants(tree, sets):
    """Replace each set's ``NAME = ...`` line (exactly one) in ``tree``'s numba_mla module."""
    for module, name, value in sets:
        path = os.path.join(tree, "numba_mla", *module.split(".")) + ".py"
        with open(path) as f:
            text = f.read()
        pattern = re.compile(rf"^{name} = .*$", re.M)
        if len(pattern.findall(text)) != 1:
            raise ValueError(f"ab.py: {path} has no single line '{name} = ...'")
        with open(path, "w") as f:
            f.write(pattern.sub(lambda m: f"{name} = {value}", text))


def is_tree(rev):
    """Whether the version ``rev`` is a directory holding a numba_mla package."""
    return os.path.isdir(os.path.join(rev, "numba_mla"))


def commit_of(rev, repo=REPO):
    """The abbreviated commit ``rev`` names (``WORKTREE``: HEAD's, with ``+`` where the
    checkout's numba_mla differs from it)."""
    def git(*args):
        return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    if is_tree(rev):
        path = os.path.join(rev, "COMMIT")
        if os.path.exists(path):
            with open(path) as f:
                return f.readline().strip()
        return os.path.basename(os.path.normpath(rev))
    if rev != WORKTREE:
        return git("rev-parse", "--short", rev)
    dirty = git("status", "--porcelain", "--", "numba_mla")
    return git("rev-parse", "--short", "HEAD") + ("+" if dirty else "")


def export_tree(rev, dest, repo=REPO):
    """numba_mla of ``rev`` into ``dest`` (created); returns ``dest``."""
    os.makedirs(dest, exist_ok=True)
    if rev == WORKTREE or is_tree(rev):
        src = repo if rev == WORKTREE else rev
        shutil.copytree(os.path.join(src, "numba_mla"), os.path.join(dest, "numba_mla"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        return dest
    archive = subprocess.run(["git", "-C", repo, "archive", rev, "numba_mla"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return dest


def bench_command(tree, label, bench_args, out):
    """The child's command line: the bench CLI with ``bench_args``, labelled ``label``."""
    return [sys.executable, "-c", CHILD, tree, "bench", *bench_args, "--commit", label,
            "--out", out, "--no-progress"]


def run_one(tree, label, bench_args, out, cache_dir, pythonpath=()):
    """One bench run of the tree at ``tree`` (its own directory, its own compile cache);
    returns the JSON it wrote."""
    env = dict(os.environ, NUMBA_MLA_CACHE_DIR=cache_dir,
               PYTHONPATH=os.pathsep.join([tree, *pythonpath]))
    subprocess.run(bench_command(tree, label, bench_args, out), cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def config_key(row):
    """What a row measured, without the times: one configuration of one provider."""
    return (row["provider"], row.get("backend"), row["batch"], row["heads"], row["seqlen"],
            row.get("sq", 1), row.get("spread", 0.0), row.get("mask"), row.get("dtype"),
            row.get("kv"), row.get("page_size"))


def table(runs):
    """Lines of a table from ``runs``: {version: [bench JSON of each round]}. Each
    configuration (labelled as ``numba-mla bench`` prints it): every version's median us
    round by round, and its mean over the first version's."""
    if REPO not in sys.path:  # run as a script where numba_mla is not installed
        sys.path.insert(0, REPO)
    from numba_mla.bench.report import row_label, text_table

    versions = list(runs)
    times, labels = {}, {}
    for v, rounds in runs.items():
        for data in rounds:
            for row in data["rows"]:
                if row.get("us") is not None:
                    key = config_key(row)
                    labels[key] = [*row_label(row), str(row.get("sq", 1)),
                                   row.get("mask", "null")]
                    times.setdefault(key, {}).setdefault(v, []).append(row["us"])
    cells = []
    for key, by_version in times.items():
        base = by_version.get(versions[0])
        line = list(labels[key])
        for v in versions:
            t = by_version.get(v)
            text = " / ".join(f"{x:.1f}" for x in t) if t else "-"
            if t and base and v != versions[0]:
                text += f" ({sum(t) / len(t) / (sum(base) / len(base)):.3f})"
            line.append(text)
        cells.append(line)
    return text_table(["provider", "B x H x L", "Sq", "mask", *versions], cells,
                      left=("provider", "B x H x L", "mask"))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("revs", nargs="+",
                    help=f"git revisions, {WORKTREE}, or directories holding numba_mla")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None, help="every round's rows as JSON")
    ap.add_argument("--pythonpath", action="append", default=[],
                    help="a directory to import from after the version's tree (repeatable)")
    ap.add_argument("--keep", default=None, help="build the trees here (default: a temp dir)")
    ap.add_argument("--worktree-label", default=None,
                    help=f"label {WORKTREE} with this (its commit in the JSON and the table) "
                         "rather than the checkout's git: a copy of the checkout whose .git is "
                         "older than its files, as a GPU machine's copy may be, would name a "
                         "stale commit")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if len(set(args.revs)) != len(args.revs):
        ap.error("each version once")
    root = args.keep or tempfile.mkdtemp(prefix="numba_mla_ab_")
    split = {v: split_version(v) for v in args.revs}
    commits = {v: (args.worktree_label if rev == WORKTREE and args.worktree_label
                   else commit_of(rev)) + "".join(f"+{n}={x}" for _, n, x in sets)
               for v, (rev, sets) in split.items()}
    trees = {}
    for i, (v, (rev, sets)) in enumerate(split.items()):
        trees[v] = export_tree(rev, os.path.join(root, f"v{i}"))
        set_constants(trees[v], sets)
    pythonpath = [os.path.abspath(p) for p in args.pythonpath]
    runs = {v: [] for v in args.revs}
    for r in range(args.rounds):
        for i, v in enumerate(args.revs):
            out = os.path.join(root, f"v{i}_round{r}.json")
            runs[v].append(run_one(trees[v], commits[v], bench_args, out,
                                   os.path.join(root, f"cache{i}"), pythonpath))
            print(f"ab.py: round {r + 1} of {args.rounds}, {v} ({commits[v]}) done",
                  file=sys.stderr)
        if args.out:  # first: the rounds are kept even if the table fails
            save(args.out, runs, commits, bench_args)
        if r + 1 < args.rounds:
            print("\n".join(table(runs)), file=sys.stderr, flush=True)
    print("\n".join(table(runs)))
    return 0


def save(path, runs, commits, bench_args):
    """The rounds so far, the versions' commits and the bench's arguments as JSON."""
    meta = dict(next(iter(runs.values()))[0]["meta"], commit=None)
    with open(path, "w") as f:
        json.dump({"meta": meta, "versions": commits, "bench_args": bench_args,
                   "rounds": {commits[v]: [d["rows"] for d in runs[v]] for v in runs}},
                  f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
