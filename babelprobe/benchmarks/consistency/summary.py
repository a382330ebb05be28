"""The metrics of the self-consistency benchmark, from its rows alone: whether each answer is correct and
the same as in orig (`with_consistency`), then the benchmark's long summary (`summarize`): accuracy, valid
answers, consistency overall, by orig correctness (Table 5) and among items with BLEU >= 50 (App. D), the
correlations of translation quality with consistency (Table 3), translation quality, degenerate senses
and skipped records. Intervals: Wilson per language, a bootstrap over items where languages are pooled.
`format_summary` prints it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from babelprobe.benchmarks.base import metric_row
from babelprobe.benchmarks.consistency.quality import corpus_translation_quality, input_fields
from babelprobe.benchmarks.consistency.task import PARTS
from babelprobe.stats import proportion

BLEU_HIGH = 50.0  # App. D: "data points with a BLEU score of at least 50"


def with_consistency(rows: pd.DataFrame) -> pd.DataFrame:
    """Add `correct`, `orig_prediction`, `orig_correct` and `consistent` (same answer as in orig; an
    invalid answer, -1, is a label of its own)."""
    rows = rows.assign(correct=rows["prediction"] == rows["label"])
    orig = rows[rows["condition"] == "orig"].set_index("item_id")
    rows["orig_prediction"] = rows["item_id"].map(orig["prediction"])
    rows["orig_correct"] = rows["item_id"].map(orig["correct"]).astype(bool)
    rows["consistent"] = rows["prediction"] == rows["orig_prediction"]
    return rows


def consistency_summary(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Accuracy, valid answers and consistency per language × condition (and pooled over languages),
    consistency split by orig correctness (Table 5) and restricted to BLEU >= 50 (App. D), and the
    correlation of translation quality with consistency (Table 3); a long table."""
    out = []
    for (lang, condition), group in _groups(rows):
        cell = {"language": lang, "condition": condition}
        out.append(metric_row({**cell, "group": "all"}, "accuracy",
                              **proportion(group["item_id"], group["correct"], seed=seed, unit="items")))
        if (group["method"] == "generate").any():
            out.append(metric_row({**cell, "group": "all"}, "valid",
                                  **proportion(group["item_id"], group["prediction"] != -1, seed=seed, unit="items")))
        if condition == "orig":
            continue
        for name, mask in (("all", None), ("orig_correct", group["orig_correct"]),
                           ("orig_incorrect", ~group["orig_correct"])):
            out.append(metric_row({**cell, "group": name}, "consistency",
                                  **proportion(group["item_id"], group["consistent"], mask, seed=seed, unit="items")))
        if "bleu" in group and group["bleu"].notna().any():
            high = group["bleu"] >= BLEU_HIGH
            out.append(metric_row({**cell, "group": f"bleu>={BLEU_HIGH:g}"}, "consistency",
                                  **proportion(group["item_id"], group["consistent"], high, seed=seed, unit="items")))
            out.append(metric_row({**cell, "group": "all"}, f"share_bleu>={BLEU_HIGH:g}",
                                  **proportion(group["item_id"], high, group["bleu"].notna(), seed=seed, unit="items")))
        if lang != "all":  # pooled over languages, a correlation would mostly compare languages
            out += _correlations(lang, condition, group)
    return pd.DataFrame(out)


def _groups(rows: pd.DataFrame):
    for key, group in rows.groupby(["language", "condition"], sort=True):
        yield key, group
    for condition, group in rows.groupby("condition", sort=True):
        if condition not in ("orig", "P", "rerun"):  # those have one language only
            yield ("all", condition), group


def _correlations(lang: str, condition: str, group: pd.DataFrame) -> list[dict]:
    """Pearson r (point-biserial) of per-item translation quality with consistency and correctness."""
    from scipy.stats import pearsonr

    out = []
    if "chrf" not in group or group["chrf"].isna().all():
        return out
    scored = group.dropna(subset=["chrf"])
    for quality in ("chrf", "bleu"):
        for target in ("consistent", "correct"):
            x, y = scored[quality].to_numpy(float), scored[target].to_numpy(float)
            r = p = np.nan
            if len(x) >= 3 and x.std() > 0 and y.std() > 0:
                r, p = (float(v) for v in pearsonr(x, y))
            out.append(metric_row({"language": lang, "condition": condition, "group": "all"},
                                  f"corr_{quality}_{target}", r, n=len(x), p_value=p))
    return out


