"""Summaries computed from per-pair result tables: accuracy per group with a 95% Wilson interval.

Summaries are always derived from the long per-pair tables (DESIGN.md), never stored instead of them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

Z95 = 1.959963984540054


def wilson(successes: np.ndarray, n: np.ndarray, z: float = Z95) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval for a binomial proportion (better than the normal one near 0 and 1)."""
    successes, n = np.asarray(successes, float), np.asarray(n, float)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def accuracy_table(results: pd.DataFrame, by: tuple[str, ...] = ("language", "subset", "method")) -> pd.DataFrame:
    """Long table: one row per group with `n`, `accuracy`, `ci_low`, `ci_high` (95% Wilson)."""
    by = [c for c in by if c in results.columns]
    table = results.groupby(by, sort=True)["correct"].agg(n="size", k="sum").reset_index()
    table["accuracy"] = table["k"] / table["n"]
    table["ci_low"], table["ci_high"] = wilson(table["k"], table["n"])
    return table.drop(columns="k")


def accuracy_pivot(results: pd.DataFrame, rows: str = "language", cols: str = "subset") -> pd.DataFrame:
    """Accuracy with `rows` down and `cols` across, plus an `all` column and an `all` row."""
    pivot = results.pivot_table(index=rows, columns=cols, values="correct", aggfunc="mean")
    pivot["all"] = results.groupby(rows)["correct"].mean()
    overall = results.groupby(cols)["correct"].mean()
    overall["all"] = results["correct"].mean()
    pivot.loc["all"] = overall
    pivot.columns.name = None
    return pivot


def format_pivot(pivot: pd.DataFrame, title: str) -> str:
    return f"{title}\n{pivot.to_string(float_format=lambda v: f'{v:.3f}')}"
