"""ECLeKTiC (Goldman et al. 2025): does a model transfer knowledge it has in one language to questions
asked in another? Closed-book question answering on facts that one language's Wikipedia covers and the
others lack.

**Data.** The public release (`eclektic_main.jsonl`; paper footnote 1: kaggle.com/datasets/omergoldman/
eclektic, mirrored on the hub) has one record per question: `q_id`, `original_lang` (the source
language), `title`, `url`, `content`/`question`/`answer` in the source language, and for every language
L `L_q`, `L_a`, `L_c` (question, answer and context translated into L). `load_eclektic` turns it into
one row per (question, language): `subset` is `source` for the question's own language and `target`
for the translations; `original_context` is the source-language context (for the open-book hint). A
language without `L_q` is not asked: the "popular pages" variant (§5, Table 4) is assumed to ship in
the same record layout with translations only into the languages it is evaluated in (those whose
Wikipedia lacks the article); the bundled `eclektic-popular-sample` is written that way. A long file
(`q_id`, `original_lang`, `lang`, `question`, `answer`[, `content`, `title`]) is read too. Sources:
`eclektic-sample` / `eclektic-popular-sample` (bundled, written for babelprobe; see
data/eclektic_sample/README.md), a local file or directory, or `hf:ORG/NAME[:FILE]` when online.

**Prompts** (data/prompts/eclektic.tsv, `--prompt-set`). The paper's sets are copied from App. A.3:
`closed-book` (the bare question, the main setting of §3.2/§4.1) and Table 3's hint conditions
`general-hint`, `source-language-name` ({in_lang}: the source language's English name),
`source-language-title` (+ {original_title}) and `cross-lingual-open-book` ({original_context}).
`qa` ("Question: …\\nAnswer:" in the question's language) is babelprobe's own frame for base models.
The default `auto` sends the bare question to instruction-tuned answerers (an `openai:` chat endpoint,
or a local model with `--chat-template`) and the `qa` frame to models that only continue text (a base
model such as the default Gemma-3-270M, `openai-completions:`), which given a bare question tend to
continue the question instead of answering it. Answers are cut at their first line only when asked
(`--answer-cut first-line`; `auto` cuts only the `qa` frame, whose continuation runs on into the next
"Question:"), and are at most `max_new_tokens` long (greedy; the paper gives no decoding settings).

**Judges.** `llm` / `llm:SPEC`: the paper's judge (§3.2), the App. A.2 prompt verbatim (set `judge`)
filled with the target-language context, the question and the prediction; correct when the judge says
YES (`llm` is the answering model itself, `llm:SPEC` another one; the paper used Gemini 2.0 Flash).
`match` (default, babelprobe's own cheap fallback; the paper has no string baseline): correct when the
normalised gold answer (NFKC, case-folded, punctuation removed) occurs in the normalised prediction,
starting at a word boundary; in scripts written without spaces (Chinese, Japanese, Korean, Thai)
anywhere. Rows also carry babelprobe's string diagnostics `exact` and `recall` (share of gold words
found), whatever the judge.

**Protocols.** `default`: the settings above (`auto` prompt and cut, `match` judge). `paper`
(`PROTOCOLS`): the bare question for every answerer, whole answers, the `llm` judge. Rows and summary
carry `protocol`, the condition (`method` / `prompt_set`) and the judge; docs/fidelity.md has the table.

**Metrics (§3.2).** For question q with source language s and target language t:
success(q, t) = correct in s AND correct in t.
  overall success = mean of success over the (q, t ≠ s) pairs (Table 2: Fig. 5's counts give its
                    41.6 only without the diagonal);
  transfer score  = the same mean over the pairs whose q was answered correctly in s.
`average = pooled` rows give these per source × target cell, per source and per target language
(pooled over pairs) and overall; `average = macro` rows are the margins as the paper reports them: the
mean of the source × target cells of a source (over targets) or of a target (over sources), diagonal
included (its success cell is the source accuracy, its transfer cell 1), as Fig. 5's bottom row and
§4.2's per-language averages; plus source accuracy. Intervals are 95%: `ci_low`/`ci_high` respect
clustering (Wilson where each question gives one pair, else a bootstrap over questions, within each
source language for macro margins); `wald_low`/`wald_high` treat every example as independent (normal
approximation), which is how Table 2's ± read: Fig. 5's counts give its 41.6±1.5 and ±1.8.
`plot_eclektic` draws the source × target heatmaps.
"""

from __future__ import annotations

