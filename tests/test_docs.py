"""Docs that cannot rot: the code blocks of README.md and docs/ run, and their references resolve.

Which blocks run
----------------
Every fenced block whose info string starts with ``python`` is code that must run:

- ```` ```python ````: runs everywhere, in the CUDA simulator without a GPU (tests/conftest.py
  selects it), so it must be tiny: all of them together stay under a minute of CPU;
- ```` ```python gpu ````: needs a real GPU (compiled PTX, timings, device arrays). Without
  one it is only compiled (a syntax check); ``pytest -m gpu`` on a GPU machine runs it.

Blocks of one file run in order in one namespace (a tutorial builds up step by step), each file
in a fresh one, from the repository root. Anything that is not meant to run (a signature, a
pseudo-code sketch, a shell command) goes in a block of another language (``text``, ``bash``).

Which references resolve
------------------------
- Markdown links and images ``[text](target)`` whose target is not a URL: the file (relative
  to the Markdown file) exists; a ``#anchor`` exists as a heading (GitHub's slugs) in the
  target, or in the same file for ``(#anchor)``.
- Paths in inline code that start with a top-level directory of the repository
  (``numba_mla/``, ``tests/``, ``scripts/``, ``docs/``, ``plots/``, ``.ci/``), or that name a
  top-level ``*.md`` / ``*.toml`` / ``*.cfg`` file: they exist, relative to the root. Words
  with placeholders (``<device>``, ``*``) are not paths and are skipped.
- Beyond the docs, no source, script, test or Markdown file names a ``*.md`` file that is not in
  the repository (URLs aside): notes kept outside it must not be cited from inside it.
"""
import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TOP_DIRS = ("numba_mla", "tests", "scripts", "docs", "plots", ".ci")


def doc_files():
    """README.md and every Markdown file under docs/, relative to the root."""
    files = ["README.md"]
    for dirpath, _, names in os.walk(os.path.join(ROOT, "docs")):
        files += [os.path.relpath(os.path.join(dirpath, n), ROOT)
                  for n in sorted(names) if n.endswith(".md")]
    return sorted(files)


FENCE = re.compile(r"^(`{3,})(.*)$")


def blocks(path):
    """(first line number, info string, source) of every fenced block of a Markdown file."""
    out, lines = [], open(os.path.join(ROOT, path), encoding="utf-8").read().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if m:
            fence, info, start = m.group(1), m.group(2).strip(), i + 1
            i += 1
            while i < len(lines) and lines[i].strip() != fence:
                i += 1
            out.append((start + 1, info, "\n".join(lines[start:i])))
        i += 1
    return out


def python_blocks(path):
    """(line, gpu_only, source) of the blocks that must run."""
    res = []
    for line, info, src in blocks(path):
        words = info.split()
        if words and words[0] == "python":
            res.append((line, "gpu" in words[1:], src))
    return res


def strip_fences(text):
    """Markdown text without its fenced blocks (references inside code blocks are code)."""
    return re.sub(r"^(`{3,}).*?^\1[ \t]*$", "", text, flags=re.S | re.M)


def prose(path):
    return strip_fences(open(os.path.join(ROOT, path), encoding="utf-8").read())


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path):
    """Every heading anchor of a Markdown file (repeats get GitHub's -1, -2 suffixes)."""
    seen, res = {}, set()
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", prose(path), flags=re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        res.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return res


def references(text):
    """(reference, kind) pairs of Markdown text without fences: kind "link" (relative to the
    file) or "code" (relative to the root)."""
    refs = []
    for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
        target = m.group(1)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            refs.append((target, "link"))
    for m in re.finditer(r"`([^`\n]+)`", text):
        for word in m.group(1).split():
            word = word.strip("\"',;:()")
            if not re.fullmatch(r"[\w./-]+", word):
                continue
            if word.startswith(tuple(d + "/" for d in TOP_DIRS)) or \
                    re.fullmatch(r"[\w-]+\.(md|toml|cfg)", word):
                refs.append((word, "code"))
    return refs


# -- the tests -------------------------------------------------------------------------------
@pytest.mark.parametrize("path", doc_files())
def test_references_resolve(path):
    """Every relative link and every file path in inline code names something that exists."""
    base = os.path.dirname(os.path.join(ROOT, path))
    missing = []
    for ref, kind in references(prose(path)):
        target, _, anchor = ref.partition("#")
        if kind == "code":
            full = os.path.join(ROOT, target)
        else:
            full = os.path.join(base, target) if target else os.path.join(ROOT, path)
        if not os.path.exists(full):
            missing.append(f"{ref} ({kind}): no such file")
        elif anchor and full.endswith(".md"):
            rel = os.path.relpath(full, ROOT)
            if anchor not in anchors(rel):
                missing.append(f"{ref}: no heading with anchor #{anchor} in {rel}")
    assert not missing, f"{path}: " + "; ".join(dict.fromkeys(missing))


