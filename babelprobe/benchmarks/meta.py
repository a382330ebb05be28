"""Metalinguistic prompting (meta): ask the model which of two concepts has a property, and compare the
probabilities it gives the two answers.

For a pair (property, acceptable concept, unacceptable concept) in language L the prompt is L's
template from a prompt set:

    Which concept is most likely to have the following property: "can bark", "dog" or "cat"? Answer: "

Bundled sets (`PROMPT_SETS`): `xcomps` (default), the templates of XCOMPS Figure 8 character for
character, in English and the paper's 17 languages (data/prompts/xcomps_meta.tsv); `xcomps-babelprobe`,
babelprobe's own earlier wording of the same question (xcomps_meta_babelprobe.tsv; not the paper's
measure except in en, ru and uk). The paper does not say in which order the two concepts are listed,
nor whether the closing quote is scored; the choices below are babelprobe's (docs/fidelity.md).

**Answers.** Each concept is scored as a continuation of the prompt: its tokens' log-probabilities,
teacher-forced, boundary-safe (the token log-prob core with score_from = len(prompt)), reduced like
direct scores (sum by default). By default the closing quote is part of the answer (`dog"`): the
score is then that of the complete answer "dog", not of every answer that starts with "dog", so
"cat" and "caterpillar" compete as whole words. `close_quote=False` scores the bare word.

**Orders and the rule.** Both orders are asked: `gf` (the acceptable concept is {word1}, listed first)
and `bf` (the unacceptable one first). In each order d = score(good) − score(bad). A pair is `correct`
when its `margin` > 0, where the rule decides the margin:
    sum   (default) d_gf + d_bf   the acceptable concept wins over the two orders together;
    both  min(d_gf, d_bf)         it wins in both orders;
    first d_gf                    only the order with the acceptable concept first.
`score_good`/`score_bad` are each concept's score averaged over the orders the rule uses (gf only for
`first`), so correct == (score_good > score_bad) for sum and first; for both it is stricter.

**Position bias.** `first_won_gf`/`first_won_bf` say whether the first-listed concept won in each
order; `position_bias(results)` gives, per language, how often the first-listed option wins (0.5:
no bias, 1: always the first), the accuracy in each order and how often both orders agree.

**Output.** One row per pair with docs/design.md's per-pair columns and `method="meta"`, so it joins with
direct's rows on `pair_id`. For meta, `text_good`/`text_bad` are the two concept words (the answers,
without quotes). Also: the four per-order scores, margin, first_won_*, consistent, token counts,
spans_join/truncated flags, the two prompts as asked, rule, reduction, close_quote, prompt_format
("plain" or "chat"), prompt_set, prompt_language, bos_policy, model and fingerprint.

**Speed.** The four texts of a pair are two prompts with two answers each; `shared_prefix_logprobs`
runs each prompt once and both answers from its KV cache, and only the states that predict answer
tokens go through the vocabulary projection (`perf/compare_speed.py` measures it against the naive
way). `share_prefix=False` uses the plain core instead (same numbers, for checking).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.benchmarks.core.logprobs import REDUCTIONS, reduce
from babelprobe.errors import BabelprobeError
from babelprobe.items import load_items, to_pairs
from babelprobe.models import LoadedModel
from babelprobe.prompts import check_placeholders, read_prompts
from babelprobe.runtime import Runtime

RULES = ("sum", "both", "first")
ORDERS = ("gf", "bf")  # acceptable ("good") concept listed first, unacceptable ("bad") first
PLACEHOLDERS = ("property", "word1", "word2")
# Pairs per scoring chunk with prefix trees on an accelerator (`MetaScorer.chunk_pairs`): each tree level is a
# few forward passes however many texts it holds, so a chunk of twice the pairs (its tree within
# `prefix.CHUNK_KV_BYTES`) runs fewer passes per pair: 9,180 XCOMPS-sized pairs at the 8B shape, planned as on a
# GPU, took 140 passes of 332k padded new tokens in chunks of 2,000 and 103 of 312k in chunks of 4,000
# (perf/README.md "Meta's trees of 4,000 pairs").
TREE_CHUNK_PAIRS = 4000
PROMPT_SETS = {"xcomps": "xcomps_meta", "xcomps-babelprobe": "xcomps_meta_babelprobe"}  # name -> data/prompts file
CONCEPT_FIELDS = ("property", "acceptable_concept", "unacceptable_concept")


# ------------------------------------------------------------------------------------------- prompts

@dataclass(frozen=True)
class MetaPrompt:
    """One language's template: the whole plain prompt, its answer prefix (its end) and the answer's
    closing delimiter."""

    language: str
    template: str
    answer: str
    close: str

    @property
    def question(self) -> str:
        """The template without its answer prefix: the user turn of the chat variant."""
        return self.template[: len(self.template) - len(self.answer)].rstrip()

    def plain(self, prop: str, word1: str, word2: str) -> str:
        return self.template.format(property=prop, word1=word1, word2=word2)

    def chat(self, tokenizer, prop: str, word1: str, word2: str, chat_template: str | None = None,
             strip_bos: bool = True) -> str:
        """The question as the user turn and the answer prefix as the start of the assistant turn,
        rendered by the tokenizer's chat template (or `chat_template`). A BOS the template writes
        first is dropped when `strip_bos`, because encoding puts BOS first anyway."""
        messages = [{"role": "user", "content": self.question.format(property=prop, word1=word1, word2=word2)},
                    {"role": "assistant", "content": self.answer}]
        text = tokenizer.apply_chat_template(messages, chat_template=chat_template, tokenize=False,
                                             continue_final_message=True)
        bos = getattr(tokenizer, "bos_token", None)
        if strip_bos and bos and text.startswith(bos):
            text = text[len(bos):]
        return text


def load_prompts(source: str | Path = "xcomps") -> dict[str, MetaPrompt]:
    """A prompt set: a bundled name (`PROMPT_SETS`: `xcomps`, `xcomps-babelprobe`) or a prompt file
    (`prompts.read_prompts` format) with columns language, template, answer, close (see
    data/prompts/README.md). Every template is checked: the three placeholders exactly once, nothing
    else in braces, and it ends with its answer prefix."""
    rows = read_prompts(PROMPT_SETS.get(str(source), source), ("language", "template", "answer", "close"))
    prompts = {}
    for row in rows.to_dict("records"):
        prompt = MetaPrompt(row["language"], row["template"], row["answer"], row["close"])
        where = f"{row['line']}: template of {prompt.language!r}"
        check_placeholders(prompt.template, where, PLACEHOLDERS)
        if not prompt.template.endswith(prompt.answer):
            raise BabelprobeError(f"{where}: the answer prefix {prompt.answer!r} must be the end of its template")
        prompts[prompt.language] = prompt
    return prompts


def prompts_for(languages: list[str], source: str | Path = "xcomps") -> dict[str, MetaPrompt]:
    """The templates for `languages`; a language without one is an error listing those available."""
    prompts = load_prompts(source)
    missing = sorted(set(languages) - set(prompts))
    if missing:
        raise BabelprobeError(f"no meta prompt for language {', '.join(missing)} in prompt set {source}; "
                              f"available: {', '.join(sorted(prompts))} (ask in one of them with "
                              "--prompt-language, or pass --prompts FILE.tsv with your own templates)")
    return {lang: prompts[lang] for lang in languages}


def prompts_digest(source: str | Path = "xcomps", languages: list[str] | None = None) -> str:
    """A short hash of the templates (all fields) of `languages` (default: all) in a prompt set, recorded
    with results so that results made with other wording are not reused when a set's file changes. A
    language without a template is an error, as in `prompts_for`."""
    import hashlib
    import json

    prompts = load_prompts(source) if languages is None else prompts_for(sorted(set(languages)), source)
    payload = json.dumps([[p.language, p.template, p.answer, p.close] for _, p in sorted(prompts.items())],
                         ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------------------------- rules

def margins(d_gf: np.ndarray, d_bf: np.ndarray, rule: str) -> np.ndarray:
    """The quantity a rule thresholds at 0 (module docstring), from the per-order differences
    d = score(good) − score(bad)."""
    d_gf, d_bf = np.asarray(d_gf, float), np.asarray(d_bf, float)
    if rule == "sum":
        return d_gf + d_bf
    if rule == "both":
        return np.minimum(d_gf, d_bf)
    if rule == "first":
        return d_gf
    raise BabelprobeError(f"unknown rule {rule!r}; use one of {', '.join(RULES)}")


def position_bias(results: pd.DataFrame, by: str | list[str] | None = "language") -> pd.DataFrame:
    """Per group (default: language; None: everything): `n` pairs, `first_rate` (share of the 2n
    answers where the first-listed concept won; 0.5 = no bias) with a 95% Wilson interval over those
    answers, accuracy in each order (`accuracy_gf`, `accuracy_bf`) and `consistent` (the same concept
    won in both orders)."""
    from babelprobe.stats import wilson

    by = [by] if isinstance(by, str) else list(by or [])
    grouped = results.groupby(by, sort=True) if by else [((), results)]
    rows = []
    for key, group in grouped:
        firsts = int(group["first_won_gf"].sum() + group["first_won_bf"].sum())
        answers = 2 * len(group)
        low, high = wilson(np.array([firsts]), np.array([answers]))
        rows.append({**dict(zip(by, key if isinstance(key, tuple) else (key,))), "n": len(group),
                     "first_rate": firsts / answers, "first_ci_low": low[0], "first_ci_high": high[0],
                     "accuracy_gf": float((group["score_good_gf"] > group["score_bad_gf"]).mean()),
                     "accuracy_bf": float((group["score_good_bf"] > group["score_bad_bf"]).mean()),
                     "consistent": float(group["consistent"].mean())})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------- items

def meta_pairs(items: pd.DataFrame) -> pd.DataFrame:
    """One row per pair with the fields the prompt needs (property and both concept words); a missing
    or empty one is an error naming the field (and the pair)."""
    pairs = to_pairs(items)
    for field in CONCEPT_FIELDS:
        if field not in pairs.columns:
            missing = ", ".join(f for f in CONCEPT_FIELDS if f not in pairs.columns)
            raise BabelprobeError(f"the items have no {field!r} field, which the meta prompt needs (missing: "
                                  f"{missing}); add to every pair's record, in the items' language, 'property' "
                                  "(the property phrase without final punctuation, e.g. can bark) and "
                                  "'acceptable_concept'/'unacceptable_concept' (the two concept words, e.g. dog, "
                                  "cat); records with only the two sentences (acceptable_sent/unacceptable_sent, "
                                  "as on the XCOMPS hub) can be scored with score direct")
        empty = pairs[field].isna() | (pairs[field].astype(str).str.strip() == "")
        if empty.any():
            raise BabelprobeError(f"pair {pairs.loc[empty, 'pair_id'].iloc[0]!r} has an empty {field!r}, "
                                  "which the meta prompt needs")
        pairs[field] = pairs[field].astype(str)
    return pairs


def meta_requests(items: pd.DataFrame, prompts: str | Path = "xcomps", prompt_language: str | None = None):
    """Check that `items` can be asked (concept fields, a template per language) before any model work:
    the pairs, the language each pair is asked in, and the templates."""
    pairs = meta_pairs(items)
    asked = [prompt_language] * len(pairs) if prompt_language else pairs["language"].tolist()
    return pairs, asked, prompts_for(sorted(set(asked)), prompts)


def prompt_texts(pairs: pd.DataFrame, prompts: dict[str, MetaPrompt], languages: list[str],
                 close_quote: bool, render) -> tuple[list[str], list[int], list[str]]:
    """The four scored texts of each pair, in the order (gf good, gf bad, bf good, bf bad): prompt +
    concept (+ closing quote), the character where the answer starts, and the answer span."""
    texts, starts, spans = [], [], []
    for prop, good, bad, lang in zip(pairs["property"], pairs["acceptable_concept"],
                                     pairs["unacceptable_concept"], languages):
        template = prompts[lang]
        end = template.close if close_quote else ""
        for word1, word2 in ((good, bad), (bad, good)):
            prompt = render(template, prop, word1, word2)
            for word in (good, bad):
                texts.append(prompt + word + end)
                starts.append(len(prompt))
                spans.append(word + end)
    return texts, starts, spans


# ------------------------------------------------------------------------------------------- scoring

def score_meta(model: LoadedModel | str, items: pd.DataFrame | str, rule: str = "sum", reduction: str = "sum",
               close_quote: bool = True, chat_template: bool | str = False, prompts: str | Path = "xcomps",
               prompt_language: str | None = None, share_prefix: bool = True, limit: int | None = None,
               languages: list[str] | None = None, batch_tokens: int = 4096, padding_side: str = "right",
               truncate: bool = False, progress: bool = True) -> pd.DataFrame:
    """Score every pair of `items` by asking the model which concept has the property (module docstring).

    chat_template: False (plain prompt), True (the tokenizer's chat template) or a Jinja template
    (text, or the path of a file holding it). prompt_language: ask every item in this language's
    template instead of its own. padding_side only matters with share_prefix=False."""
    if rule not in RULES:
        raise BabelprobeError(f"unknown rule {rule!r}; use one of {', '.join(RULES)}")
    if reduction not in REDUCTIONS:
        raise BabelprobeError(f"unknown reduction {reduction!r}; use one of {', '.join(REDUCTIONS)}")
    items = load_items(items, languages=languages, limit=limit)
    meta_requests(items, prompts, prompt_language)  # fields and templates: before the model
    lm = Runtime(model=model).lm  # a spec through the one door, a loaded model as it is
    scorer = MetaScorer(lm, rule, reduction, close_quote, chat_template, prompts, prompt_language, share_prefix,
                        batch_tokens, padding_side, truncate)
    return scorer.finish(scorer.run(scorer.prepare(items), progress=progress))


@dataclass
class MetaScorer:
    """Meta scoring in the three steps of `pipeline.pipelined`: `prepare(items)` (host: prompts, tokens,
    prefix trees, padded batches), `run(prepared)` (the device; results stay there) and `finish(ran)` (host:
    one read back, the per-pair table); calling it does all three. Arguments as `score_meta`'s."""

    lm: LoadedModel
    rule: str = "sum"
    reduction: str = "sum"
    close_quote: bool = True
    chat_template: bool | str = False
    prompts: str | Path = "xcomps"
    prompt_language: str | None = None
    share_prefix: bool = True
    batch_tokens: int = 4096
    padding_side: str = "right"
    truncate: bool = False

    def __call__(self, items: pd.DataFrame) -> pd.DataFrame:
        return self.finish(self.run(self.prepare(items)))

    @property
    def chunk_pairs(self) -> int | None:
        """Pairs per chunk of `runs.score_resumably`: `TREE_CHUNK_PAIRS` for prefix trees on an accelerator,
        else None (the runs' default)."""
        from babelprobe.benchmarks.core.prefix import past_budget

        return TREE_CHUNK_PAIRS if self.share_prefix and past_budget(self.lm.device) is not None else None

    def prepare(self, items: pd.DataFrame):
        from babelprobe.benchmarks.core.logprobs import plan_logprobs
        from babelprobe.benchmarks.core.prefix import plan_prefix

        pairs, asked, templates = meta_requests(items, self.prompts, self.prompt_language)
        render, prompt_format = _renderer(self.lm, self.chat_template)
        texts, starts, spans = prompt_texts(pairs, templates, asked, self.close_quote, render)
        names = [f"{pid} ({order} {side})" for pid in pairs["pair_id"] for order in ORDERS for side in ("good", "bad")]
        if self.share_prefix:
            plan = plan_prefix(self.lm, texts, starts, names=names, batch_tokens=self.batch_tokens, truncate=self.truncate)
        else:
            plan = plan_logprobs(self.lm, texts, starts, names=names, batch_tokens=self.batch_tokens,
                                 padding_side=self.padding_side, truncate=self.truncate)
        return pairs, asked, prompt_format, texts, starts, spans, plan

    def run(self, prepared, progress: bool = False):
        from babelprobe.benchmarks.core.logprobs import run_logprobs
        from babelprobe.benchmarks.core.prefix import run_prefix

        plan = prepared[-1]
        launch = run_prefix if self.share_prefix else run_logprobs
        return prepared, launch(self.lm, plan, progress=progress)

    def finish(self, ran) -> pd.DataFrame:
        (pairs, asked, prompt_format, texts, starts, spans, plan), readback = ran
        scored = plan.collect(readback.wait())
        # An answer cut off by --truncate has no scored token: its score is missing (NaN), not log 1 = 0.
        scores = np.array([reduce(s, span, self.reduction) if s.n_tokens else np.nan
                           for s, span in zip(scored, spans)]).reshape(-1, 4)
        out = pairs.drop(columns=[c for c in pairs.columns if c.startswith(("item_id_", "prefix_", "continuation_",
                                                                            "text_"))])
        out.insert(3, "method", "meta")
        out["text_good"], out["text_bad"] = pairs["acceptable_concept"], pairs["unacceptable_concept"]
        lm = self.lm
        return _decide(out, scores, self.rule).assign(
            **_details(scored, texts, starts), rule=self.rule, reduction=self.reduction,
            close_quote=self.close_quote, prompt_format=prompt_format, prompt_set=str(self.prompts),
            prompt_language=asked, bos_policy=lm.bos_policy, model=lm.name, fingerprint=lm.fingerprint)


def _decide(out: pd.DataFrame, scores: np.ndarray, rule: str) -> pd.DataFrame:
    """Per-order scores, the rule's margin and verdict, and the position-bias flags."""
    good_gf, bad_gf, good_bf, bad_bf = scores.T
    d_gf, d_bf = good_gf - bad_gf, good_bf - bad_bf
    used = slice(0, 1) if rule == "first" else slice(0, 2)
    out["score_good"] = np.stack([good_gf, good_bf], axis=1)[:, used].mean(axis=1)
    out["score_bad"] = np.stack([bad_gf, bad_bf], axis=1)[:, used].mean(axis=1)
    out["margin"] = margins(d_gf, d_bf, rule)
    out["correct"] = out["margin"] > 0
    out["score_good_gf"], out["score_bad_gf"] = good_gf, bad_gf
    out["score_good_bf"], out["score_bad_bf"] = good_bf, bad_bf
    out["first_won_gf"] = d_gf > 0  # the acceptable concept is listed first in gf
    out["first_won_bf"] = d_bf < 0  # the unacceptable concept is listed first in bf
    out["consistent"] = np.sign(d_gf) * np.sign(d_bf) > 0
    return out


def _details(scored: list, texts: list[str], starts: list[int]) -> dict:
    """Token counts (from the gf order), boundary and truncation flags, and the two prompts as asked."""
    def per_pair(values):
        return np.array(values, dtype=object).reshape(-1, 4)

    counts = per_pair([s.n_tokens for s in scored])
    prompts = per_pair([t[:s] for t, s in zip(texts, starts)])
    return {"n_tokens_good": counts[:, 0].astype(int), "n_tokens_bad": counts[:, 1].astype(int),
            "spans_join": per_pair([s.spans_join for s in scored]).any(axis=1).astype(bool),
            "truncated": per_pair([s.truncated for s in scored]).any(axis=1).astype(bool),
            "prompt_gf": prompts[:, 0], "prompt_bf": prompts[:, 2]}


def _renderer(lm: LoadedModel, chat_template: bool | str):
    """How a template becomes the text fed to the model, and its name for the `prompt_format` column."""
    if chat_template is False or chat_template is None:
        return (lambda t, p, w1, w2: t.plain(p, w1, w2)), "plain"
    jinja = None
    if isinstance(chat_template, str):
        jinja = chat_template
        if "{%" not in chat_template and "{{" not in chat_template:
            path = Path(chat_template).expanduser()
            if not path.is_file():
                raise BabelprobeError(f"chat template file {chat_template} does not exist")
            jinja = path.read_text(encoding="utf-8")
    elif not getattr(lm.tokenizer, "chat_template", None):
        raise BabelprobeError(f"model {lm.name} has no chat template (a base model?); drop --chat-template, "
                              "or give one with --chat-template-file FILE.jinja")
    strip_bos = lm.bos_policy == "bos"

    def render(template: MetaPrompt, prop: str, word1: str, word2: str) -> str:
        try:
            return template.chat(lm.tokenizer, prop, word1, word2, chat_template=jinja, strip_bos=strip_bos)
        except Exception as err:  # jinja syntax errors, templates that reject the roles: user-facing
            raise BabelprobeError(f"cannot render the chat template: {str(err).splitlines()[0]}") from err

    return render, "chat"