import re
import unicodedata
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.benchmarks.core.generate import (
    SPEC_HELP,
    Generator,
    LocalGenerator,
    generate_cached,
    local_generator,
)
from babelprobe.bundled import bundled_sets
from babelprobe.errors import BabelprobeError
from babelprobe.items import read_records
from babelprobe.languages import iso_codes, language_names
from babelprobe.prompts import check_placeholders, placeholders, read_prompts
from babelprobe.settings import option
from babelprobe.stats import Z95, proportion

NAME = "eclektic"
TITLE = "ECLeKTiC: cross-lingual knowledge transfer (closed book)"
BUNDLED = bundled_sets("eclektic")
HUB_FILE = "eclektic_main.jsonl"
PROMPT_FILE = "eclektic"  # data/prompts/eclektic.tsv: closed-book sets and the judge prompt (set `judge`)
# Table 3's conditions (App. A.3) and babelprobe's `qa` frame for base models.
PROMPT_SETS = ("closed-book", "general-hint", "source-language-name", "source-language-title",
               "cross-lingual-open-book", "qa")
# What a closed-book template may use, and the record field each comes from (for error messages).
FILLED_FROM = {"question": "L_q", "in_lang": "original_lang", "original_title": "title",
               "original_context": "content"}
STOP = ["\n"]
JUDGE_TOKENS = 4  # the judge answers one word (App. A.2)
# Scripts written without spaces between words: a gold answer may be followed or preceded by anything.
NO_SPACE_SCRIPT = re.compile("[\u0e00-\u0e7f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")

# ---------------------------------------------------------------------------------------------- loading

def load_eclektic(source: str | Path, languages: list[str] | None = None, limit: int | None = None) -> pd.DataFrame:
    """One row per (question, language); `languages` keeps questions whose source language is listed
    and their rows in listed languages; `limit` keeps the first N questions per source language."""
    frame, origin = _read_source(str(source))
    questions = _long_rows(frame, origin)
    if languages:
        unknown = sorted(set(languages) - set(questions["language"]))
        if unknown:
            raise BabelprobeError(f"language {', '.join(unknown)} not in {origin}; available: "
                                  f"{', '.join(sorted(questions['language'].unique()))}")
        questions = questions[questions["source_language"].isin(languages) & questions["language"].isin(languages)]
    if limit is not None:
        keep = questions.drop_duplicates("q_id").groupby("source_language", sort=False).head(limit)["q_id"]
        questions = questions[questions["q_id"].isin(keep)]
    if questions.empty:
        raise BabelprobeError(f"no ECLeKTic questions left in {origin} after selecting languages={languages}")
    return questions.reset_index(drop=True)


def _read_source(source: str) -> tuple[pd.DataFrame, str]:
    if source in BUNDLED:
        return read_records(BUNDLED[source].location), source
    if source.startswith("hf:"):
        return read_records(_download(source[3:])), source
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".json", ".csv", ".parquet"))
        if not files:
            raise BabelprobeError(f"directory {source} has no .jsonl, .json, .csv or .parquet file")
        return pd.concat([read_records(p) for p in files], ignore_index=True), source
    if path.is_file():
        return read_records(path), source
    raise BabelprobeError(f"ECLeKTic data {source!r} is neither {', '.join(BUNDLED)}, a file, a directory nor "
                          "hf:ORG/NAME[:FILE]; the release is eclektic_main.jsonl (kaggle.com/datasets/omergoldman/eclektic)")


def _download(spec: str) -> Path:
    repo, _, filename = spec.partition(":")
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo, filename or HUB_FILE, repo_type="dataset"))
    except Exception as err:  # offline, missing repo or file: all user-facing
        raise BabelprobeError(f"cannot download {filename or HUB_FILE} from dataset {repo!r}: "
                              f"{str(err).splitlines()[0]}; download it yourself and pass its path") from err


