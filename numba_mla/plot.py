"""``numba-mla plot``: PNG figures from a ``numba-mla bench`` JSON file (matplotlib, Agg).

1. ``latency_vs_length.png``: GPU time against cache length, one panel per head count, a line
   per provider (and batch size); log-log.
2. ``roofline.png``: every row's achieved TFLOP/s against its arithmetic intensity (FLOP per
   byte of the fewest bytes), under the measured copy-bandwidth line and dense bf16 ceiling.
3. ``splitk.png``: GPU time against the split-K factor (num_partitions) for the long single
   sequence, p10-p90 as error bars; the library's own choice starred.
4. ``latency_vs_spread.png``: GPU time against the spread of the lengths (the ``varlen``
   sweep: lengths uniform in [L(1-s), L(1+s)]), a panel per shape, a line per provider.
5. ``host_overhead.png``: what one whole Python call costs beyond the GPU time, per provider
   and shape (``overhead_us``, or ``host_us - us`` for files from before it existed). A value
   below zero is the spread of two medians, drawn as such (left of the zero line).

Given ``scripts/host_overhead.py``'s JSON instead, it draws ``host_paths.png``: per path
(plain ``mla_decode``, a new cache each call, a prepared step, FlashMLA, torch), one call +
synchronize and enqueue only.

Each figure is titled with the device, date and commit of the run. A figure whose rows are
absent from the file is skipped with a message.
"""
import glob
import json
import os

FIGURES = ("latency_vs_length", "roofline", "splitk", "latency_vs_spread", "host_overhead")
MARKERS = "osD^v<>phX*"


def load(path):
    """(meta, rows) of a bench JSON (rows with a time), or of ``scripts/host_overhead.py``'s
    JSON (rows with a ``path``)."""
    with open(path) as f:
        doc = json.load(f)
    rows = doc.get("rows", [])
    if rows and all("path" in r for r in rows):
        return doc.get("meta", {}), rows
    return doc.get("meta", {}), [r for r in rows if r.get("us")]


def default_json(directory="plots"):
    """The newest ``plots/bench_*.json``, or None."""
    found = sorted(glob.glob(os.path.join(directory, "bench_*.json")), key=os.path.getmtime)
    return found[-1] if found else None


def _who(r):
    return r["provider"] + (f":{r['backend']}" if r.get("backend") else "")


def _shape(r):
    s = f"{r['batch']}x{r['heads']}x{r['seqlen']}"
    if r.get("sq", 1) != 1:
        s += f" Sq={r['sq']}"
    return s


def _stamp(meta):
    return f"{meta.get('device', '?')}, {meta.get('date', '?')}, commit {meta.get('commit', '?')}"


def _intensity(r):
    """FLOP per byte: the row's own counts, else docs/performance.md's formula (null mask)."""
    if r.get("intensity"):
        return r["intensity"]
    B, H, L, sq = r["batch"], r["heads"], r["seqlen"], r.get("sq", 1)
    nbytes = 2 * (B * L * 576 + B * sq * H * (576 + 512))
    return 2 * B * sq * H * L * (576 + 512) / nbytes


def _styles(keys):
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {k: colors[i % len(colors)] for i, k in enumerate(sorted(keys))}


def _log_log(ax, xlabel, ylabel, xbase=10):
    """Both axes logarithmic (x in powers of ``xbase``), labelled, with a grid at every tick."""
    ax.set_xscale("log", base=xbase)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


