"""Multilingual self-consistency (Ohmer, Bruni & Hupkes 2023, "Evaluating task understanding through
multilingual consistency: A ChatGPT case study"): does a model give the same answer to a task when it
reads the task in another language, translated by itself?

**Task and data.** A classification task (PAWS-X paraphrase identification, XNLI inference) is an
instruction around two input texts. Task definitions (input fields, labels, label words per language)
are in data/prompts/consistency.json; the prompts are prompt files: `consistency_instructions.tsv`
(App. B, Table 6: instruction prefix, the word for "sentence", suffix, per task and language) and
`consistency_prompts.tsv` (the App. B task template, App. C's translation prompts, babelprobe's
one-shot translation and paraphrase prompts and answer cues). Data: the bundled samples, babelprobe's
item records, or PAWS-X and XNLI as released (`read_source`, docs/datasets.md): PAWS-X
`x-final/<lang>/test_2k.tsv` and the hub export (`id, sentence1, sentence2, label`); XNLI
`XNLI-1.0/xnli.test.tsv|jsonl` (`gold_label`, `sentence1/2`, `language`, `pairID`) and the hub
per-language export (`premise, hypothesis, label`). A file that does not say its language gets it from
its folder (`de/…`) or `--language`. Rows of other languages with the same id are reference
translations (`{field}_{L}`). Records that cannot be scored (an empty text, an unknown label) are
skipped, counted per language and reason, and kept in the rows as condition `skipped`.

**Senses** (§3.3). The model (a `Generator`) translates, in separate requests, the instruction prefix,
the word for "sentence", the suffix (recomposed by the task template) and each input text. Conditions,
for each target language L:
    orig   instruction and input in the source language (the reference answers);
    T      both translated by the model into L (Table 1, column T);
    I      only the instruction translated (column I);
    X      only the input translated (column X);
    R      instruction translated, input = the reference translation (babelprobe's addition: it
           separates the model's translation errors from its language-dependent task understanding);
    P      instruction and input paraphrased by the model in the source language (babelprobe's
           paraphrase baseline, not in the paper);
    rerun  the orig prompts answered by a second sampled run (Table 5's run-to-run baseline; needs
           generated answers at a temperature above 0).
The answer is given in the instruction's language.

**Protocols.** `default` suits small local base models: likelihood answers (each label's words scored
as continuations of the task prompt plus an answer cue), babelprobe's one-shot translation prompt,
greedy decoding, the first line of every output, the paraphrase baseline. `paper` (`--protocol paper`)
is §3.1-§3.3: generated answers to the bare App. B prompt, App. C translation prompts, temperature 0.25,
at most 256 tokens per answer and 2048 per translation, whole outputs, the rerun baseline.

**Answers.** A generated response is valid when it matches a label word or contains it, ignoring case
(§3.2): `map_answer` takes the label word it matches or starts with, else the one label whose words
it contains; a response with none or with words of several labels is invalid (-1), a label of its own
as in the paper (footnote 3). Translations keep what is inside one pair of surrounding quotes.

**Metrics.** Accuracy per condition; consistency = share of items answered as in orig, overall and
among items orig got right / wrong (Table 5); App. D: consistency among items whose input translation
has BLEU >= 50, and their share. Translation quality of the model's input translations against the
references (§4.3, Table 2): corpus BLEU (sacrebleu, Chinese tokenizer for zh) and chrF, ROUGE-1/2/L
(`rouge-score`, mean sentence F-measure), COMET-22 with `--comet` (optional extra); per item BLEU and
chrF (mean over the two texts) and their Pearson correlation with consistency (Table 3). Intervals:
Wilson per language; a bootstrap over items where languages are pooled. Small models often return
degenerate senses (empty, a copy of the source, the prompt's example); their share is in the summary
(`sense_*`) and each row says what its instruction and input were (`*_status`).

**Modules**, each importing only those before it: `settings` (`Settings`, the paper preset; light),
`task` (task definitions and prompt files), `data` (reading the data: the contract's `load`, and
`prepare` with the settings), `answers` (senses, condition prompts, answers), `quality` (translation
quality), `summary` (metrics, `summarize`, `format_summary`), `contract` (the contract's `check`, `run`,
`answerer`); this package holds the contract of `babelprobe.benchmarks.base` and imports the steps when
first used.
"""

from babelprobe.benchmarks.consistency.settings import COMET_MODEL, NAME, PROTOCOLS, TITLE, Settings
from babelprobe.lazy import lazy_exports

# the steps, for notebooks and tests: public name -> the module that defines it, imported when first used
_STEPS = {
    "PARTS": "task", "Prompts": "task", "Task": "task", "get_task": "task", "load_prompts": "task",
    "load_spec": "task",
    "load": "data", "prepare": "data", "Data": "data", "Records": "data", "load_consistency": "data",
    "read_source": "data", "reference_languages": "data",
    "CONDITIONS": "answers", "SENSES": "answers", "answer_generate": "answers", "answer_likelihood":
    "answers", "condition_requests": "answers", "make_senses": "answers", "map_answer": "answers",
    "sense_requests": "answers", "unquote": "answers",
    "corpus_translation_quality": "quality", "item_translation_quality": "quality", "rouge_scores":
    "quality", "with_comet": "quality",
    "summarize": "summary", "format_summary": "summary", "LEGEND": "summary", "BLEU_HIGH": "summary",
    "consistency_summary": "summary", "with_consistency": "summary",
    "check": "contract", "run": "contract", "answerer": "contract", "check_settings": "contract",
    "run_consistency": "contract",
}
__all__ = [
    # the benchmark contract (babelprobe/benchmarks/base.py)
    "NAME", "TITLE", "Settings", "PROTOCOLS", "load", "prepare", "check", "run", "summarize",
    "format_summary", "answerer",
    # the steps, for notebooks and tests
    "COMET_MODEL", "BLEU_HIGH", "CONDITIONS", "Data", "LEGEND", "PARTS", "Prompts", "Records", "SENSES",
    "Task", "answer_generate", "answer_likelihood", "check_settings", "condition_requests",
    "consistency_summary", "corpus_translation_quality", "get_task", "item_translation_quality",
    "load_consistency", "load_prompts", "load_spec", "make_senses", "map_answer", "read_source",
    "reference_languages", "rouge_scores", "run_consistency", "sense_requests", "unquote", "with_comet",
    "with_consistency",
]
__getattr__, __dir__ = lazy_exports(__name__, _STEPS)
