"""Cross-Lingual Pitfalls (Xu et al., ACL 2025): questions a model answers in English but not in the
target language; evaluation, metrics and the Relative Affinity Score. The weakness search that makes
such questions is `pitfalls.search` (`babelprobe bench pitfalls-search`).

**Data.** `load_pitfalls(source, languages, limit)` reads the released bilingual questions: a directory of
`<Language>.json` files (`<Language>_results.json` holds the paper's per-model counts, `source/` the
English seed questions), one such file, or the bundled `pitfalls-sample`. Every question has four variants:

    English, original     oriquestion,   choices,      answer
    English, perturbed    question,      choices,      answer        (prequestion + oriquestion + sufquestion)
    target,  original     transori,      transchoices, transanswer
    target,  perturbed    transquestion, transchoices, transanswer

The release has broken records (docs/datasets.md): choices wrapped in literal quotes while the answer is
not (`'Alter Sparky'` vs `Alter Sparky`), records with `"transanswer": "None", "transchoices": []`. The
authors' evaluation keeps them and scores by exact match, so the first kind is always wrong and the second
unanswerable. Here quotes are normalised the same way on choices and answer (`normalise_side`) and a
record that still cannot be scored is skipped with its reason; every file is validated whole before
`limit`, one bad record never rejects a file and an unreadable file never stops the other languages.
Per language, the records read, normalised and skipped are printed, kept in `data.attrs["load_report"]`,
carried on every row and reported in the summary.

**Answering** (`Settings.answer`):
  - `likelihood` (default): the paper's simulation instruction in the question's language
    (data/prompts/pitfalls.tsv), the question, the choices one per line and an answer label; each choice
    is scored as a continuation (`choices.option_scores`, reduced per UTF-8 byte by default) and the best
    one is the answer. Method `likelihood`.
  - `generate` (`--protocol paper`): the released evaluation that produced the paper's Figs. 3, 5 and
    11–25 (eva.py -> utils/answers.py `simulate`): the generator answers the language's simulation
    instruction, the question and the choice list, without chain of thought (one instruction per language,
    all 17 target languages of the release and English; data/prompts/pitfalls_release.tsv), then the
    extractor (the release: gpt-4o-mini; `--extractor`, default the answering model, recorded in every row)
    picks the choice with the release's extraction prompt; exact match with the gold choice. Method
    `simulate-extract`. A language the release has no instruction for is an error.
  - `cot`: App. E's templates (zero-shot chain of thought, "Template for Answering ... Questions" in the
    question's language, English where App. E has none), then "Template for Extracting Answer". The paper
    text describes this; the released evaluation did not use it. Method `cot-extract`.
Rows, summary and run.json record the protocol and method.

**Metrics.** Accuracy per language × version (× category) with Wilson intervals; the drop English →
target on the same questions with a paired bootstrap interval; `en_only`, the share right in English and
wrong in the target language (the paper's cross-lingual weakness). `simulation_score` is the paper's V
(§2.3). `relative_affinity` is the Relative Affinity Score D of §3.3 on an accuracy matrix A[x, y]
(`affinity_accuracy`: accuracy on language x of the expanded pairs from seed language y, averaged over
models; `search.expand_pairs` makes those pairs).

**Runs** (`babelprobe bench pitfalls`, `run`) resume: likelihood scoring keeps chunks of questions beside
`items.csv` (`runs.score_resumably`); generated answers and extractions are kept in `generations.jsonl`.

**Modules**, each importing only those before it: `settings` (`Settings`, `PROTOCOLS`, `SearchSettings`;
light), `data` (reading and normalising the questions), `prompts` (prompt tables, templates, the
variants asked), `answers` (likelihood and chain-of-thought answers; the contract's `check`, `run`,
`answerer`), `summary` (metrics, V, the Relative Affinity Score, `summarize`, `wide`, `format_summary`),
`search` (the weakness search); this package holds the contract of `babelprobe.benchmarks.base` and
imports the steps when first used.
"""

from babelprobe.benchmarks.pitfalls.settings import (
    METHODS,
    NAME,
    PROTOCOLS,
    SEARCH_PROTOCOLS,
    TITLE,
    SearchSettings,
    Settings,
)
from babelprobe.lazy import lazy_exports

# the steps, for notebooks and tests: public name -> the module that defines it, imported when first used
_STEPS = {
    "load": "data", "load_pitfalls": "data", "resolve_source": "data", "available_languages": "data",
    "select_languages": "data", "check_record": "data", "normalise_side": "data", "unwrap_quotes": "data",
    "load_paper_results": "data", "BUNDLED": "data", "FIELDS": "data", "LABELS": "data", "KEPT": "data",
    "COUNTS": "data", "QUOTES": "data",
    "load_prompts": "prompts", "format_prompt": "prompts", "load_templates": "prompts", "template_for":
    "prompts", "format_choices": "prompts", "variant_rows": "prompts", "build_requests": "prompts",
    "TEMPLATE_FIELDS": "prompts", "VARIANTS": "prompts", "CARRIED": "prompts",
    "check": "answers", "run": "answers", "answerer": "answers", "score_pitfalls": "answers",
    "answer_cot": "answers", "answer_release": "answers", "ReleaseAnswerer": "answers", "parse_choice": "answers",
    "load_release": "prompts", "release_template": "prompts", "RELEASE_FIELDS": "prompts", "CHUNK_QUESTIONS": "answers",
    "summarize": "summary", "format_summary": "summary", "wide": "summary", "pitfalls_summary": "summary",
    "paired": "summary", "question_scores": "summary", "simulation_score": "summary", "affinity_accuracy":
    "summary", "relative_affinity": "summary", "load_counts": "summary", "CELL": "summary", "METRICS":
    "summary", "BOOTSTRAP": "summary", "C_AFFINITY": "summary",
}
__all__ = [
    # the benchmark contract (babelprobe/benchmarks/base.py)
    "NAME", "TITLE", "Settings", "PROTOCOLS", "load", "check", "run", "summarize", "format_summary",
    "answerer",
    # the steps, for notebooks and tests
    "METHODS", "SearchSettings", "SEARCH_PROTOCOLS", "RELEASE_FIELDS", "ReleaseAnswerer", "BOOTSTRAP", "BUNDLED", "CARRIED", "CELL", "CHUNK_QUESTIONS", "COUNTS",
    "C_AFFINITY", "FIELDS", "KEPT", "LABELS", "METRICS", "QUOTES", "TEMPLATE_FIELDS", "VARIANTS",
    "affinity_accuracy", "answer_cot", "answer_release", "available_languages", "build_requests", "check_record",
    "format_choices", "format_prompt", "load_counts", "load_paper_results", "load_pitfalls",
    "load_prompts", "load_release", "load_templates", "normalise_side", "paired", "parse_choice", "pitfalls_summary",
    "question_scores", "relative_affinity", "release_template", "resolve_source", "score_pitfalls", "select_languages",
    "simulation_score", "template_for", "unwrap_quotes", "variant_rows", "wide",
]
__getattr__, __dir__ = lazy_exports(__name__, _STEPS)