def _save(fig, path, plt):
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def latency_vs_length(meta, rows, path, plt):
    sel = [r for r in rows if r.get("num_partitions_requested") is None
           and r.get("sweep") != "varlen"]
    lengths_rows = [r for r in sel if r.get("sweep") == "lengths"]
    sel = lengths_rows or sel
    if not sel:
        return "no rows with the library's own split-K choice"
    heads = sorted({r["heads"] for r in sel})
    color = _styles({_who(r) for r in sel})
    fig, axes = plt.subplots(1, len(heads), figsize=(6.2 * len(heads), 4.8), squeeze=False)
    for ax, H in zip(axes[0], heads):
        groups = {}
        for r in sel:
            if r["heads"] == H:
                key = (_who(r), r["batch"], r.get("sq", 1), r.get("mask", "null"),
                       bool(r.get("varlen")))
                groups.setdefault(key, []).append(r)
        batches = sorted({k[1] for k in groups})
        for key in sorted(groups):
            rs = sorted(groups[key], key=lambda r: r["seqlen"])
            who, B, sq, mask, varlen = key
            label = f"{who} B={B}" + (f" Sq={sq}" if sq != 1 else "") + \
                (f" {mask}" if mask != "null" else "") + (" varlen" if varlen else "")
            ax.plot([r["seqlen"] for r in rs], [r["us"] for r in rs], color=color[who],
                    marker=MARKERS[batches.index(B) % len(MARKERS)], label=label)
        _log_log(ax, "cache length L (keys per sequence)", "GPU time per call (us, median)",
                 xbase=2)
        ax.set_title(f"H = {H}")
        ax.legend(fontsize=7)
    fig.suptitle(f"MLA decode latency vs cache length\n{_stamp(meta)}", fontsize=10)
    _save(fig, path, plt)


def roofline(meta, rows, path, plt):
    import numpy as np

    # Each provider's own choices (rows with a forced split-K factor belong to the split-K
    # figure: P = 1 on one sequence is slow on purpose).
    pts = [r for r in rows if r.get("tflops") and r.get("num_partitions_requested") is None]
    if not pts:
        return "no rows with TFLOP/s"
    copy, dense = meta.get("copy_gbps"), meta.get("matmul_tflops")
    inten = np.array([_intensity(r) for r in pts])
    lo, hi = inten.min() / 2, inten.max() * 2
    if dense and copy:
        hi = max(hi, 2 * dense * 1e3 / copy)  # show the ridge point
    grid = np.geomspace(lo, hi, 200)
    fig, ax = plt.subplots(figsize=(9.5, 5.5))
    if copy:
        ax.plot(grid, copy * grid / 1e3, "k--", lw=1, label=f"copy bandwidth {copy:.0f} GB/s")
    if dense:
        ax.axhline(dense, color="k", ls=":", lw=1, label=f"dense bf16 matmul {dense:.0f} TFLOP/s")
    if copy and dense:
        ax.plot(grid, np.minimum(copy * grid / 1e3, dense), "k-", lw=1.5, alpha=0.4,
                label="roof")
    who = sorted({_who(r) for r in pts})
    color = _styles(who)
    heads = sorted({r["heads"] for r in pts})
    for w in who:
        for H in heads:
            rs = [r for r in pts if _who(r) == w and r["heads"] == H]
            if rs:
                ax.scatter([_intensity(r) for r in rs], [r["tflops"] for r in rs],
                           color=color[w], marker=MARKERS[heads.index(H) % len(MARKERS)],
                           label=f"{w} H={H}", s=28, zorder=3)
    if len(pts) <= 30:
        for r in pts:
            ax.annotate(f"{r['batch']}x{r['heads']}x{r['seqlen']}", (_intensity(r), r["tflops"]),
                        fontsize=6, xytext=(3, 3), textcoords="offset points")
    _log_log(ax, "arithmetic intensity (FLOP per byte of the fewest bytes)", "achieved TFLOP/s")
    _log_ticks(ax.xaxis, lo, hi)
    _log_ticks(ax.yaxis, *ax.get_ylim())
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside: no point hidden
    note = "" if copy else " (no ceilings in this file)"
    ax.set_title(f"Roofline{note}\n{_stamp(meta)}", fontsize=10)
    _save(fig, path, plt)


