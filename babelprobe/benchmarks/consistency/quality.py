"""Translation quality of the model's input translations against the reference translations (§4.3,
Table 2): per item, sentence BLEU and chrF averaged over the two texts (`item_translation_quality`, for
the Table 3 correlations) and COMET-22 with --comet (`with_comet`); per target language, corpus BLEU and
chrF (sacrebleu) and mean ROUGE-1/2/L F-measure (`rouge-score`) (`corpus_translation_quality`)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from babelprobe.benchmarks.base import metric_row
from babelprobe.benchmarks.consistency.answers import UNSPACED
from babelprobe.benchmarks.consistency.settings import COMET_MODEL
from babelprobe.errors import BabelprobeError


def bleu_tokenizer(language: str) -> str:
    """sacrebleu's tokenizer for a language: Chinese has its own (as the authors used), Japanese/Korean/
    Thai by character."""
    return {"zh": "zh", "ja": "char", "ko": "char", "th": "char"}.get(language, "13a")


def input_fields(rows: pd.DataFrame) -> list[str]:
    """The task's input fields, from the per-field status columns every row carries."""
    return [c.removeprefix("status_") for c in rows.columns if c.startswith("status_")]


def item_translation_quality(rows: pd.DataFrame) -> pd.DataFrame:
    """Sentence BLEU and chrF of the model's translation of each item's input against its reference,
    averaged over the two texts (§4.3: "averaging the scores for the translation of each sentence"), for
    rows whose input is the model's translation and has references."""
    import sacrebleu

    rows = rows.copy()
    rows["bleu"], rows["chrf"] = np.nan, np.nan
    fields = input_fields(rows)
    scored = rows["condition"].isin(["T", "X"]) & rows[[f"reference_{f}" for f in fields]].notna().all(axis=1)
    for index in rows.index[scored]:
        row = rows.loc[index]
        pairs = [(row[f"input_{f}"], row[f"reference_{f}"]) for f in fields]
        rows.at[index, "bleu"] = np.mean([sacrebleu.sentence_bleu(h, [r], tokenize=bleu_tokenizer(row["language"])).score
                                          for h, r in pairs])
        rows.at[index, "chrf"] = np.mean([sacrebleu.sentence_chrf(h, [r]).score for h, r in pairs])
    return rows


class RougeTokens:
    """ROUGE's tokens: lower-cased runs of letters and digits in any script, and every Chinese, Japanese
    or Thai character on its own (rouge-score's own tokenizer keeps only a-z and 0-9)."""

    pattern = re.compile(rf"{UNSPACED.pattern}|[^\W_]+")

    def tokenize(self, text: str) -> list[str]:
        return self.pattern.findall(str(text).casefold())


def rouge_scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """Mean sentence F-measure of ROUGE-1, ROUGE-2 and ROUGE-L (Lin 2004) with `rouge-score`."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], tokenizer=RougeTokens())
    scores = [scorer.score(r, h) for h, r in zip(hypotheses, references)]
    return {name: float(np.mean([s[name].fmeasure for s in scores])) for name in ("rouge1", "rouge2", "rougeL")}


def comet_scores(triples: list[tuple[str, str, str]], batch_size: int = 8) -> list[float]:
    """COMET-22 segment scores of (source, translation, reference) triples (§4.3, Table 2); needs the
    optional extra `pip install 'babelprobe[comet]'` and downloads the model on first use."""
    try:
        from comet import download_model, load_from_checkpoint
    except ImportError:
        raise BabelprobeError("COMET-22 needs the optional extra: pip install 'babelprobe[comet]' (unbabel-comet); "
                              "or run without --comet") from None
    import torch

    model = load_from_checkpoint(download_model(COMET_MODEL))
    output = model.predict([{"src": s, "mt": m, "ref": r} for s, m, r in triples], batch_size=batch_size,
                           gpus=1 if torch.cuda.is_available() else 0, progress_bar=False)
    return [float(s) for s in output.scores]


def with_comet(rows: pd.DataFrame, items: pd.DataFrame) -> pd.DataFrame:
    """`comet`: the mean COMET-22 score of each item's input translation (T and X rows with references)."""
    fields = input_fields(rows)
    sources = items.set_index("item_id")
    scored = rows["condition"].isin(["T", "X"]) & rows[[f"reference_{f}" for f in fields]].notna().all(axis=1)
    unique = rows[scored].drop_duplicates(["item_id", "language"])
    triples = [(sources.at[r["item_id"], f], r[f"input_{f}"], r[f"reference_{f}"])
               for _, r in unique.iterrows() for f in fields]
    scores = np.array(comet_scores(triples)).reshape(len(unique), len(fields)).mean(axis=1) if triples else []
    per_item = dict(zip(zip(unique["item_id"], unique["language"]), scores))
    rows = rows.copy()
    rows["comet"] = [per_item.get((i, lang), np.nan) if s else np.nan
                     for i, lang, s in zip(rows["item_id"], rows["language"], scored)]
    return rows


def corpus_translation_quality(rows: pd.DataFrame) -> pd.DataFrame:
    """Translation quality per target language of the model's translations against the references
    (Table 2): corpus BLEU and chrF of the inputs (all fields, from condition X, once per item) and of
    the instruction (from condition I, once per source language, where a reference instruction exists);
    ROUGE-1/2/L of the inputs; COMET-22 of the inputs when the rows carry it."""
    import sacrebleu

    out = []
    inputs = rows[rows["condition"] == "X"].drop_duplicates(["item_id", "language"])
    instructions = rows[rows["condition"] == "I"].drop_duplicates(["source_language", "language"])
    for lang in sorted(set(inputs["language"]) | set(instructions["language"])):
        part = inputs[inputs["language"] == lang]
        pairs = [(h, r) for f in input_fields(rows) for h, r in zip(part[f"input_{f}"], part[f"reference_{f}"]) if pd.notna(r)]
        told = instructions[(instructions["language"] == lang) & instructions["instruction_reference"].notna()]
        for scope, scored in (("input", pairs), ("instruction", list(zip(told["instruction"], told["instruction_reference"])))):
            if not scored:
                continue
            hyps, refs = [h for h, _ in scored], [r for _, r in scored]
            cell, n = {"language": lang, "condition": "", "group": scope}, len(hyps)
            out.append(metric_row(cell, "bleu", sacrebleu.corpus_bleu(hyps, [refs], tokenize=bleu_tokenizer(lang)).score,
                                  n=n))
            out.append(metric_row(cell, "chrf", sacrebleu.corpus_chrf(hyps, [refs]).score, n=n))
            if scope == "input":
                out += [metric_row(cell, name, value, n=n) for name, value in rouge_scores(hyps, refs).items()]
        if "comet" in part and part["comet"].notna().any():
            out.append(metric_row({"language": lang, "condition": "", "group": "input"}, "comet",
                                  part["comet"].mean(), n=part["comet"].notna().sum()))
    return pd.DataFrame(out)