def _text(value) -> str:
    """A field as a stripped string; missing (None/NaN) is empty."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    return str(value).strip()


def _long_rows(frame: pd.DataFrame, origin: str) -> pd.DataFrame:
    columns = set(frame.columns)
    wide = sorted(c[:-2] for c in columns if re.fullmatch(r"[a-z]{2}_q", c))
    if wide:
        rows = [row for record in frame.to_dict("records") for row in _wide_record(record, wide)]
    elif {"original_lang", "question", "answer"} <= columns and ({"lang", "language"} & columns):
        rows = [_long_record(record) for record in frame.to_dict("records")]
    else:
        needed = "q_id, original_lang and L_q/L_a[/L_c] per language (or lang, question, answer)"
        raise BabelprobeError(f"{origin}: not ECLeKTic records; expected fields {needed}, got "
                              f"{', '.join(sorted(c for c in columns if c != '_source'))}")
    long = pd.DataFrame(rows)
    _check_questions(long)
    long["subset"] = np.where(long["language"] == long["source_language"], "source", "target")
    long["pair_id"] = long["q_id"]
    long["item_id"] = long["q_id"] + ":" + long["language"]
    long["label"] = -1
    long["text"] = long["question"]
    # The source-language context of each question (the cross-lingual open-book hint, App. A.3).
    source_context = long[long["subset"] == "source"].set_index("q_id")["context"]
    long["original_context"] = long["q_id"].map(source_context).fillna("")
    order = ["item_id", "pair_id", "q_id", "language", "source_language", "subset", "label", "text", "question",
             "answer", "context", "original_context", "title", "url", "_source"]
    return long[order].sort_values(["source_language", "q_id", "subset", "language"], kind="stable")


def _required(record: dict, field: str) -> str:
    value = _text(record.get(field))
    if not value:
        raise BabelprobeError(f"{record.get('_source', '?')}: missing field {field!r}")
    return value


def _wide_record(record: dict, languages: list[str]) -> list[dict]:
    """One released record -> one row per language that has a question."""
    where = record.get("_source", "?")
    q_id, source = _required(record, "q_id"), _required(record, "original_lang")
    rows = []
    for lang in sorted(set(languages) | {source}):
        fallback = lang == source  # the source fields may be given only as question/answer/content
        question = _text(record.get(f"{lang}_q")) or (_text(record.get("question")) if fallback else "")
        if not question:
            continue
        answer = _text(record.get(f"{lang}_a")) or (_text(record.get("answer")) if fallback else "")
        if not answer:
            raise BabelprobeError(f"{where}: question {q_id} has {lang}_q but no answer in field '{lang}_a'")
        context = _text(record.get(f"{lang}_c")) or (_text(record.get("content")) if fallback else "")
        rows.append({"q_id": q_id, "language": lang, "source_language": source, "question": question,
                     "answer": answer, "context": context, "title": _text(record.get("title")),
                     "url": _text(record.get("url")), "_source": where})
    if not any(r["language"] == source for r in rows):
        raise BabelprobeError(f"{where}: question {q_id} has no question in its source language {source!r} "
                              f"(field '{source}_q' or 'question')")
    return rows


def _long_record(record: dict) -> dict:
    language = _text(record.get("lang")) or _text(record.get("language"))
    return {"q_id": _required(record, "q_id"), "language": language,
            "source_language": _required(record, "original_lang"), "question": _required(record, "question"),
            "answer": _required(record, "answer"), "context": _text(record.get("content")),
            "title": _text(record.get("title")), "url": _text(record.get("url")),
            "_source": record.get("_source", "?")}


def _check_questions(long: pd.DataFrame) -> None:
    codes = iso_codes()
    for field, name in (("source_language", "original_lang"), ("language", "language")):
        bad = long[~long[field].isin(codes)]
        if not bad.empty:
            row = bad.iloc[0]
            raise BabelprobeError(f"{row['_source']}: {name} {row[field]!r} of question {row['q_id']} is not an "
                                  "ISO 639-1 code (like en, de, ja)")
    duplicated = long[long.duplicated(["q_id", "language"], keep=False)]
    if not duplicated.empty:
        row = duplicated.iloc[-1]
        raise BabelprobeError(f"{row['_source']}: question {row['q_id']} appears twice in language {row['language']}")
    sources = long.groupby("q_id")["source_language"].nunique()
    if (sources > 1).any():
        raise BabelprobeError(f"question {sources[sources > 1].index[0]} has rows with different original_lang")
    has_source = long[long["language"] == long["source_language"]]["q_id"]
    missing = sorted(set(long["q_id"]) - set(has_source))
    if missing:
        raise BabelprobeError(f"question {missing[0]} has no row in its source language")


# ---------------------------------------------------------------------------------------------- prompts

def prompt_templates(prompt_set: str = "qa", path: str | Path | None = None) -> dict[str, str]:
    """Templates by language (`*`: any language) of a set in data/prompts/eclektic.tsv (columns set,
    language, template), or of a prompt file of your own with columns language and template (a `set`
    column, if any, is ignored: the whole file is the set)."""
    rows = read_prompts(path or PROMPT_FILE, ("language", "template"), optional=("set",))
    if not path:
        chosen = rows[rows["set"] == prompt_set]
        if chosen.empty:
            sets = sorted(set(rows["set"]) - {"judge"})
            raise BabelprobeError(f"{PROMPT_FILE}: no prompt set {prompt_set!r}; available: {', '.join(sets)}")
        rows = chosen
    for row in rows.to_dict("records"):
        check_placeholders(row["template"], f"{row['line']}: the template for {row['language']}", ("question",),
                           allowed=tuple(FILLED_FROM)[1:])
    return dict(zip(rows["language"], rows["template"]))


def closed_book_prompts(questions: pd.DataFrame, templates: dict[str, str]) -> list[str]:
    """Each question in its language's template (or the `*` template), with {in_lang} (English name of
    the source language), {original_title} and {original_context} filled in."""
    missing = sorted(set(questions["language"]) - set(templates)) if "*" not in templates else []
    if missing:
        raise BabelprobeError(f"no closed-book prompt for language {', '.join(missing)}; add it to the prompt "
                              "file (--prompt-file) or use --prompt-set closed-book")
    names = language_names()
    prompts = []
    for row in questions.to_dict("records"):
        template = templates.get(row["language"], templates.get("*", ""))
        values = {"question": row["question"], "in_lang": names.get(row["source_language"], row["source_language"]),
                  "original_title": _text(row.get("title")), "original_context": _text(row.get("original_context"))}
        for name in placeholders(template):
            if not values[name]:
                raise BabelprobeError(f"the prompt uses {{{name}}} but question {row['q_id']} has none "
                                      f"(field {FILLED_FROM[name]!r} of its record)")
        prompts.append(_fill(template, values))
    return prompts


def _fill(template: str, values: dict[str, str]) -> str:
    """Placeholders replaced in one pass (a question that contains '{context}' stays as it is)."""
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), template)


def answer_questions(generator: Generator, questions: pd.DataFrame, templates: dict[str, str] | None = None,
                     max_new_tokens: int = 256, first_line: bool = False, cache: str | Path | None = None,
                     progress: bool = False) -> pd.DataFrame:
    """The questions with `prompt` and `prediction` (the continuation, stripped; only its first line
    when `first_line`)."""
    prompts = closed_book_prompts(questions, templates or prompt_templates("qa"))
    outputs = generate_cached(generator, prompts, cache, max_new_tokens=max_new_tokens,
                              stop=STOP if first_line else None, progress=progress, desc="answering")
    return questions.assign(prompt=prompts, prediction=[o.strip() for o in outputs], generator=generator.name,
                            max_new_tokens=max_new_tokens, answer_cut="first-line" if first_line else "none")


# ------------------------------------------------------------------------------------------------ judge

def normalize_answer(text: str) -> str:
    """NFKC, case-folded, digit-group separators dropped (1,269 -> 1269), punctuation and symbols -> space."""
    text = unicodedata.normalize("NFKC", str(text)).casefold()
    text = re.sub(r"(?<=\d)[,.'’\u00a0 ](?=\d{3}(?!\d))", "", text)
    text = "".join(" " if unicodedata.category(c)[0] in "PSZ" else c for c in text)
    return " ".join(text.split())


def answer_found(answer: str, prediction: str) -> bool:
    """Is the normalised answer in the normalised prediction (at a word start, unless in a spaceless script)?"""
    gold, pred = normalize_answer(answer), normalize_answer(prediction)
    if not gold:
        return False
    if NO_SPACE_SCRIPT.search(gold):
        return gold in pred
    return re.search(r"(?<!\w)" + re.escape(gold), pred) is not None


def word_recall(answer: str, prediction: str) -> float:
    """Share of the gold answer's words (characters, in spaceless scripts) that occur in the prediction:
    a diagnostic of babelprobe's own (the paper has no string metric)."""
    gold, pred = normalize_answer(answer), normalize_answer(prediction)
    units = [c for c in gold if not c.isspace()] if NO_SPACE_SCRIPT.search(gold) else gold.split()
    return sum(u in pred for u in units) / len(units) if units else 0.0