def _log_ticks(axis, lo, hi):
    """Ticks at 1, 2 and 5 times the powers of ten inside [lo, hi] on a log axis (finer under
    a decade), labelled as plain numbers: matplotlib's default labels only the decades, and a
    range narrower than a decade or two then shows one label or none."""
    import math

    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    def within(steps):
        return [m * 10.0**e
                for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                for m in steps if lo <= m * 10.0**e <= hi]

    ticks = within((1, 2, 5))
    if len(ticks) < 3:  # under a decade: finer steps
        ticks = within((1, 1.5, 2, 3, 4, 6, 8))
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def latency_vs_spread(meta, rows, path, plt):
    sel = [r for r in rows if r.get("sweep") == "varlen" and r.get("spread") is not None
           and r.get("num_partitions_requested") is None]
    if not sel:
        return "no rows of the varlen sweep (numba-mla bench --sweep varlen)"
    shapes = []
    for r in sel:
        if _shape(r) not in shapes:
            shapes.append(_shape(r))
    color = _styles({_who(r) for r in sel})
    ncols = min(3, len(shapes))
    nrows = -(-len(shapes) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 3.9 * nrows), squeeze=False)
    for ax, shape in zip(axes.flat, shapes):
        groups = {}
        for r in sel:
            if _shape(r) == shape:
                groups.setdefault(_who(r), []).append(r)
        for who in sorted(groups):
            rs = sorted(groups[who], key=lambda r: r["spread"])
            ax.plot([r["spread"] for r in rs], [r["us"] for r in rs], marker="o",
                    color=color[who], label=who)
        ax.set_xlabel("length spread s (lengths uniform in [L(1-s), L(1+s)])")
        ax.set_ylabel("GPU time per call (us, median)")
        ax.set_xticks(sorted({r["spread"] for r in sel}))
        # log: the FMA kernel's times would flatten the others' on a linear axis
        ax.set_yscale("log")
        _log_ticks(ax.yaxis, *ax.get_ylim())
        ax.set_title(f"B x H x L = {shape}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for ax in list(axes.flat)[len(shapes):]:
        ax.set_visible(False)
    fig.suptitle(f"MLA decode latency vs spread of the lengths (mean L fixed)\n{_stamp(meta)}",
                 fontsize=10)
    _save(fig, path, plt)


def splitk(meta, rows, path, plt):
    sel = [r for r in rows if r.get("sweep") == "splitk" and r.get("num_partitions")]
    if not sel:  # files without a split-K sweep: their single-sequence rows
        sel = [r for r in rows if r["batch"] == 1 and r.get("num_partitions")]
    if not sel:
        return "no split-K rows (sweep 'splitk', or batch 1 with num_partitions)"
    groups = {}
    for r in sel:
        groups.setdefault((_who(r), _shape(r)), []).append(r)
    color = _styles({k[0] for k in groups})
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for (who, shape), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: (r["num_partitions"], r.get("num_partitions_requested")
                                       is None))
        forced = [r for r in rs if r.get("num_partitions_requested") is not None] or rs
        x = [r["num_partitions"] for r in forced]
        y = [r["us"] for r in forced]
        err = [[max(0.0, r["us"] - (r.get("us_p10") or r["us"])) for r in forced],
               [max(0.0, (r.get("us_p90") or r["us"]) - r["us"]) for r in forced]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, color=color[who],
                    label=f"{who} {shape}")
        for r in rs:
            if r.get("num_partitions_requested") is None:
                ax.scatter([r["num_partitions"]], [r["us"]], marker="*", s=180,
                           color=color[who], edgecolor="k", zorder=4,
                           label=f"{who}: its own choice, P={r['num_partitions']}")
    _log_log(ax, "split-K factor (num_partitions)", "GPU time per call (us, median; bars p10-p90)",
             xbase=2)
    ax.legend(fontsize=7)
    ax.set_title(f"Split-K on a long single sequence\n{_stamp(meta)}", fontsize=10)
    _save(fig, path, plt)


