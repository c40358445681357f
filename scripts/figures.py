"""Draw the explanatory figures of docs/ (matplotlib, no GPU, no numba_mla import).

    python scripts/figures.py [--out-dir docs/figures]

Four PNGs, each referenced from the docs with a caption naming this script:

- ``cache_row.png``: one cache row per token, 576 = 512 latent + 64 rope; K is the whole row,
  V its first 512 dims; every query head reads the same rows.
- ``splitk.png``: a sequence's keys cut into partitions, each giving a partial (out, lse), and
  their log-sum-exp merge.
- ``tile_pipeline.png``: a partition kernel's loop over key tiles: the copy of tile t+1 into
  the second shared-memory buffer runs while tile t is used (S = Q K^T, softmax, O += P V).
- ``wgmma_fragment.png``: which thread of a warpgroup holds which (row, col) of a wgmma
  m64nNk16 fp32 accumulator (the PTX ISA's layout, as numba_mla's ptx module encodes it).

The figures are drawings, not measurements: nothing here is timed.
"""
import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

DPI = 100
LATENT, ROPE = 512, 64  # a cache row: 512 latent dims (c_kv) + 64 rope dims (k_pe)
C_LATENT, C_ROPE, C_Q = "#4C72B0", "#DD8452", "#55A868"
C_COPY, C_S, C_SOFT, C_PV = "#8172B3", "#4C72B0", "#C44E52", "#55A868"


def acc_row(i, t):
    """Row of element ``i`` of thread ``t``'s fp32 accumulator fragment (m64nNk16): warp
    t // 32 owns rows 16w..16w+15; a lane's elements alternate between row lane//4 and 8 below."""
    return 16 * (t // 32) + (t % 32) // 4 + 8 * ((i // 2) % 2)


def acc_col(i, t):
    """Column of element ``i`` of thread ``t``: pairs of adjacent columns, 8 columns apart."""
    return 8 * (i // 4) + 2 * (t % 4) + i % 2


def _box(ax, x, y, w, h, color, text=None, fontsize=9):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="black", lw=0.8))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize,
                color="white" if color not in ("white", "#eeeeee") else "black")


def _arrow(ax, xy0, xy1, text=None, color="black"):
    ax.add_patch(FancyArrowPatch(xy0, xy1, arrowstyle="-|>", mutation_scale=12, color=color,
                                 lw=1.0))
    if text:
        ax.text((xy0[0] + xy1[0]) / 2 + 4, (xy0[1] + xy1[1]) / 2, text, fontsize=8,
                va="center")


def _save(fig, path):
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def _finish(fig, ax, path, title, xlim, ylim):
    """A diagram's last steps: its drawing area, no axes, its title; saved and closed."""
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
    ax.set_title(title)
    _save(fig, path)


def cache_row(path):
    """The MLA cache: rows of 576, K = the row, V = its first 512 dims."""
    fig, ax = plt.subplots(figsize=(9, 4.2))
    scale = 1.0 / 64  # drawing units per dim
    x0 = 1.0
    rows = 5
    for r in range(rows):
        y = 3.6 - 0.45 * r
        _box(ax, x0, y, LATENT * scale, 0.36, C_LATENT, "latent c_kv (512)" if r == 0 else None)
        _box(ax, x0 + LATENT * scale, y, ROPE * scale, 0.36, C_ROPE, "rope" if r == 0 else None)
        ax.text(x0 - 0.1, y + 0.18, f"token {r}", ha="right", va="center", fontsize=8)
    top = 3.6 + 0.36
    ax.annotate("", xy=(x0, top + 0.25), xytext=(x0 + (LATENT + ROPE) * scale, top + 0.25),
                arrowprops=dict(arrowstyle="<->"))
    ax.text(x0 + (LATENT + ROPE) * scale / 2, top + 0.38, "K = the whole row: 576 dims",
            ha="center", fontsize=9)
    bottom = 3.6 - 0.45 * (rows - 1)
    ax.annotate("", xy=(x0, bottom - 0.2), xytext=(x0 + LATENT * scale, bottom - 0.2),
                arrowprops=dict(arrowstyle="<->"))
    ax.text(x0 + LATENT * scale / 2, bottom - 0.38, "V = K[:, :512]: the same bytes, read once",
            ha="center", fontsize=9)
    # The queries: H heads, each 576 wide, all against the same rows.
    qx = x0 + (LATENT + ROPE) * scale + 1.0
    for h in range(3):
        y = 3.3 - 0.45 * h
        _box(ax, qx, y, LATENT * scale * 0.35, 0.36, C_Q, None)
        _box(ax, qx + LATENT * scale * 0.35, y, ROPE * scale * 0.35, 0.36, C_ROPE, None)
        ax.text(qx + 0.1 + (LATENT + ROPE) * scale * 0.35, y + 0.18, f"q head {h}",
                va="center", fontsize=8)
    ax.text(qx + 1.2, 3.3 - 0.45 * 3 + 0.18, "...  (H heads)", va="center", fontsize=8)
    ax.text(qx, 3.3 + 0.55, "q: W_UK absorbed (512) | rope (64)", fontsize=9)
    ax.text(qx, 1.25, "every head: scores over all 576 dims,\n"
                      "output over the 512 latent dims\n(W_UV applied after the kernel)",
            fontsize=8)
    _finish(fig, ax, path, "An MLA cache row per token, shared by all heads",
            xlim=(0, qx + 3.2), ylim=(1.0, 4.5))