def judge_match(rows: pd.DataFrame) -> pd.DataFrame:
    """babelprobe's containment judge: `correct` by normalised containment, plus `exact` and `recall`."""
    return rows.assign(
        correct=[answer_found(a, p) for a, p in zip(rows["answer"], rows["prediction"])],
        exact=[normalize_answer(a) == normalize_answer(p) for a, p in zip(rows["answer"], rows["prediction"])],
        recall=[round(word_recall(a, p), 4) for a, p in zip(rows["answer"], rows["prediction"])],
        judge="match", judge_output="")


def judge_template(path: str | Path | None = None) -> str:
    """The judge prompt: set `judge` of data/prompts/eclektic.tsv (App. A.2), or the `template` of your file."""
    rows = read_prompts(path or PROMPT_FILE, ("template",), optional=("set", "language"))
    if not path:
        rows = rows[rows["set"] == "judge"]
    template = rows["template"].iloc[0]
    check_placeholders(template, f"judge prompt {rows['line'].iloc[0]}", ("context", "question", "predicted_answer"),
                       allowed=("target_language",), once=False)
    return template


def judge_prompts(rows: pd.DataFrame, template: str) -> list[str]:
    """The judge template filled with each row's language name, context, question and prediction."""
    names = language_names()
    return [_fill(template, {"target_language": names.get(lang, lang), "context": c, "question": q,
                             "predicted_answer": p})
            for lang, c, q, p in zip(rows["language"], rows["context"], rows["question"], rows["prediction"])]


