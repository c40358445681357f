"""Rows and what is written from them: the JSON row of one measurement, validation, JSON, CSV
and the terminal table; the run's metadata (device, date, commit, versions).
"""
import csv
import datetime
import json
import math
import os
import re
import subprocess
import sys

import numpy as np

from .configs import SCALE, TOLERANCE
from .problems import count

#: The keys every JSON row has.
ROW_KEYS = ("provider", "backend", "batch", "heads", "seqlen", "sq", "dtype", "page_size", "us",
            "gbps", "tflops", "rel_err", "device")
#: How rows count bytes and FLOPs (``meta["counting"]``).
COUNTING = ("docs/performance.md, 'Counting': bytes = kept cache rows*576*2 + "
            "B*Sq*H*(576+512)*2; FLOPs = 2*(576+512) per head per kept (query, key) pair")


def rel_err(got, ref):
    """max |got - ref| / max |ref| (NaN when got has NaN where ref is finite)."""
    got = np.asarray(got, np.float64)
    scale = float(np.abs(ref).max(initial=0.0)) or 1.0
    return float(np.abs(got - ref).max(initial=0.0)) / scale


def make_row(prov, problem, timing, err, info, dev_name, ceilings, host, warm_us):
    """The JSON row of one (configuration, provider) measurement. ``overhead_us`` (what one
    call + synchronize costs beyond the GPU time) is None unless the GPU time without the L2
    flush (``warm_us``, as in the host loop) was measured: against the flushed time the
    difference means nothing."""
    cfg = problem.config
    us, p10, p90 = timing
    nbytes, flops = problem.counts()
    copy_gbps, dense_tflops = ceilings
    gbps, tflops = nbytes / us / 1e3, flops / us / 1e6
    host_sync_us, host_pipelined_us = host
    lengths = problem.lengths_host
    row = dict(
        provider=prov.name, backend=prov.backend, batch=cfg.batch, heads=cfg.heads,
        seqlen=cfg.seqlen, sq=cfg.sq, dtype=cfg.dtype, kv=cfg.kv, row_bytes=cfg.row_bytes,
        page_size=cfg.page_size, mask=cfg.mask,
        varlen=cfg.varlen, spread=cfg.spread, length_min=int(lengths.min()),
        length_max=int(lengths.max()), mean_seqlen=float(lengths.mean()), sweep=cfg.sweep,
        num_partitions_requested=cfg.num_partitions, num_partitions=None,
        us=us, us_p10=p10, us_p90=p90, us_warm=warm_us,
        gbps=gbps, tflops=tflops, bytes=nbytes, flops=flops,
        intensity=flops / nbytes if nbytes else None,
        frac_copy=gbps / copy_gbps if copy_gbps else None,
        frac_dense=tflops / dense_tflops if dense_tflops else None,
        host_us=host_pipelined_us if host_pipelined_us is not None else host_sync_us,
        host_sync_us=host_sync_us,
        overhead_us=None if warm_us is None else host_sync_us - warm_us,
        rel_err=err, tolerance=TOLERANCE[cfg.dtype], ref_subset=problem.ref_subset,
        device=dev_name)
    row.update(info)
    return row


