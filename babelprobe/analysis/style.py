"""One figure style for every babelprobe plot: colour-blind-safe palette, paper sizes, PDF + PNG export.

Use `figure(width="one"|"two", height=...)` to get a figure sized for a one- or two-column paper,
`PALETTE` (Okabe–Ito) for categorical colours, `SEQUENTIAL`/`DIVERGING` colormap names for heatmaps,
and `save(fig, path)` to write `path.pdf` (vector) and `path.png` (300 dpi) atomically.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # figures are files; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

from babelprobe.tables import atomic_path  # noqa: E402

# Okabe & Ito (2008), distinguishable under the common colour-vision deficiencies.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
SEQUENTIAL = "viridis"
DIVERGING = "RdBu_r"
WIDTHS = {"one": 3.35, "two": 7.0}  # inches: ACL/NeurIPS-style single and double column

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