def check_contexts(rows: pd.DataFrame) -> None:
    """The LLM judge reads the target-language context: every row needs one."""
    without = rows[rows["context"].fillna("") == ""]
    if not without.empty:
        row = without.iloc[0]
        raise BabelprobeError(f"the LLM judge needs the context: question {row['q_id']} has none in "
                              f"{row['language']} (field '{row['language']}_c'); use --judge match")


def judge_llm(rows: pd.DataFrame, generator: Generator, prompt_file: str | Path | None = None,
              cache: str | Path | None = None, progress: bool = False) -> pd.DataFrame:
    """`correct` when the judge answers YES to the judge prompt (context, question, prediction)."""
    check_contexts(rows)
    prompts = judge_prompts(rows, judge_template(prompt_file))
    outputs = generate_cached(generator, prompts, cache, max_new_tokens=JUDGE_TOKENS, stop=STOP, progress=progress,
                              desc="judging")
    verdicts = [_verdict(o) for o in outputs]
    return rows.assign(correct=[v == "YES" for v in verdicts], judge=f"llm:{generator.name}",
                       judge_output=[o.strip() for o in outputs])


def _verdict(output: str) -> str:
    """YES, NO or '' (neither: counted as not correct) from a judge's answer."""
    match = re.search(r"\b(YES|NO)\b", output.upper())
    return match.group(1) if match else ""


# ---------------------------------------------------------------------------------------------- metrics

def transfer_pairs(rows: pd.DataFrame, diagonal: bool = False) -> pd.DataFrame:
    """One row per (question, target language ≠ source): source_correct, target_correct, success.
    `diagonal` adds each question's source-language row as the pair (q, s, s), whose success is the
    source answer's correctness (the paper's matrices, Fig. 3 and 5)."""
    source = rows[rows["subset"] == "source"].set_index("q_id")["correct"].astype(bool)
    target = rows if diagonal else rows[rows["subset"] == "target"]
    pairs = pd.DataFrame({"q_id": target["q_id"].values, "source_language": target["source_language"].values,
                          "target_language": target["language"].values,
                          "source_correct": source.reindex(target["q_id"]).fillna(False).astype(bool).values,
                          "target_correct": target["correct"].astype(bool).values})
    pairs["success"] = pairs["source_correct"] & pairs["target_correct"]
    return pairs


def wald(k, n) -> tuple[float, float]:
    """The normal-approximation 95% interval of k/n, every example independent (Table 2's ±)."""
    if not n:
        return np.nan, np.nan
    p = k / n
    half = Z95 * np.sqrt(p * (1 - p) / n)
    return p - half, p + half


