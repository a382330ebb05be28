"""One figure style for every babelprobe plot: colour-blind-safe palette, paper sizes, PDF + PNG export.

Use `figure(width="one"|"two", height=...)` to get a figure sized for a one- or two-column paper,
`PALETTE` (Okabe–Ito) for categorical colours, `SEQUENTIAL`/`DIVERGING` colormap names for heatmaps,
and `save(fig, path)` to write `path.pdf` (vector) and `path.png` (300 dpi) atomically.
`TYPOLOGY_COLORS` and `METHOD_COLORS` keep one colour per typology class and per method across all
figures; `annotate_cells` writes values into heatmap cells, legible on dark and light colours; `note` writes a grey
note into an axes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib
import numpy as np

if "ipykernel" not in sys.modules:  # figures are files; a notebook keeps its inline backend to show them
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from babelprobe.tables import atomic_path  # noqa: E402

# Okabe & Ito (2008), distinguishable under the common colour-vision deficiencies.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
SEQUENTIAL = "viridis"
DIVERGING = "RdBu_r"
WIDTHS = {"one": 3.35, "two": 7.0}
TYPOLOGY_COLORS = {"analytic": PALETTE[0], "inflectional": PALETTE[1], "agglutinative": PALETTE[2], "other": "#777777"}
METHOD_COLORS = {"meta": PALETTE[3], "direct": PALETTE[5], "neuro": PALETTE[4]}
LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P", "X"]  # inches: ACL/NeurIPS-style single and double column

RC = {
    "font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8, "legend.fontsize": 7, "xtick.labelsize": 7,
    "ytick.labelsize": 7, "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.alpha": 0.3, "grid.linewidth": 0.5, "lines.linewidth": 1.2, "savefig.bbox": "tight",
    "savefig.pad_inches": 0.02, "pdf.fonttype": 42, "ps.fonttype": 42,
    "axes.prop_cycle": matplotlib.cycler(color=PALETTE),
}


def figure(width: str = "one", height: float | None = None, **subplots):
    """A figure sized for a one- or two-column paper, in babelprobe's style; returns (fig, axes)."""
    plt.rcParams.update(RC)
    w = WIDTHS[width]
    return plt.subplots(figsize=(w, height or w * 0.72), layout="constrained", **subplots)


def save(fig, path: str | Path) -> list[Path]:
    """Write `path` as .pdf (vector) and .png (300 dpi); each file appears only when complete."""
    path = Path(path)
    written = []
    for suffix, options in ((".pdf", {}), (".png", {"dpi": 300})):
        target = path.with_suffix(suffix)
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format=suffix[1:], **options)
        written.append(target)
    plt.close(fig)
    return written


def note(ax, text: str, y: float = 0.5, va: str = "center") -> None:
    """A grey note across the middle of `ax` (where the data leave nothing to draw, or say why they look as they do)."""
    ax.text(0.5, y, text, ha="center", va=va, transform=ax.transAxes, fontsize=7, color="0.35")


def annotate_cells(ax, image, values, fmt: str = "{:.2f}", fontsize: float = 6) -> None:
    """Write each value of the 2-D array `values` into its cell of the heatmap `image` (from `imshow`),
    in black on light cells and white on dark ones; NaN cells stay empty."""
    values = np.asarray(values, dtype=float)
    for (i, j), value in np.ndenumerate(values):
        if np.isnan(value):
            continue
        ax.text(j, i, fmt.format(value), ha="center", va="center", fontsize=fontsize,
                color=text_colour(image, value))


def text_colour(image, value: float) -> str:
    """White on a dark cell of the heatmap `image` (from `imshow`), black on a light one."""
    r, g, b, _ = image.cmap(image.norm(value))
    return "white" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5 else "black"  # relative luminance
