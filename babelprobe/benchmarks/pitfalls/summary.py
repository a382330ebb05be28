"""The Cross-Lingual Pitfalls metrics, from the rows alone: accuracy in English and in the target language,
the drop between them and `en_only`, the paper's cross-lingual weakness (`pitfalls_summary`, `summarize`),
the simulation score V (§2.3) and the Relative Affinity Score (§3.3); the wide view and the printed
summary."""

from __future__ import annotations

import numpy as np
import pandas as pd

from babelprobe.benchmarks.base import metric_row
from babelprobe.benchmarks.base import wide as wide_table
from babelprobe.benchmarks.pitfalls.data import COUNTS
from babelprobe.benchmarks.pitfalls.settings import C_AFFINITY_DEFAULT
from babelprobe.errors import BabelprobeError
from babelprobe.stats import paired_bootstrap, wilson

BOOTSTRAP = 2000
C_AFFINITY = C_AFFINITY_DEFAULT  # c of the Relative Affinity Score (App. B.1: −1)


def simulation_score(en_accuracy, target_accuracy, gamma: float = 2.0):
    """The paper's simulation score V = (mean English accuracy over the simulation models)^γ − (mean
    target accuracy), γ = 2 (§2.3, Eq. 8): high only when English is (nearly) always right and the target
    language wrong; γ > 1 punishes English mistakes more than the target accuracy rewards.

    The released code (run.py `evaluate_function`) ranks by log(1 + (β^E)² / ((β^T)² + 0.001)) −
    20·(1 − β^E)³ instead; it keeps only children with β^E = 1, where both order candidates alike. The
    `value` field of the released <Language>.json records is that quantity (3.2 for β^T = 0.2), not V."""
    return np.asarray(en_accuracy, float) ** gamma - np.asarray(target_accuracy, float)


def question_scores(rows: pd.DataFrame, gamma: float = 2.0) -> pd.DataFrame:
    """Per question × version: β^E and β^T, the mean correctness over the models in `rows` (the
    `score_pitfalls` tables of several models, concatenated; told apart by `model`), and V."""
    wide_rows = pd.concat([paired(part).assign(model=name) for name, part in rows.groupby("model", sort=False)])
    keys = ["target", "target_name", "pair_id", "subset", "version"]
    out = wide_rows.groupby(keys, sort=False).agg(models=("model", "nunique"), en_accuracy=("en_correct", "mean"),
                                                  target_accuracy=("target_correct", "mean")).reset_index()
    out["value"] = simulation_score(out["en_accuracy"], out["target_accuracy"], gamma)
    return out


def paired(rows: pd.DataFrame) -> pd.DataFrame:
    """English and target correctness side by side: one row per question × version."""
    wide_rows = rows.pivot_table(index=["target", "target_name", "pair_id", "subset", "version"], columns="side",
                                 values="correct", aggfunc="first")
    wide_rows = wide_rows.rename(columns={"en": "en_correct", "target": "target_correct"}).reset_index()
    wide_rows.columns.name = None
    if "question" in rows.columns:  # the English question text: released sets repeat originals
        english = rows[rows["side"] == "en"].set_index(["pair_id", "version"])["question"]
        wide_rows["question"] = [english.get((p, v)) for p, v in zip(wide_rows["pair_id"], wide_rows["version"],
                                                                     strict=True)]
    missing = wide_rows.reindex(columns=["en_correct", "target_correct"]).isna().any(axis=1)
    if missing.any():
        raise BabelprobeError(f"question {wide_rows.loc[missing, 'pair_id'].iloc[0]} lacks its English or target row")
    return wide_rows.astype({"en_correct": bool, "target_correct": bool})


def pitfalls_summary(rows: pd.DataFrame, by_category: bool = True, seed: int = 0) -> pd.DataFrame:
    """Per target language × version (× category, and 'all'): n questions (n_unique distinct English
    texts: the released sets hold several perturbations of one original), English and target accuracy
    (Wilson 95%), drop = English − target (paired bootstrap 95%) and en_only = right in English, wrong
    in the target language."""
    wide_rows = paired(rows)
    groups = [("all", wide_rows)]
    if by_category:
        groups += [(category, part) for category, part in wide_rows.groupby("subset", sort=True)]
    out = []
    rng = np.random.default_rng(seed)
    for category, part in groups:
        for (target, name, version), g in part.groupby(["target", "target_name", "version"], sort=False):
            en, tg = g["en_correct"].to_numpy(), g["target_correct"].to_numpy()
            row = {"target": target, "target_name": name, "version": version, "subset": category, "n": len(g),
                   "n_unique": g["question"].nunique() if "question" in g else np.nan}
            for side, values in (("en", en), ("target", tg)):
                low, high = wilson(values.sum(), len(values))
                row.update({f"{side}_accuracy": values.mean(), f"{side}_ci_low": low, f"{side}_ci_high": high})
            row["drop"] = en.mean() - tg.mean()
            row["drop_ci_low"], row["drop_ci_high"] = paired_bootstrap(en.astype(float) - tg.astype(float), rng, BOOTSTRAP)
            row["en_only"] = float(np.mean(en & ~tg))
            out.append(row)
    return pd.DataFrame(out)


# ---------------------------------------------------------------------------- Relative Affinity Score