def macro_proportion(pairs: pd.DataFrame, cell: str, hit: str, counted: str | None = None, n_boot: int = 2000,
                     seed: int = 0) -> dict:
    """The mean over the values of column `cell` (e.g. target languages) of each cell's share of `hit`
    among the `counted` pairs. Intervals: a percentile bootstrap resampling questions within each source
    language (a question's pairs stay together; every source keeps its number of questions) and the
    normal approximation with independent examples and cells (`wald_low`, `wald_high`)."""
    counted_mask = pairs[counted].to_numpy(bool) if counted else np.ones(len(pairs), bool)
    question, questions = pd.factorize(pairs["q_id"])
    column, _ = pd.factorize(pairs[cell])
    k = np.zeros((len(questions), column.max() + 1))  # hits and counted pairs per question and cell
    n = np.zeros_like(k)
    np.add.at(k, (question, column), pairs[hit].to_numpy(bool) & counted_mask)
    np.add.at(n, (question, column), counted_mask)
    strata = np.empty(len(questions), object)
    strata[question] = pairs["source_language"].to_numpy()
    kc, nc = k.sum(axis=0), n.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = kc / nc
    used = nc > 0
    out = {"n": int(nc.sum()), "k": int(kc.sum()), "value": float(np.mean(ratios[used])) if used.any() else np.nan,
           "ci_low": np.nan, "ci_high": np.nan, "interval": "", "wald_low": np.nan, "wald_high": np.nan}
    if not used.any():
        return out
    half = Z95 * np.sqrt(np.sum(ratios[used] * (1 - ratios[used]) / nc[used])) / used.sum()
    out.update(wald_low=out["value"] - half, wald_high=out["value"] + half)
    rng = np.random.default_rng(seed)
    kb, nb = np.zeros((n_boot, k.shape[1])), np.zeros((n_boot, k.shape[1]))
    for stratum in pd.unique(strata):  # how often each question of this source is drawn, per resample
        rows = np.flatnonzero(strata == stratum)
        counts = rng.multinomial(len(rows), np.full(len(rows), 1 / len(rows)), size=n_boot)
        kb += counts @ k[rows]
        nb += counts @ n[rows]
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a resample without any counted pair: NaN, left out
        means = np.nanmean(np.where(used, kb / nb, np.nan), axis=1)
    low, high = np.nanpercentile(means, [2.5, 97.5])
    out.update(ci_low=float(low), ci_high=float(high), interval="bootstrap over questions within source languages")
    return out


def _pooled(units, hits, counted=None, n_boot: int = 2000, seed: int = 0) -> dict:
    """`stats.proportion` (clustered interval) plus the interval with independent examples."""
    result = proportion(units, hits, counted, n_boot, seed, unit="questions")
    low, high = wald(result["k"], result["n"])
    return {**result, "wald_low": low, "wald_high": high}


def run_info(rows: pd.DataFrame) -> dict:
    """Which protocol, closed-book condition and judge produced the rows (for the summary)."""
    info = {}
    for column, key in (("protocol", "protocol"), ("method", "prompt_set"), ("judge", "judge")):
        values = sorted(set(rows[column].astype(str))) if column in rows.columns else []
        info[key] = ",".join(values)
    return info