SOURCE_EXTS = (".py", ".md", ".sh", ".cfg", ".toml")


def cited_markdown(text):
    """The ``*.md`` names a text cites, URLs left out."""
    text = re.sub(r"https?://\S+", "", text)
    return set(re.findall(r"(?<![\w/.-])([\w./-]*\w\.md)\b", text))


#: Markdown files the code writes (``numba-mla plot``'s tables), named as outputs, not cited.
GENERATED = {"varlen.md", "headline.md"}


def test_no_file_cites_missing_markdown():
    """No file of the repository cites a Markdown file that is not in it (by path from the
    root or from the citing file, or by bare name anywhere in the tree); the names of files
    the code writes (GENERATED) are outputs, not citations."""
    present, sources = set(GENERATED), []
    for dirpath, dirnames, names in os.walk(ROOT):
        # the repository's own files: not .git, .venv, .peers and other dot-folders, builds
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"
                       and d not in ("build", "dist") and not d.endswith(".egg-info")]
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), ROOT)
            if n.endswith(".md"):
                present.add(n)
            if n.endswith(SOURCE_EXTS) and rel != os.path.join("tests", "test_docs.py"):
                sources.append(rel)
    missing = []
    for rel in sources:
        with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
            for name in cited_markdown(f.read()):
                here = os.path.join(ROOT, os.path.dirname(rel), name)
                if os.path.exists(os.path.join(ROOT, name)) or os.path.exists(here) or \
                        ("/" not in name and name in present):
                    continue
                missing.append(f"{rel} cites {name}")
    assert not missing, "; ".join(sorted(missing))


def _run_file(path, gpu):
    """Run the file's blocks in order in one namespace, from the root; ``gpu``: the GPU-only
    blocks too (else they are skipped)."""
    namespace = {"__name__": "__doc_example__"}
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for line, gpu_only, src in python_blocks(path):
            if gpu_only and not gpu:
                continue
            code = compile(src, f"{path}:{line}", "exec")
            try:
                exec(code, namespace)
            except Exception as e:
                raise AssertionError(f"the block at {path}:{line} failed: {e!r}") from e
    finally:
        os.chdir(cwd)


RUNNABLE = [p for p in doc_files() if any(not g for _, g, _ in python_blocks(p))]
GPU_ONLY = [p for p in doc_files() if any(g for _, g, _ in python_blocks(p))]


@pytest.mark.kernel
@pytest.mark.parametrize("path", RUNNABLE)
def test_python_blocks_run(path):
    """The file's ```python blocks run (in the simulator without a GPU)."""
    _run_file(path, gpu=False)


@pytest.mark.parametrize("path", GPU_ONLY)
def test_gpu_blocks_compile(path):
    """The ```python gpu blocks are valid Python (all that can be checked without a GPU)."""
    for line, gpu_only, src in python_blocks(path):
        if gpu_only:
            compile(src, f"{path}:{line}", "exec")


@pytest.mark.gpu
@pytest.mark.parametrize("path", GPU_ONLY)
def test_gpu_blocks_run(path):
    """On a GPU, every block of the file runs, the GPU-only ones included."""
    _run_file(path, gpu=True)


def test_the_checks_see_something():
    """The parsers find what they are meant to (so the tests above cannot pass by finding
    nothing): README.md has python blocks, and references of both kinds are recognised."""
    assert python_blocks("README.md")
    text = strip_fences("See [the notes](docs/x.md#a-b) and `numba_mla/foo.py --flag`,\n"
                        "not [a site](https://example.com) nor `plots/bench_<device>.json`.\n"
                        "```python\n# [in code](ignored.md)\n```\n")
    assert references(text) == [("docs/x.md#a-b", "link"), ("numba_mla/foo.py", "code")]
    assert cited_markdown("see PERFORMANCE.md, docs/x.md and https://a.b/c/d.md") == \
        {"PERFORMANCE.md", "docs/x.md"}
    assert slug("Your first kernel") == "your-first-kernel"
    assert slug("`mla_decode`: the API") == "mla_decode-the-api"


def test_readme_layout_names_every_module_and_script():
    """The README's layout block names every module of the package and its subpackages' and
    every script: a file added without a word there fails here."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = text.split("## Layout", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    named = set(re.findall(r"[\w.]+\.(?:py|sh|md|toml|cfg)", block))
    missing = []
    # (kernels/ is the subpackage whose modules the block lists one by one)
    for folder in ("numba_mla", "numba_mla/kernels", "scripts", "examples"):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if name.endswith((".py", ".sh")) and name != "__init__.py" and name not in named:
                missing.append(f"{folder}/{name}")
    assert not missing, f"README's layout does not name: {missing}"