def _overhead(r):
    """(us, how it was derived) of a row's host cost beyond the GPU time, or (None, None).
    ``host_us - us`` only for files from before ``overhead_us`` existed: a row that has the
    key but no value (the simulator) has no overhead to show."""
    if "overhead_us" in r:
        if r["overhead_us"] is None:
            return None, None
        return r["overhead_us"], "host_sync_us - us_warm"
    if r.get("host_us") is not None:
        return r["host_us"] - r["us"], "host_us - us"
    return None, None


def host_overhead(meta, rows, path, plt):
    sel = [r for r in rows if _overhead(r)[0] is not None
           and r.get("num_partitions_requested") is None]
    if not sel:
        return "no rows with a host overhead (overhead_us, or host_us in older files)"
    # One call's host cost does not depend on the shape, and on a long kernel the run-to-run
    # spread of two medians swamps it: the default sweep's rows, where a run has them.
    default = [r for r in sel if r.get("sweep") == "default"]
    sel = default or sel
    sel.sort(key=lambda r: (_who(r), r["heads"], r["batch"], r["seqlen"]))
    color = _styles({_who(r) for r in sel})
    vals = [_overhead(r)[0] for r in sel]
    how = sorted({_overhead(r)[1] for r in sel})
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.28 * len(sel)))
    y = list(range(len(sel)))
    # Drawn at their own sign: a negative difference is noise and must look like it.
    ax.barh(y, vals, color=[color[_who(r)] for r in sel])
    ax.axvline(0, color="k", lw=0.8)
    for i, (r, v) in enumerate(zip(sel, vals)):
        gpu = r.get("us_warm") or r["us"]
        shown = f"{v:.0f} us" if v >= 0.5 else ("0 us" if v > -0.5 else f"{v:.0f} us, noise")
        ax.text(max(v, 0), i, f" {shown} (GPU {gpu:.0f} us)", va="center", fontsize=7)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{_who(r)}  {_shape(r)}" for r in sel], fontsize=7)
    ax.invert_yaxis()
    if min(vals) > 0 and max(vals) / min(vals) > 50:  # all positive over a wide range: log
        ax.set_xscale("log")
    else:
        ax.set_xlim(min(0.0, min(vals)) * 1.1, max(max(vals), 1.0) * 1.6)  # room for labels
    note = "\nbelow 0: within the spread of the two medians, not a cost" if min(vals) < 0 else ""
    ax.set_xlabel(f"host overhead per call, us ({' / '.join(how)}){note}")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.set_title(f"Python call cost beyond the GPU time\n{_stamp(meta)}", fontsize=10)
    _save(fig, path, plt)


def host_paths(meta, rows, path, plt):
    """``scripts/host_overhead.py``'s rows: per path, one call + synchronize and enqueue only
    (log scale: from a few microseconds to milliseconds)."""
    sel = [r for r in rows if r.get("call_sync_us") and r.get("enqueue_us")]
    if not sel:
        return "no rows with call_sync_us and enqueue_us"
    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.55 * len(sel)))
    y = list(range(len(sel)))
    h = 0.38
    ax.barh([i - h / 2 for i in y], [r["call_sync_us"] for r in sel], h,
            label="call + synchronize")
    ax.barh([i + h / 2 for i in y], [r["enqueue_us"] for r in sel], h, label="enqueue only")
    for i, r in enumerate(sel):
        ax.text(r["call_sync_us"], i - h / 2, f" {r['call_sync_us']:.1f}", va="center",
                fontsize=7)
        ax.text(r["enqueue_us"], i + h / 2, f" {r['enqueue_us']:.1f}", va="center", fontsize=7)
    ax.set_yticks(y)
    ax.set_yticklabels([r["path"] for r in sel], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    lo = min(min(r["enqueue_us"], r["call_sync_us"]) for r in sel)
    hi = max(r["call_sync_us"] for r in sel)
    ax.set_xlim(lo / 2, hi * 4)  # room for the labels
    _log_ticks(ax.xaxis, lo / 2, hi * 4)
    shape = meta.get("shape", {})
    what = (f"{shape.get('batch', '?')}x{shape.get('heads', '?')}x{shape.get('seqlen', '?')}, "
            f"median of {meta.get('calls', '?')} calls")
    ax.set_xlabel(f"host wall time per call, us ({what})")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"What one Python call costs, path by path\n{_stamp(meta)}", fontsize=10)
    _save(fig, path, plt)