def splitk(path):
    """Split-K: partitions of the keys, each a partial (out, lse); merged by log-sum-exp."""
    fig, ax = plt.subplots(figsize=(9, 4.2))
    P, L = 4, 10.0
    colors = ["#4C72B0", "#55A868", "#C44E52", "#8172B3"]
    y = 3.4
    ax.text(0, y + 0.55, "one sequence's keys [0, L), cut into P = 4 partitions (one block each)",
            fontsize=9)
    for p in range(P):
        _box(ax, p * L / P, y, L / P, 0.4, colors[p], f"keys of partition {p}")
    for p in range(P):
        cx = p * L / P + L / P / 2
        _arrow(ax, (cx, y - 0.05), (cx, 2.45))
        _box(ax, p * L / P + 0.2, 1.85, L / P - 0.4, 0.55, "#eeeeee",
             f"out_{p} (normalised)\nlse_{p}")
        _arrow(ax, (cx, 1.8), (L / 2, 0.95), color="gray")
    ax.text(L / 2, 2.95, "stage 1: each block runs the online softmax over its own keys",
            ha="center", fontsize=9, bbox=dict(facecolor="white", edgecolor="none"))
    _box(ax, L / 2 - 3.2, 0.25, 6.4, 0.65, "white")
    ax.text(L / 2, 0.57, r"stage 2 (combine): $M = \max_p lse_p$,  $w_p = e^{lse_p - M}$,"
                         "\n"
                         r"$out = \sum_p w_p\, out_p / \sum_p w_p$,   "
                         r"$lse = M + \log \sum_p w_p$",
            ha="center", va="center", fontsize=9)
    _finish(fig, ax, path, "Flash-decoding (split-K) and the log-sum-exp merge",
            xlim=(-0.3, L + 0.3), ylim=(0.1, 4.1))


def tile_pipeline(path):
    """Two shared-memory buffers: tile t+1 is copied while tile t is used."""
    fig, ax = plt.subplots(figsize=(11, 3.6))
    n = 4
    w_copy, w_s, w_soft, w_pv = 3.0, 1.6, 1.1, 1.6
    w_tile = w_s + w_soft + w_pv
    # Copy row: tile 0 alone (the prologue), then tile t+1 during tile t's compute.
    _box(ax, 0, 1.6, w_copy, 0.5, C_COPY, "tile 0 -> buf 0")
    start = w_copy
    for t in range(n):
        x = start + t * w_tile
        _box(ax, x, 0.6, w_s, 0.5, C_S, "S=QK^T", fontsize=7.5)
        _box(ax, x + w_s, 0.6, w_soft, 0.5, C_SOFT, "softmax", fontsize=7)
        _box(ax, x + w_s + w_soft, 0.6, w_pv, 0.5, C_PV, "O+=PV", fontsize=7.5)
        ax.text(x + w_tile / 2, 0.5, f"tile {t} (in buf {t % 2})", ha="center", va="top",
                fontsize=8)
        if t + 1 < n:
            _box(ax, x + 0.05, 1.6, w_tile - 0.1, 0.5, C_COPY,
                 f"tile {t + 1} -> buf {(t + 1) % 2}")
        ax.axvline(x, color="gray", lw=0.6, ls=":")
    ax.axvline(start + n * w_tile, color="gray", lw=0.6, ls=":")
    ax.text(-0.2, 1.85, "copy\n(cp.async / TMA)", ha="right", va="center", fontsize=9)
    ax.text(-0.2, 0.85, "compute\n(the warps)", ha="right", va="center", fontsize=9)
    ax.text(start + n * w_tile / 2, 2.45,
            "at each dotted line a barrier (or an mbarrier wait): tile t+1 has landed, "
            "and tile t's buffer may be overwritten by the copy of tile t+2",
            ha="center", fontsize=8, bbox=dict(facecolor="white", edgecolor="none"))
    _finish(fig, ax, path, "A partition kernel's tile loop: double-buffered copies",
            xlim=(-2.2, start + n * w_tile + 0.2), ylim=(0.0, 2.7))


