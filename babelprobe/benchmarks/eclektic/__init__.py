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
or a local model through its chat template: `--chat-template on`, or `auto` when it has one) and the `qa` frame to models that only continue text (a base
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

**Modules**, each importing only those before it: `settings` (`Settings`, `PROTOCOLS`; light), `data`
(reading the records), `prompts` (the closed-book prompts and which set a run uses), `answers` (answering,
the judges; the contract's `check`, `run`, `answerer`), `summary` (metrics, `summarize`, matrices,
`format_summary`); this package holds the contract of `babelprobe.benchmarks.base` and imports the steps
when first used.
"""

from babelprobe.benchmarks.eclektic.settings import NAME, PROMPT_SETS, PROTOCOLS, TITLE, Settings
from babelprobe.lazy import lazy_exports

# the steps, for notebooks and tests: public name -> the module that defines it, imported when first used
_STEPS = {
    "load": "data", "load_eclektic": "data", "BUNDLED": "data", "HUB_FILE": "data",
    "prompt_templates": "prompts", "closed_book_prompts": "prompts", "chat_answerer": "prompts",
    "condition": "prompts", "first_line": "prompts", "PROMPT_FILE": "prompts", "FILLED_FROM": "prompts",
    "check": "answers", "run": "answers", "answerer": "answers", "answer_questions": "answers",
    "answering_generator": "answers", "run_eclektic": "answers", "normalize_answer": "answers",
    "answer_found": "answers", "word_recall": "answers", "judge_match": "answers", "judge_template": "answers",
    "judge_prompts": "answers", "judge_llm": "answers", "check_contexts": "answers",
    "summarize": "summary", "format_summary": "summary", "eclektic_summary": "summary",
    "transfer_pairs": "summary", "transfer_matrices": "summary", "macro_margins": "summary",
    "macro_proportion": "summary", "wald": "summary", "run_info": "summary",
}
__all__ = [
    # the benchmark contract (babelprobe/benchmarks/base.py)
    "NAME", "TITLE", "Settings", "PROTOCOLS", "load", "check", "run", "summarize", "format_summary",
    "answerer",
    # the steps, for notebooks and tests
    "PROMPT_SETS", "BUNDLED", "FILLED_FROM", "HUB_FILE", "PROMPT_FILE", "answer_found",
    "answer_questions", "answering_generator", "chat_answerer", "check_contexts", "closed_book_prompts",
    "condition", "eclektic_summary", "first_line", "judge_llm", "judge_match", "judge_prompts",
    "judge_template", "load_eclektic", "macro_margins", "macro_proportion", "normalize_answer",
    "prompt_templates", "run_eclektic", "run_info", "transfer_matrices", "transfer_pairs", "wald",
    "word_recall",
]
__getattr__, __dir__ = lazy_exports(__name__, _STEPS)