def headline_markdown(meta, rows):
    """A Markdown table of the default sweep's shapes (or every shape with the library's own
    split-K choice), one column per provider: median us, then TFLOP/s (H >= 64) or GB/s."""
    sel = [r for r in rows if r.get("num_partitions_requested") is None]
    sel = [r for r in sel if r.get("sweep", "default") == "default"] or sel
    if not sel:
        return None
    who = sorted({_who(r) for r in sel}, key=lambda w: (not w.startswith("numba_mla"), w))
    shapes = []
    for r in sel:
        key = (r["batch"], r["heads"], r["seqlen"], r.get("sq", 1))
        if key not in shapes:
            shapes.append(key)
    cell = {(_who(r), (r["batch"], r["heads"], r["seqlen"], r.get("sq", 1))): r for r in sel}
    lines = [f"{_stamp(meta)}; median GPU microseconds (TFLOP/s for H >= 64, else GB/s); "
             "rel. error vs float64 in brackets", "",
             "| B x H x L | " + " | ".join(who) + " |",
             "| --- |" + " --- |" * len(who)]
    for B, H, L, sq in shapes:
        cells = []
        for w in who:
            r = cell.get((w, (B, H, L, sq)))
            if r is None:
                cells.append("-")
                continue
            rate = f"{r['tflops']:.1f} TFLOP/s" if H >= 64 else f"{r['gbps']:.0f} GB/s"
            err = f" [{r['rel_err']:.1e}]" if r.get("rel_err") is not None else ""
            cells.append(f"{r['us']:.0f} ({rate}){err}")
        shape = f"{B} x {H} x {L}" + (f" Sq={sq}" if sq != 1 else "")
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _timed_cell(r, who, flash, speedup=False, rate=False):
    """A table cell: "-" without a row, else its median us (and GB/s with ``rate``) and, for
    numba_mla's rows where the run has FlashMLA, in brackets the time over FlashMLA's (or with
    ``speedup`` FlashMLA's over the row's)."""
    if r is None:
        return "-"
    text = f"{r['us']:.1f}" + (f" ({r['gbps']:.0f} GB/s)" if rate else "")
    if flash is not None and who.startswith("numba_mla"):
        text += f" [{flash['us'] / r['us'] if speedup else r['us'] / flash['us']:.2f}x]"
    return text


