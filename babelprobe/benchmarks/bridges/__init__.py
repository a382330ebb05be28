"""Benchmark bridges: MultiBLiMP, Belebele, XNLI and PAWS-X read from their releases, turned into babelprobe
items and scored as lm-evaluation-harness scores a multiple-choice task, so the same data can then be
probed (`compare`, `probe`, `lens`, `align`, `intervene` take the converted items).

Each bridge is a benchmark under the contract of `benchmarks.base` (`bridges.multiblimp`, `.belebele`,
`.xnli`, `.pawsx`: the release's layout, its template and its `Release`); this module is what they share.
`bridges.lmeval` (`bench lm-eval`) is the same path for any lm-evaluation-harness multiple-choice task, its
items made by the harness's own task objects (`babelprobe.lmeval`): the four hand-written bridges are presets of
it, their releases read into the same questions (`babelprobe.questions.options` makes the items of both).
References: lm-evaluation-harness 0.4.13 (`lm_eval/api/task.py` `construct_requests` and
`process_results`, `lm_eval/api/model.py` `loglikelihood` and `_encode_pair`).

**Items** (`babelprobe.questions`). One item per answer option: `pair_id` names the question, `label` is 1
for the gold option and 0 for the others, `prefix` is the question's context and `continuation` the target
delimiter and the option (`text` = prefix + continuation; MultiBLiMP splits its sentences at the release's own
`prefix` column instead, for `--conditional`). The fields `context`, `delimiter`, `choice`, `target` (what
follows the delimiter: the choice, or a harness multiple-input task's shared target), `option` (its index),
`gold` (the gold option's index), `n_options`, `config` (the release's config), `script` and `template_note`
keep what scoring needs; Belebele's `parallel_id` names one question across its language variants.

**Scoring**, as the harness does it:
  LL_i = Σ log p(delimiter + choice_i | context), every token of the continuation teacher-forced; a
  context's trailing whitespace moves to the continuation, the continuation's tokens are those of the
  whole text after the context's own tokens, and an empty context means the continuation given BOS (EOS
  where the tokenizer has no BOS). babelprobe's token log-prob core computes it, each context once for
  all its options where it is most of what they run (`shared_prefix_logprobs`: a KV cache; `scored_requests`).
  acc       = [argmax_i LL_i = gold]
  acc_norm  = [argmax_i LL_i / len(choice_i) = gold]         Unicode characters, delimiter excluded
  acc_bytes = [argmax_i LL_i / bytes(choice_i) = gold]       UTF-8 bytes
  `np.argmax` takes the first of tied options; `correct` (babelprobe's) asks the gold option to be strictly
  highest, under `--reduction` (sum, the harness's and the MultiBLiMP authors'; or mean per token).
  One difference by design: babelprobe conditions every text on BOS (docs/design.md "Results"), the
  harness a non-empty context only where its tokenizer adds BOS itself (Gemma and Llama do, GPT-2 does not).

**Rows** (items.csv), one per question: `pair_id, language, subset, ll_0..ll_{k-1}, gold, pred, pred_norm,
pred_bytes, acc, acc_norm, acc_bytes, correct` and `n_tokens_i`, `script`, `config`, `method`, `reduction`,
the records read and skipped per language. **Summary** per language × subset (and language × `all`):
acc, acc_norm, acc_bytes and correct (Wilson intervals), `norm_gap` = acc_norm − acc_bytes (paired
bootstrap over questions), `norm_disagree` (share of questions where the two normalisations pick
different options) and `records_skipped`.

Records that cannot be scored (an empty sentence, passage or question) are skipped, counted and reported
on stderr, in `data.attrs` and in the summary; a missing column or a Belebele `correct_answer_num`
outside 1–4 is an error naming the file and line.
"""

from babelprobe.benchmarks.bridges.settings import (  # noqa: F401
    BRIDGES,
    HARNESS_SCORED,
    REDUCTIONS,
    Release,
    Settings,
    answerer,
)


def __getattr__(name: str):
    """The shared steps (`core`: load, run, summarize, wide, convert, ...) imported when first used."""
    import importlib

    try:
        value = getattr(importlib.import_module(f"{__name__}.core"), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value