def affinity_accuracy(rows: pd.DataFrame) -> pd.DataFrame:
    """A[x, y]: accuracy on language x (`language`, the rows) of the expanded pairs from seed language y
    (`seed_language`, the columns), computed per `model` and averaged over the models (§3.3, App. B.2:
    "the average accuracy of these models"). English rows are left out."""
    for column in ("seed_language", "language", "correct"):
        if column not in rows.columns:
            raise BabelprobeError(f"affinity rows need a {column!r} column (evaluation rows of expanded pairs)")
    rows = rows[rows["language"] != "en"]
    models = rows["model"] if "model" in rows.columns else pd.Series("model", index=rows.index)
    per_model = [part.pivot_table(index="language", columns="seed_language", values="correct", aggfunc="mean")
                 for _, part in rows.assign(model=models).groupby("model", sort=False)]
    accuracy = sum(per_model) / len(per_model)
    accuracy.index.name, accuracy.columns.name = "language", "seed_language"
    return accuracy


def relative_affinity(accuracy: pd.DataFrame, c: float = C_AFFINITY) -> pd.DataFrame:
    """The Relative Affinity Score of §3.3, D[x, y] = ((A[x, y] − Ā_x) / Ā_x) · exp(c · |Ā_y − Ā_x|), with
    A[x, y] the accuracy on language x of the expanded pairs from seed language y (rows x, columns y, as
    `affinity_accuracy` returns it), Ā_x the mean of row x over every seed language (its own included)
    and c = −1 (App. B.1). Lower values mean stronger affinity: y's weaknesses persist in x. Same index
    and columns as `accuracy`; NaN where a cell or a mean is missing."""
    languages = list(accuracy.index)
    if sorted(accuracy.columns) != sorted(languages):
        raise BabelprobeError(f"the affinity accuracy matrix must have the same languages as rows (evaluation) and "
                              f"columns (seed): rows {languages}, columns {list(accuracy.columns)}")
    a = accuracy[languages].to_numpy(float)
    mean = np.nanmean(a, axis=1)  # Ā_x
    with np.errstate(divide="ignore", invalid="ignore"):
        d = (a - mean[:, None]) / mean[:, None] * np.exp(c * np.abs(mean[None, :] - mean[:, None]))
    return pd.DataFrame(d, index=accuracy.index, columns=languages)


# --------------------------------------------------------------------------------------------- summary

CELL = ["target", "target_name", "version", "subset"]
METRICS = {"en_accuracy": ("en", "wilson"), "target_accuracy": ("target", "wilson"),
           "drop": ("drop", "paired bootstrap over questions"), "en_only": (None, "")}


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """The benchmark contract's long summary: per target language × version × category (and `all`),
    `metric` en_accuracy, target_accuracy, drop (English − target) and en_only, with `value`, `ci_low`,
    `ci_high`, `n` (questions) and `n_unique` (distinct English texts); per target language (version
    `file`) the records read, normalised and skipped when loading. Every row names the `method` and
    `protocol` that answered."""
    out = []
    for cell in pitfalls_summary(rows).to_dict("records"):
        where = {k: cell[k] for k in CELL}
        for metric, (prefix, interval) in METRICS.items():
            low, high = (cell[f"{prefix}_ci_low"], cell[f"{prefix}_ci_high"]) if prefix else (np.nan, np.nan)
            out.append(metric_row(where, metric, cell[metric], low, high, cell["n"], interval,
                                  n_unique=cell["n_unique"]))
    if set(COUNTS) <= set(rows.columns):
        for (target, name), part in rows.groupby(["target", "target_name"], sort=False):
            where = {"target": target, "target_name": name, "version": "file", "subset": "all"}
            for metric in COUNTS:
                out.append(metric_row(where, metric, part[metric].iloc[0], n=part["records_read"].iloc[0],
                                      n_unique=np.nan))
    summary = pd.DataFrame(out)
    for column in ("method", "protocol"):
        summary[column] = ",".join(map(str, rows[column].unique())) if column in rows.columns else ""
    return summary


def wide(summary: pd.DataFrame) -> pd.DataFrame:
    """The long summary's accuracy cells as one row per cell (`base.wide`: `en_accuracy`,
    `en_accuracy_low`, `en_accuracy_high`, ..., with the cell's `n` and `n_unique`), for figures and printing."""
    return wide_table(summary[summary["metric"].isin(list(METRICS))], CELL, carry=("n", "n_unique"))


def load_counts(summary: pd.DataFrame) -> pd.DataFrame:
    """Per target language: records read, normalised and skipped when loading (empty if not recorded)."""
    counts = summary[summary["metric"].isin(COUNTS)]
    if counts.empty:
        return pd.DataFrame(columns=["language", *COUNTS])
    table = counts.pivot_table(index="target_name", columns="metric", values="value", aggfunc="first", sort=False)
    return table.reindex(columns=list(COUNTS)).astype(int).rename_axis("language").reset_index()


def format_summary(summary: pd.DataFrame) -> str:
    """The overall rows as printed by the CLI: value [95% interval], then the records per language."""
    method = summary["method"].iloc[0] if "method" in summary and len(summary) else ""
    cells = wide(summary)
    table = cells[cells["subset"] == "all"]

    def interval(metric: str) -> list[str]:
        return [f"{v:.3f} [{lo:.3f}, {hi:.3f}]" for v, lo, hi in
                zip(table[metric], table[f"{metric}_low"], table[f"{metric}_high"], strict=True)]

    text = pd.DataFrame({"language": table["target_name"], "version": table["version"], "n": table["n"],
                         "distinct": table["n_unique"], "English": interval("en_accuracy"),
                         "target": interval("target_accuracy"), "drop": interval("drop"),
                         "en_only": table["en_only"].map(lambda v: f"{v:.3f}")})
    lines = ([f"answered by: {method}"] if method else []) + [text.to_string(index=False)]
    counts = load_counts(summary)
    if len(counts):
        counts.columns = ["language", "records read", "quotes normalised", "skipped (cannot be scored)"]
        lines += ["", counts.to_string(index=False)]
    return "\n".join(lines)