def varlen_markdown(meta, rows):
    """A Markdown table of the varlen sweep: per shape and spread, each provider's median us
    and, beside numba_mla's rows, their time over FlashMLA's when the run has FlashMLA."""
    sel = [r for r in rows if r.get("sweep") == "varlen" and r.get("spread") is not None]
    if not sel:
        return None
    who = sorted({_who(r) for r in sel}, key=lambda w: (not w.startswith("numba_mla"), w))
    keys = []
    for r in sel:
        key = (_shape(r), r["spread"])
        if key not in keys:
            keys.append(key)
    cell = {(_who(r), _shape(r), r["spread"]): r for r in sel}
    lines = [f"{_stamp(meta)}; median GPU microseconds; lengths uniform in [L(1-s), L(1+s)] "
             "(the drawn range in its column); in brackets, numba_mla's time over FlashMLA's "
             "where the run has FlashMLA", "",
             "| B x H x L | s | lengths | " + " | ".join(who) + " |",
             "| --- | --- | --- |" + " --- |" * len(who)]
    for shape, spread in keys:
        rs = [cell.get((w, shape, spread)) for w in who]
        any_row = next(r for r in rs if r is not None)
        flash = cell.get(("flash_mla", shape, spread))
        cells = [_timed_cell(r, w, flash) for w, r in zip(who, rs)]
        span = f"{any_row.get('length_min', '?')}..{any_row.get('length_max', '?')}"
        lines.append(f"| {shape} | {spread:g} | {span} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def fp8_markdown(meta, rows):
    """A Markdown table of the fp8 sweep: per shape, each provider's median us with the cache
    in bf16 and in each FP8 layout, and in brackets FlashMLA's bf16 time over that row's (the
    speed-up over FlashMLA) where the run has FlashMLA."""
    sel = [r for r in rows if r.get("sweep") == "fp8"]
    if not sel:
        return None
    cols = []
    for r in sorted(sel, key=lambda r: (not _who(r).startswith("numba_mla"), _who(r))):
        col = (_who(r), r.get("kv", "same"))
        if col not in cols:
            cols.append(col)
    shapes = []
    for r in sel:
        if _shape(r) not in shapes:
            shapes.append(_shape(r))
    cell = {(_who(r), r.get("kv", "same"), _shape(r)): r for r in sel}
    name = lambda w, kv: f"{w} {'(q dtype)' if kv == 'same' else kv}"  # noqa: E731
    lines = [f"{_stamp(meta)}; median GPU microseconds and GB/s (the bytes that must move: "
             "cache rows at 576 a token in e4m3, 656 in v32, 1152 in bf16, plus q and out); in "
             "brackets, FlashMLA's bf16 time over the row's (above 1: faster than FlashMLA)", "",
             "| B x H x L | " + " | ".join(name(w, kv) for w, kv in cols) + " |",
             "| --- |" + " --- |" * len(cols)]
    for shape in shapes:
        flash = cell.get(("flash_mla", "same", shape))
        cells = [_timed_cell(cell.get((w, kv, shape)), w, flash, speedup=True, rate=True)
                 for w, kv in cols]
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


PLOTTERS = {"latency_vs_length": latency_vs_length, "roofline": roofline, "splitk": splitk,
            "latency_vs_spread": latency_vs_spread, "host_overhead": host_overhead}


def main(json_path=None, out_dir="plots", log=print):
    """Render every figure it has rows for; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    json_path = json_path or default_json()
    if json_path is None:
        raise FileNotFoundError("no bench JSON given and no plots/bench_*.json found; run "
                                "`numba-mla bench` first or pass --json")
    meta, rows = load(json_path)
    os.makedirs(out_dir, exist_ok=True)
    if rows and all("path" in r for r in rows):  # scripts/host_overhead.py's file
        path = os.path.join(out_dir, "host_paths.png")
        why = host_paths(meta, rows, path, plt)
        log(f"numba-mla plot: skipped host_paths: {why}" if why
            else f"numba-mla plot: wrote {path}")
        return [] if why else [path]
    written = []
    # The varlen and fp8 sweeps' rows have tables (varlen also a figure) of their own; the
    # other figures and the headline table leave them out (plotting such a run into plots/
    # then replaces nothing else there).
    base = [r for r in rows if r.get("sweep") not in ("varlen", "fp8")]
    for name in FIGURES:
        path = os.path.join(out_dir, f"{name}.png")
        if name != "latency_vs_spread" and not base:
            log(f"numba-mla plot: skipped {name}: the file has only rows of the varlen or fp8 sweeps")
            continue
        why = PLOTTERS[name](meta, rows if name == "latency_vs_spread" else base, path, plt)
        if why:
            log(f"numba-mla plot: skipped {name}: {why}")
        else:
            written.append(path)
            log(f"numba-mla plot: wrote {path}")
    for name, table, what in (
            ("headline.md", headline_markdown(meta, base),
             "the README's table of headline figures"),
            ("varlen.md", varlen_markdown(meta, rows), "the varlen sweep's table"),
            ("fp8.md", fp8_markdown(meta, rows), "the fp8 sweep's table")):
        if table:
            path = os.path.join(out_dir, name)
            with open(path, "w") as f:
                f.write(table)
            log(f"numba-mla plot: wrote {path} ({what})")
    return written