# ---------------------------------------------------------------------------------------------
# Metadata
# ---------------------------------------------------------------------------------------------
def versions(dev):
    """Installed versions of numba_mla, its dependencies and the peers; a peer imported from
    a folder rather than installed (FlashMLA built from source) gives its module's
    ``__version__`` and path once something has imported it, else None."""
    from importlib import metadata

    import numba_mla

    out = {"numba_mla": numba_mla.__version__}
    for key, dist in (("numba", "numba"), ("numba_cuda", "numba-cuda"), ("numpy", "numpy"),
                      ("ml_dtypes", "ml_dtypes"), ("torch", "torch"), ("flash_mla", "flash_mla"),
                      ("flashinfer", "flashinfer-python"), ("vllm", "vllm"),
                      ("triton", "triton")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            module = sys.modules.get(key)
            out[key] = (None if module is None else
                        f"{getattr(module, '__version__', '?')} from "
                        f"{os.path.dirname(getattr(module, '__file__', None) or '?')}")
    if dev is not None and dev.torch is not None:
        out["torch"] = dev.torch.__version__
        out["cuda_runtime"] = dev.torch.version.cuda
    return out


def git_commit():
    """Short commit of the checkout this package lives in (``+dirty`` when it has changes);
    None outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                             capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def stamp(dev, commit=None):
    """The metadata every output file carries: device, simulator, date, time, commit,
    versions."""
    meta = dict(device=dev.name, simulator=dev.simulator,
                date=datetime.date.today().isoformat(),
                time=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                commit=commit or git_commit() or "unknown", versions=versions(dev))
    if not dev.simulator:
        meta["multiprocessors"] = dev.multiprocessors
    return meta


def device_slug(name):
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "device"


# ---------------------------------------------------------------------------------------------
# Validation, JSON, CSV
# ---------------------------------------------------------------------------------------------
def failures(result):
    """Why validation failed: a numba_mla row whose rel_err is above its dtype's tolerance (or
    not a number), or a numba_mla provider that raised. Empty when all is well."""
    bad = []
    for r in result["rows"]:
        if r.get("provider") != "numba_mla":
            continue
        err, tol = r.get("rel_err"), r.get("tolerance") or TOLERANCE.get(r.get("dtype"), 2e-2)
        if err is None or not err <= tol:
            bad.append(f"numba_mla:{r.get('backend')} {r['batch']}x{r['heads']}x{r['seqlen']} "
                       f"Sq={r.get('sq')} {r.get('mask', 'null')}: rel_err {err} > {tol}")
    for e in result["meta"].get("errors", []):
        if e.get("provider") == "numba_mla":
            bad.append(f"numba_mla:{e.get('backend')} {e.get('config')}: {e.get('error')}")
    return bad


def clean(x):
    """JSON-safe: NaN and infinities become None, NumPy scalars plain Python."""
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def write_json(result, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(clean(result), f, indent=1, allow_nan=False)
        f.write("\n")


def columns(rows):
    """ROW_KEYS first, then every other key in first-seen order."""
    cols = list(ROW_KEYS)
    for r in rows:
        cols += [k for k in r if k not in cols]
    return cols


def write_csv(rows, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns(rows), restval="")
        w.writeheader()
        for r in clean(rows):
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})


# ---------------------------------------------------------------------------------------------
# The terminal table
# ---------------------------------------------------------------------------------------------
def _fmt(x, spec, none="-"):
    return none if x is None else format(x, spec)


def _overhead(v):
    """A host overhead as printed: below zero it is the spread of two medians, not a cost."""
    if v is None:
        return "-"
    return "~0" if v < 0 else f"{v:.0f}"


def text_table(header, rows, left=()):
    """Lines of a table whose columns are as wide as their widest cell (so simulator-sized
    times keep it aligned); columns named in ``left`` are left-aligned, the rest right."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]

    def line(cells):
        return " ".join(c.ljust(w) if h in left else c.rjust(w)
                        for c, w, h in zip(cells, widths, header)).rstrip()

    head = line(header)
    return [head, "-" * len(head)] + [line(r) for r in rows]


def row_label(r):
    """(provider, shape) of a row as the tables print them: the provider with its backend,
    B x H x L with the lengths' spread and an FP8 cache's layout."""
    name = r["provider"] + (f":{r['backend']}" if r.get("backend") else "")
    shape = f"{r['batch']}x{r['heads']}x{r['seqlen']}"
    if r.get("spread"):
        shape += f" +-{r['spread']:g}L"
    elif r.get("varlen"):
        shape += "~"
    if r.get("kv", "same") != "same":
        shape += f" {r['kv']}"
    return name, shape