def sense_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Share of the model's translations/paraphrases that are degenerate (empty, a copy of the source,
    a copy of the prompt's example), per kind, language and scope (instruction parts or input fields).
    Each sense is counted once: the three instruction parts from condition I (translated) and P
    (paraphrased), once per source language; inputs from X and P, one per item and field."""
    senses = []
    for kind, condition in (("translated", "I"), ("paraphrased", "P")):
        part = rows[rows["condition"] == condition].drop_duplicates(["source_language", "language"])
        senses += [(kind, lang, "instruction", st) for p in PARTS
                   for lang, st in zip(part["language"], part[f"instruction_status_{p}"])]
    for kind, condition in (("translated", "X"), ("paraphrased", "P")):
        part = rows[rows["condition"] == condition].drop_duplicates(["item_id", "language"])
        senses += [(kind, lang, "input", st) for f in input_fields(rows) for lang, st in zip(part["language"], part[f"status_{f}"])]
    frame = pd.DataFrame(senses, columns=["kind", "language", "scope", "status"])
    out = []
    for (kind, lang, scope), group in frame.groupby(["kind", "language", "scope"]):
        for status in ("empty", "copy of source", "copy of example"):
            k = int((group["status"] == status).sum())
            out.append(metric_row({"language": lang, "condition": kind, "group": scope},
                                  "sense_" + status.replace(" ", "_"), k / len(group), n=len(group), k=k))
    return pd.DataFrame(out)


def skipped_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """How many records were skipped, per language and reason (rows of condition `skipped`)."""
    skipped = rows[rows["condition"] == "skipped"]
    if skipped.empty:
        return pd.DataFrame()
    reasons = skipped["skip_reason"].str.replace(r"^label .* not among", "label not among", regex=True)
    return (skipped.assign(group=reasons.str.replace(r"^language .* is not", "language is not", regex=True))
            .groupby(["language", "group"]).size().rename("n").reset_index()
            .assign(metric="skipped", condition="skipped", value=lambda t: t["n"].astype(float)))


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """The benchmark contract's long summary, from the rows alone: accuracy, valid answers, consistency
    and the correlations (`consistency_summary`), translation quality, degenerate senses, skipped
    records; every row names the protocol."""
    asked = rows[rows["condition"] != "skipped"].copy()
    for column in ("correct", "orig_correct", "consistent"):  # bool again after a CSV round trip
        asked[column] = asked[column].astype(bool)
    summary = pd.concat([consistency_summary(asked), corpus_translation_quality(asked), sense_summary(asked),
                         skipped_summary(rows)], ignore_index=True)
    if "protocol" in rows.columns and rows["protocol"].notna().any():
        summary["protocol"] = rows["protocol"].dropna().iloc[0]
    return summary


LEGEND = ("conditions: T/I/X = instruction and input / instruction only / input only translated by the model "
          "(Table 1); R = translated instruction, reference input (babelprobe's); M = native instruction of the language, "
          "original input (Table 9, App. F; --mixed); P = paraphrase baseline "
          "(babelprobe's addition); rerun = second sampled run of the source task (Table 5)")


def format_summary(summary: pd.DataFrame) -> str:
    """Accuracy and consistency per condition × language, translation quality, skipped records, as text."""
    def table(metric: str, group: str = "all", digits: int = 3) -> str:
        part = summary[(summary["metric"] == metric) & (summary["group"] == group)]
        if part.empty:
            return "  (none)"
        pivot = part.pivot(index="condition", columns="language", values="value")
        return pivot.to_string(float_format=lambda v: f"{v:.{digits}f}", na_rep="-")

    protocol = summary["protocol"].iloc[0] if "protocol" in summary.columns and len(summary) else "default"
    lines = [f"protocol: {protocol}; {LEGEND}",
             "accuracy (rows: condition, columns: language):", table("accuracy"),
             "consistency with orig answers:", table("consistency"),
             "  among items orig got right:", table("consistency", "orig_correct"),
             "  among items orig got wrong:", table("consistency", "orig_incorrect")]
    if (summary["metric"] == "valid").any():
        lines += ["valid answers (matching or containing a label word, §3.2):", table("valid")]
    high = f"bleu>={BLEU_HIGH:g}"
    if (summary["group"] == high).any():
        lines += [f"App. D: consistency among items with input BLEU >= {BLEU_HIGH:g}:", table("consistency", high),
                  "  share of items included:", table(f"share_{high}")]
    quality = summary[summary["metric"].isin(["bleu", "chrf", "rouge1", "rouge2", "rougeL", "comet"])]
    if not quality.empty:
        lines += ["translation quality of the model against the references (corpus BLEU, chrF; mean ROUGE F; COMET):",
                  quality.pivot_table(index=["group", "metric"], columns="language", values="value", sort=False)
                  .to_string(float_format=lambda v: f"{v:.2f}")]
    degenerate = summary[summary["metric"].str.startswith("sense_") & (summary.get("k", 0) > 0)]
    if not degenerate.empty:
        lines += ["degenerate senses of the model (share of its translations/paraphrases; see rows' "
                  "instruction_status and input_status):",
                  degenerate.pivot_table(index=["condition", "group", "metric"], columns="language", values="value")
                  .to_string(float_format=lambda v: f"{v:.2f}", na_rep="-")]
    corr = summary[summary["metric"] == "corr_bleu_consistent"]
    if not corr.empty:
        lines += ["Pearson r between an item's BLEU and its consistency (Table 3):",
                  corr.pivot(index="condition", columns="language", values="value")
                  .to_string(float_format=lambda v: f"{v:.2f}", na_rep="-")]
    skipped = summary[summary["metric"] == "skipped"]
    if not skipped.empty:
        lines += [f"skipped {int(skipped['n'].sum())} records that cannot be scored (rows of condition 'skipped'):"]
        lines += [f"  {r.language}: {int(r.n)} × {r.group}" for r in skipped.itertuples(index=False)]
    return "\n".join(lines)