def wgmma_fragment(path, n=16):
    """Owner (thread, element) of each (row, col) of an m64nNk16 fp32 accumulator."""
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 6.2),
                                   gridspec_kw=dict(width_ratios=[1, 2.2]))
    warp_colors = ["#4C72B0", "#55A868", "#C44E52", "#8172B3"]
    owner = {}
    for t in range(128):
        for i in range(n // 2):
            owner[(acc_row(i, t), acc_col(i, t))] = (t, i)
    assert len(owner) == 64 * n, "the fragment covers every element exactly once"
    # Left: the whole 64 x N tile, coloured by warp.
    for (r, c), (t, _) in owner.items():
        ax0.add_patch(Rectangle((c, r), 1, 1, facecolor=warp_colors[t // 32],
                                edgecolor="white", lw=0.3))
    for w in range(4):
        ax0.text(n + 0.5, 16 * w + 8, f"warp {w}\nrows {16 * w}-{16 * w + 15}", va="center",
                 fontsize=8)
    ax0.set_xlim(0, n + 6)
    ax0.set_ylim(64, 0)
    ax0.set_xticks([0, 8, n])
    ax0.set_yticks([0, 8, 16, 32, 48, 64])
    ax0.set_xlabel("col (N)")
    ax0.set_ylabel("row (M)")
    ax0.set_title(f"D [64 x {n}] fp32, 128 threads", fontsize=10)
    ax0.set_aspect("equal")
    # Right: warp 0's rows, cols 0..15, each cell "lane : element".
    lane_cmap = plt.get_cmap("tab20")
    for r in range(16):
        for c in range(16):
            t, i = owner[(r, c)]
            ax1.add_patch(Rectangle((c, r), 1, 1, facecolor=lane_cmap((t % 4) * 2 + (r >= 8)),
                                    edgecolor="white", lw=0.5))
            ax1.text(c + 0.5, r + 0.5, f"T{t}\n[{i}]", ha="center", va="center", fontsize=5.5)
    ax1.set_xlim(0, 16)
    ax1.set_ylim(16, 0)
    ax1.set_xticks(range(0, 17, 2))
    ax1.set_yticks(range(0, 17, 4))
    ax1.set_xlabel("col")
    ax1.set_ylabel("row")
    ax1.set_title("warp 0, rows 0-15, cols 0-15: thread T holds element [i] of its fragment\n"
                  "row = 16*warp + lane//4 + 8*((i//2)%2),  col = 8*(i//4) + 2*(lane%4) + i%2",
                  fontsize=9)
    ax1.set_aspect("equal")
    fig.suptitle("wgmma m64nNk16: the accumulator fragment (N/2 floats a thread)")
    _save(fig, path)


FIGURES = {
    "cache_row.png": cache_row,
    "splitk.png": splitk,
    "tile_pipeline.png": tile_pipeline,
    "wgmma_fragment.png": wgmma_fragment,
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "..", "docs",
                                                      "figures"))
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    for name, draw in FIGURES.items():
        path = os.path.join(args.out_dir, name)
        draw(path)
        print(path)


if __name__ == "__main__":
    main()