def format_table(rows):
    """A table of the rows, one line each."""
    header = ["provider", "B x H x L", "Sq", "mask", "P", "us", "p10..p90", "GB/s", "TFLOP/s",
              "%copy", "%dense", "host us", "ovh us", "rel_err", "ok"]
    cells = []
    for r in rows:
        name, shape = row_label(r)
        tol = r.get("tolerance") or TOLERANCE.get(r.get("dtype"), 2e-2)
        err = r.get("rel_err")
        ok = "ok" if err is not None and err <= tol else ("FAIL" if r["provider"] == "numba_mla"
                                                          else "(hi)")
        spread = (f"{_fmt(r.get('us_p10'), '.1f')}..{_fmt(r.get('us_p90'), '.1f')}"
                  if r.get("us_p10") is not None else "-")
        pct = lambda f: _fmt(None if f is None else 100 * f, ".0f")  # noqa: E731
        cells.append([name, shape, str(r.get("sq", 1)), r.get("mask", "null"),
                      _fmt(r.get("num_partitions"), "d"), _fmt(r.get("us"), ".1f"), spread,
                      _fmt(r.get("gbps"), ".0f"), _fmt(r.get("tflops"), ".1f"),
                      pct(r.get("frac_copy")), pct(r.get("frac_dense")),
                      _fmt(r.get("host_us"), ".0f"), _overhead(r.get("overhead_us")),
                      _fmt(err, ".1e"), ok])
    return "\n".join(text_table(header, cells, left=("provider", "B x H x L", "mask", "ok")))


def format_notes(meta):
    """Skipped providers and errors, one line each."""
    lines = []
    for s in meta.get("skipped", []):
        who = s["provider"] + (f":{s['backend']}" if s.get("backend") else "")
        lines.append(f"skipped {who} ({s['count']} runs, first {s['first']}): {s['reason']}")
    for e in meta.get("errors", []):
        who = e["provider"] + (f":{e['backend']}" if e.get("backend") else "")
        lines.append(f"ERROR {who} {e['config']}: {e['error']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The first FMA-kernel run (plots/simt_h200.json, an earlier script's output) in this schema
# ---------------------------------------------------------------------------------------------
#: The H200's ceilings as docs/performance.md gives them (measured 2026-11-30, same machine).
H200_COPY_GBPS, H200_DENSE_TFLOPS = 4300.0, 785.0


def from_bench_simt(doc, source="plots/simt_h200.json", copy_gbps=H200_COPY_GBPS,
                    matmul_tflops=H200_DENSE_TFLOPS):
    """``plots/simt_h200.json`` (the first FMA-kernel run, by a script since retired) in this
    module's schema. Every measured value is kept as it is; ``call_us`` (wall time per call
    over 20 calls, one synchronize at the end) is ``host_us``; the counts, intensity and
    ceiling fractions are derived; the ceilings (not measured in that run) are
    docs/performance.md's, as ``meta['ceilings_source']`` says."""
    import numba_mla as nm

    meta = dict(doc["meta"])
    vers = {k: meta.pop(k, None) for k in ("numba_mla", "torch", "numpy", "numba", "numba_cuda")}
    meta.update(
        versions=vers, simulator=False, sweep="default", copy_gbps=copy_gbps,
        matmul_tflops=matmul_tflops, skipped=[], errors=[], tolerance=TOLERANCE, scale=SCALE,
        source=(f"{source}: rows of scripts/bench_simt.py on {meta.get('device')} "
                f"(commit {meta.get('commit')}, {meta.get('date')}), converted by "
                "numba_mla.bench.from_bench_simt; measured values unchanged"),
        ceilings_source="docs/performance.md (same H200, 2026-11-30); not measured in this run",
        host_timing="host_us: bench_simt's call_us, wall time per numba_mla.mla_decode call "
                    "over 20 calls with one synchronize at the end (numba_mla rows only)")
    rows = []
    for r in doc["rows"]:
        r = dict(r)
        lengths = np.full(r["batch"], r["seqlen"], np.int64)
        nbytes, flops = count(lengths, r.get("sq", 1), r["heads"], nm.NullMask())
        r.setdefault("mask", "null")
        r.setdefault("varlen", False)
        r.setdefault("sweep", "default")
        r.setdefault("num_partitions", None)
        r["bytes"], r["flops"], r["intensity"] = nbytes, flops, flops / nbytes
        r["frac_copy"] = r["gbps"] / copy_gbps
        r["frac_dense"] = r["tflops"] / matmul_tflops
        r["host_us"] = r.pop("call_us", None)
        r["tolerance"] = TOLERANCE[r["dtype"]]
        r["ref_subset"] = f"sequence 0 of {r['batch']}, all heads"
        rows.append(r)
    return dict(meta=meta, rows=rows)