def eclektic_summary(rows: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Source accuracy, overall success and transfer score per cell, per margin (pooled and, as the
    paper reports them, macro) and overall, in one long table (see the module docstring)."""
    pairs = transfer_pairs(rows)
    source = rows[rows["subset"] == "source"].assign(correct=lambda d: d["correct"].astype(bool))
    out = []
    for s, group in [*source.groupby("source_language"), ("all", source)]:
        out.append({"metric": "source_accuracy", "source_language": s, "target_language": s, "average": "pooled",
                    **_pooled(group["q_id"], group["correct"], n_boot=n_boot, seed=seed)})
    selections = [(s, t, g) for (s, t), g in pairs.groupby(["source_language", "target_language"])]
    selections += [(s, "all", g) for s, g in pairs.groupby("source_language")]
    selections += [("all", t, g) for t, g in pairs.groupby("target_language")]
    selections += [("all", "all", pairs)]
    for s, t, group in selections:
        where = {"source_language": s, "target_language": t, "average": "pooled"}
        out.append({"metric": "overall_success", **where,
                    **_pooled(group["q_id"], group["success"], n_boot=n_boot, seed=seed)})
        out.append({"metric": "transfer_score", **where,
                    **_pooled(group["q_id"], group["target_correct"], group["source_correct"], n_boot, seed)})
    # The paper's margins: means of the matrix cells, diagonal included (Fig. 5's bottom row, §4.2).
    cells = transfer_pairs(rows, diagonal=True)
    for fixed, over in (("source_language", "target_language"), ("target_language", "source_language")):
        for language, group in cells.groupby(fixed):
            where = {"source_language": "all", "target_language": "all", fixed: language, "average": "macro"}
            out.append({"metric": "overall_success", **where,
                        **macro_proportion(group, over, "success", n_boot=n_boot, seed=seed)})
            out.append({"metric": "transfer_score", **where,
                        **macro_proportion(group, over, "target_correct", "source_correct", n_boot, seed)})
    summary = pd.DataFrame(out)
    for key, value in run_info(rows).items():
        summary[key] = value
    return summary


def transfer_matrices(summary: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Source × target matrices: success (diagonal: source accuracy, elsewhere overall success) and transfer."""
    cells = summary[(summary["source_language"] != "all") & (summary["target_language"] != "all")]
    langs = sorted(set(cells["source_language"]) | set(cells["target_language"]))
    success = cells[cells["metric"].isin(["overall_success", "source_accuracy"])].pivot(
        index="source_language", columns="target_language", values="value").reindex(index=langs, columns=langs)
    transfer = cells[cells["metric"] == "transfer_score"].pivot(
        index="source_language", columns="target_language", values="value").reindex(index=langs, columns=langs)
    return success, transfer


def macro_margins(summary: pd.DataFrame, direction: str) -> pd.DataFrame:
    """The paper's per-`direction` ("source" or "target") margins: metrics down, languages across."""
    column = f"{direction}_language"
    other = "target_language" if direction == "source" else "source_language"
    rows = summary[(summary["average"] == "macro") & (summary[other] == "all") & (summary[column] != "all")]
    return rows.pivot(index="metric", columns=column, values="value")


# ------------------------------------------------------------------------------------------------- runs

def run_eclektic(generator: Generator, questions: pd.DataFrame, templates: dict[str, str] | None = None,
                 max_new_tokens: int = 256, first_line: bool = False, judge: str = "match",
                 judge_generator: Generator | None = None, judge_prompt: str | Path | None = None,
                 cache: str | Path | None = None, progress: bool = False, method: str = "closed-book") -> pd.DataFrame:
    """Answer every question and judge it: one row per (question, language) in docs/design.md's
    conventions; `method` names the closed-book condition (the prompt set)."""
    if judge != "match":
        check_contexts(questions)  # before any answer is generated
    rows = answer_questions(generator, questions, templates, max_new_tokens=max_new_tokens, first_line=first_line,
                            cache=cache, progress=progress)
    rows = judge_match(rows)
    if judge != "match":
        if judge_generator is None:
            raise BabelprobeError(f"judge {judge!r} needs a judge generator")
        rows = judge_llm(rows.drop(columns=["correct", "judge", "judge_output"]), judge_generator, judge_prompt,
                         cache=cache, progress=progress)
    rows.insert(list(rows.columns).index("subset") + 1, "method", method)
    rows["correct"] = rows["correct"].astype(bool)
    return rows.drop(columns=["_source"])


@dataclass(frozen=True)
class Settings:
    """Who answers, with which prompt, and who judges (recorded in run.json); docs/fidelity.md compares
    the defaults and the paper preset with the paper."""

    protocol: str = option("default", help="settings preset: default (babelprobe's, for any model) or paper "
                           "(the paper's closed-book prompt, uncut answers, the App. A.2 LLM judge)")
    generator: str = option("local", metavar="SPEC", help=f"who answers: {SPEC_HELP}")
    chat_template: bool = option(False, help="local generators: send each prompt as the user turn of the model's "
                                 "chat template (instruction-tuned local models; openai: chat endpoints always do)")
    prompt_set: str = option("auto", choices=("auto", *PROMPT_SETS),
        help="closed-book prompt set of data/prompts/eclektic.tsv: closed-book (the bare question) and Table 3's "
        "hint conditions, or qa ('Question: …\\nAnswer:', babelprobe's frame for base models); auto: closed-book "
        "for chat answerers (openai:, --chat-template), qa otherwise")
    prompt_file: str | None = option(None, metavar="FILE.tsv", help="your own templates (columns language, "
                                     "template; placeholders {question} {in_lang} {original_title} {original_context})")
    answer_cut: str = option("auto", choices=("auto", "none", "first-line"),
        help="keep the whole answer (none) or its first line; auto: the first line for the qa frame only")
    max_new_tokens: int = option(256, budget=True, help="answer length bound, in tokens")
    judge: str = option("match", metavar="match|llm|llm:SPEC",
        help="match (babelprobe's normalised containment) or the paper's LLM judge with the App. A.2 prompt: llm "
        "(the answering model) or llm:SPEC (another generator)")
    judge_prompt: str | None = option(None, metavar="FILE", help="your judge prompt with {context} {question} "
                                      "{predicted_answer} [{target_language}]; unset: App. A.2 (set judge of "
                                      "data/prompts/eclektic.tsv)")

    def __post_init__(self):
        if self.judge not in ("match", "llm") and not self.judge.startswith("llm:"):
            raise BabelprobeError(f"--judge {self.judge!r}: use match, llm or llm:SPEC")
        if self.chat_template and not self.generator.startswith("local"):
            raise BabelprobeError(f"--chat-template applies to local generators, not {self.generator!r} "
                                  "(openai: endpoints are chat endpoints already)")


# The paper's protocol (§3.2, §4.1, App. A): the bare question, whole answers, the App. A.2 LLM judge. A local
# instruction-tuned model also needs --chat-template (the paper's models were prompted in their chat format).
PROTOCOLS = {"paper": {"prompt_set": "closed-book", "answer_cut": "none", "judge": "llm"}}


def condition(settings: Settings) -> str:
    """The closed-book condition a run uses: the prompt set (`auto` resolved) or your file's name."""
    if settings.prompt_file:
        return Path(settings.prompt_file).stem
    if settings.prompt_set != "auto":
        return settings.prompt_set
    chat = settings.chat_template or settings.generator.startswith("openai:")
    return "closed-book" if chat else "qa"


def first_line(settings: Settings) -> bool:
    """Is the answer cut at its first line?"""
    if settings.answer_cut == "auto":
        return condition(settings) == "qa"
    return settings.answer_cut == "first-line"


def load(source: str | Path, languages: list[str] | None = None, limit: int | None = None) -> pd.DataFrame:
    """The benchmark contract's loader (`load_eclektic`)."""
    return load_eclektic(source, languages=languages, limit=limit)


def check(data: pd.DataFrame, settings: Settings) -> None:
    """Every question has a prompt (and a context, for the LLM judge): fails before any model is loaded."""
    closed_book_prompts(data, prompt_templates(condition(settings), settings.prompt_file))
    if settings.judge != "match":
        check_contexts(data)
        judge_template(settings.judge_prompt)


def answering_generator(models, settings: Settings) -> Generator:
    """The generator that answers; a local one through its chat template when `chat_template`."""
    generator = models.generator(settings.generator)
    if settings.chat_template and isinstance(generator, LocalGenerator):
        generator = local_generator(generator.lm, batch_size=generator.batch_size, chat_template=True,
                                    progress=generator.progress)
    return generator


def run(data: pd.DataFrame, models, settings: Settings = Settings(), out: Path | None = None,
        progress: bool = True) -> pd.DataFrame:
    """The benchmark contract's run: answer and judge every question (generations kept in
    `out/generations.jsonl`, so a rerun resumes)."""
    from babelprobe.benchmarks.base import as_models

    models = as_models(models)
    generator = answering_generator(models, settings)
    judge = None  # `match` needs no model
    if settings.judge == "llm":
        judge = generator
    elif settings.judge.startswith("llm:"):
        judge = models.generator(settings.judge[4:])
    rows = run_eclektic(generator, data, prompt_templates(condition(settings), settings.prompt_file),
                        max_new_tokens=settings.max_new_tokens, first_line=first_line(settings),
                        judge=settings.judge, judge_generator=judge, judge_prompt=settings.judge_prompt,
                        cache=Path(out) / "generations.jsonl" if out is not None else None, progress=progress,
                        method=condition(settings))
    rows["protocol"] = settings.protocol
    return rows


def answerer(settings: Settings) -> str:
    return settings.generator


summarize = eclektic_summary  # the benchmark contract's summary (already long)


def _percent(row) -> str:
    """value±half-width in points, the way Table 2 prints it."""
    return f"{100 * row['value']:.1f}±{100 * (row['wald_high'] - row['wald_low']) / 2:.1f}"


def format_summary(summary: pd.DataFrame) -> str:
    """The protocol, the headline numbers and the paper's margins, then the matrices, as text."""
    first = summary.iloc[0] if len(summary) else {}
    lines = [f"ECLeKTiC, protocol {first.get('protocol') or '?'}: prompt {first.get('prompt_set') or '?'}, "
             f"judge {first.get('judge') or '?'}",
             "value [95% interval respecting questions]  value±half-width with independent examples (as Table 2)"]
    for metric in ("source_accuracy", "overall_success", "transfer_score"):
        row = summary[(summary["metric"] == metric) & (summary["source_language"] == "all")
                      & (summary["target_language"] == "all") & (summary["average"] == "pooled")]
        if not row.empty:
            r = row.iloc[0]
            lines.append(f"  {metric:16s} {r['value']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]  {_percent(r)}  "
                         f"({r['k']}/{r['n']}, {r['interval']})")
    for direction, over in (("source", "targets"), ("target", "sources")):
        margins = macro_margins(summary, direction)
        if not margins.empty:
            lines.append(f"per {direction} language (mean over {over}, diagonal included, as the paper's margins):")
            lines.append(margins.to_string(float_format=lambda v: f"{v:.2f}", na_rep="-"))
    success, transfer = transfer_matrices(summary)
    lines.append("overall success (rows: source, columns: target; diagonal: source accuracy):")
    lines.append(success.to_string(float_format=lambda v: f"{v:.2f}", na_rep="-"))
    lines.append("transfer score:")
    lines.append(transfer.to_string(float_format=lambda v: f"{v:.2f}", na_rep="-"))
    return "\n".join(lines)
