"""StingrayBench (Cahyawijaya et al., Findings of NAACL 2025): can a model tell which language's sense
of a false friend fits a sentence, and does it lean towards one language of the pair?

**Data.** `load_stingray(source)` reads StingrayBench in the forms it is published in: the hub
configs (`StingrayBench/StingrayBench`: `en_de`, `id_ms`, `id_tl`, `zh_ja` with false friends and
`<pair>_common` with true cognates; fields `word`, `lang1_sentence`, ...) from the hub when online
(`hf:StingrayBench/StingrayBench`) or from local .jsonl/.json/.csv/.parquet files named after their
config; the raw CSVs of the hub repository's `data/` directory (`en_de.csv`, `en_de_common_words.csv`,
... with columns `Cognates` or `Cognates_L1`/`Cognates_L2`, `L1`, `L2`, `Meaning in L1`, `Meaning in
L2`, the semantic-appropriateness column and two `Is the usage ...` columns; docs/datasets.md); and
the bundled `stingray-sample` (our own sentences, en_de and zh_ja). One row per entry: the same
sentence in L1 and L2 using the word; for a false friend exactly one is appropriate (A = L1, B = L2),
for a true cognate both (C). A record that cannot be scored (a sentence or the word missing, an
answer that is not Yes/No, a label that contradicts its subset) is counted, reported on stderr and
in the summary (`records_skipped`), listed in the run's `skipped_records.csv`, and skipped.

**Tasks** (§3.2; prompts in data/prompts/stingray.tsv, the released code's): semantic appropriateness
(A/B/C) and usage correction (Yes/No, once per language).

**Answers** (§4.3; `Settings.answer`). `likelihood` (the released `likelihood_eval.py`): the label
with the highest log-probability after the prompt; plain text ends with "\\nAnswer:" and the labels
" A", " B", " C" / " Yes", " No" follow it. `generate` (rows: method `generation`): a generator
(`--generator local` or an OpenAI-compatible endpoint) answers the bare prompt (`max_new_tokens`, 3 in
the released code) and `parse_answer` applies the paper's post-processing ("A and B" -> C, §4.3; rules
in its docstring); an unreadable answer counts as wrong. `chat_template` wraps the prompt in the model's
chat template as the user turn (§4.3: "each of the corresponding chat formats"); `auto` does so when
the model has one. `PROTOCOLS["paper"]` = likelihood, chat template `auto`, the released prompts, summed
label log-probs; `PROTOCOLS["paper-generation"]` = the paper's robustness check: the same answered by
generation (at most 3 new tokens). The old spellings `--inference generation` and `--chat` still work.

**Metrics** (§3.3; per language pair × subset × task): accuracy in L1 and in L2. Usage: the questions
about that language's sentence. Semantic, false friends: the entries whose appropriate sentence is in
that language. Semantic, true cognates (both sentences appropriate; not defined in the paper, ours):
an answer is right in L1 when it names the L1 sentence (A or C) and right in L2 when it names the L2
sentence (B or C). The point (acc L1, acc L2) gives
    cognate bias          = (atan2(acc L2, acc L1) − π/4) / (π/4)   ∈ [−1, 1], −1 = all towards L1;
    cognate comprehension = √(acc L1² + acc L2²) / √2              ∈ [0, 1].
The paper's aggregates: task `mean` (per pair × subset, Figs. 5 and 6): comprehension and bias averaged
over the tasks, `abs_bias` = |mean bias| (Fig. 6 drops the sign); pair `all`, task `all` (per subset,
Fig. 4): the mean of the (acc L1, acc L2) points over pairs × tasks and its bias and comprehension.
Intervals: Wilson for accuracies, percentile bootstrap over records (resampled within each cell) for
everything else.

**Rows**: one per question, with `pair_id` (the entry), `language` (ISO code of the language asked
about; `l1-l2` for the semantic question on a true cognate), `subset`, `method` (likelihood /
generation), `task`, `side` (L1/L2/both), `prompt` (the text the model saw), `gold`, `predicted`,
`correct`, label `scores` (likelihood) or `response` and `valid` (generation), `protocol`,
`prompt_format` (plain/chat), and `records_read`/`records_skipped` of the entry's config.

**Figures** (`analysis.benchmarks.plot_stingray`): the stingray plot per task, Fig. 4 and Figs. 5–6.

**Modules**, each importing only those before it: `settings` (`Settings`, `PROTOCOLS`; light), `data`
(reading and normalising the records), `prompts` (the prompt file, requests, the chat template),
`answers` (likelihood and generated answers; the contract's `check`, `run`, `answerer`), `summary`
(metrics, `summarize`, `wide`, `format_summary`); this package holds the contract of
`babelprobe.benchmarks.base` and imports the steps when first used.
"""

from babelprobe.benchmarks.stingray.settings import ANSWERS, NAME, PROTOCOLS, TASKS, TITLE, Settings
from babelprobe.lazy import lazy_exports

# the steps, for notebooks and tests: public name -> the module that defines it, imported when first used
_STEPS = {
    "load": "data", "load_stingray": "data", "report_skipped": "data", "BUNDLED": "data", "HUB_ID": "data",
    "PAIRS": "data", "SUBSETS": "data",
    "load_prompts": "prompts", "build_requests": "prompts", "chat_renderer": "prompts", "PROMPT_KEYS": "prompts",
    "check": "answers", "run": "answers", "answerer": "answers", "score_stingray": "answers",
    "generate_stingray": "answers", "parse_answer": "answers", "SKIPPED": "answers",
    "summarize": "summary", "format_summary": "summary", "wide": "summary", "stingray_summary": "summary",
    "cognate_bias": "summary", "cognate_comprehension": "summary", "per_language": "summary", "CELL": "summary",
    "BOOTSTRAP": "summary",
}
__all__ = [
    # the benchmark contract (babelprobe/benchmarks/base.py)
    "NAME", "TITLE", "Settings", "PROTOCOLS", "load", "check", "run", "summarize", "format_summary",
    "answerer",
    # the steps, for notebooks and tests
    "ANSWERS", "TASKS", "BOOTSTRAP", "BUNDLED", "CELL", "HUB_ID", "PAIRS", "PROMPT_KEYS", "SKIPPED",
    "SUBSETS", "build_requests", "chat_renderer", "cognate_bias", "cognate_comprehension",
    "generate_stingray", "load_prompts", "load_stingray", "parse_answer", "per_language",
    "report_skipped", "score_stingray", "stingray_summary", "wide",
]
__getattr__, __dir__ = lazy_exports(__name__, _STEPS)
