"""Direct scoring: compare a model's own probabilities of the two sentences of each minimal pair.

`score_direct(model, items)` returns one row per pair (docs/design.md "Results"): `score_good` and
`score_bad` are, by default, the sum of the log-probabilities of every token of the text, each
conditioned on BOS and the tokens before it; a pair is `correct` when the acceptable sentence scores
strictly higher. A multiple-choice question (one label-1 item, several label-0 ones: Belebele, XNLI) is
one row whose unacceptable side is its highest-scoring distractor, so `correct` means the gold item has
the strict maximum (`n_options` says how many items it has). With `conditional=True` only the
continuation (COMPS property phrase) is scored, given its prefix. Reductions other than the sum are
derived from the same token log-probs.

One line from a notebook:  `score_direct("default", "xcomps-sample", limit=5)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from babelprobe.benchmarks.core.logprobs import (
    REDUCTIONS,
    plan_logprobs,
    reduce,
    run_logprobs,
    token_logprobs,
)
from babelprobe.benchmarks.core.prefix import PrefixPlan, plan_prefix, run_prefix
from babelprobe.errors import BabelprobeError
from babelprobe.items import load_items, strongest_distractor, to_pairs
from babelprobe.models import LoadedModel
from babelprobe.runtime import Runtime


def score_texts(model: LoadedModel | str, texts: list[str], reduction: str = "sum",
                **options) -> pd.DataFrame:
    """Score plain sentences: one row per text with `score`, `n_tokens` and the token log-probs."""
    lm = Runtime(model=model).lm  # a spec through the one door, a loaded model as it is
    scored = token_logprobs(lm, list(texts), **options)
    return pd.DataFrame({"text": list(texts), "score": [reduce(s, t, reduction) for s, t in zip(scored, texts)],
                         "n_tokens": [s.n_tokens for s in scored],
                         "token_logprobs": [s.logprobs.tolist() for s in scored]})


def score_direct(model: LoadedModel | str, items: pd.DataFrame | str, reduction: str = "sum",
                 conditional: bool = False, limit: int | None = None, languages: list[str] | None = None,
                 batch_tokens: int = 4096, padding_side: str = "right", truncate: bool = False,
                 progress: bool = True, share_prefix: bool = True) -> pd.DataFrame:
    """Score every minimal pair of `items` by the model's log-probability of each sentence (`share_prefix`:
    `DirectScorer`'s)."""
    if reduction not in REDUCTIONS:
        raise BabelprobeError(f"unknown reduction {reduction!r}; use one of {', '.join(REDUCTIONS)}")
    items = load_items(items, languages=languages, limit=limit)
    to_pairs(items, strongest_distractor(items))  # the pairs (or questions) are well formed: before the model
    if conditional:
        _score_from(items)  # the prefixes and continuations are there: before the model
    lm = Runtime(model=model).lm  # a spec through the one door, a loaded model as it is
    scorer = DirectScorer(lm, reduction, conditional, batch_tokens, padding_side, truncate, share_prefix=share_prefix)
    prepared = scorer.prepare(items)
    return scorer.finish(scorer.run(prepared, progress=progress))


@dataclass
class DirectScorer:
    """Direct scoring in the three steps of `pipeline.pipelined`: `prepare(items)` (host: tokenise, batch),
    `run(prepared)` (the device's forward passes; results stay there) and `finish(ran)` (host: one read back,
    the per-pair table); calling it does all three. `capture`, if given, is entered around each batch's
    forward with its inputs (the fused extraction of `compare` keeps the hidden states of the same pass); a text
    that an earlier chunk ran is then not run again (`StoreCapture.plan`): its log-probs are kept from that chunk.

    With `share_prefix` (and no `capture`, which needs every item's own pass) the texts run as a prefix tree
    (`shared_prefix_logprobs`): a start that many texts share — BOS, a concept in many pairs — runs once
    (XCOMPS-sized items, an accelerator's chunks: 50% fewer tokens through the body at 9,180 pairs, 57% at
    61,064). The same numbers as plain batches up to float rounding of another batching (`share_prefix=False`:
    plain batches)."""

    lm: LoadedModel
    reduction: str = "sum"
    conditional: bool = False
    batch_tokens: int = 4096
    padding_side: str = "right"
    truncate: bool = False
    capture: object = None
    share_prefix: bool = True
    kept: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # text: log-probs to reuse

    def __call__(self, items: pd.DataFrame) -> pd.DataFrame:
        return self.finish(self.run(self.prepare(items)))

    def prepare(self, items: pd.DataFrame):
        to_pairs(items, strongest_distractor(items))
        texts, starts = items["text"].tolist(), _score_from(items) if self.conditional else None
        names = items["item_id"].tolist()
        if self.share_prefix and self.capture is None:
            plan = plan_prefix(self.lm, texts, starts, names=names, batch_tokens=self.batch_tokens,
                               truncate=self.truncate)
            return items, starts, plan, None
        repeats = self.capture.plan(items) if self.capture is not None and starts is None else None
        run = [i for i, text in enumerate(texts) if repeats is None or text not in repeats.earlier]
        plan = plan_logprobs(self.lm, [texts[i] for i in run], score_from=starts,  # starts given: all texts run
                             names=[names[i] for i in run], batch_tokens=self.batch_tokens,
                             padding_side=self.padding_side, truncate=self.truncate)
        return items, starts, plan, repeats

    def run(self, prepared, progress: bool = False):
        items, starts, plan, repeats = prepared
        if isinstance(plan, PrefixPlan):
            return items, starts, plan, repeats, run_prefix(self.lm, plan, progress=progress)
        during = self.capture.during(items, plan, repeats) if self.capture is not None else None
        return items, starts, plan, repeats, run_logprobs(self.lm, plan, progress=progress, during=during)

    def finish(self, ran) -> pd.DataFrame:
        items, starts, plan, repeats, readback = ran
        logprobs = plan.collect(readback.wait())
        if repeats is not None:
            ran_here = dict(zip(plan.texts, logprobs))
            self.kept.update({text: ran_here[text] for text in repeats.keep})
            logprobs = [ran_here[text] if text in ran_here else self.kept[text] for text in items["text"]]
            for text in repeats.gone:
                del self.kept[text]
        return self.table(items, starts, logprobs)

    def table(self, items: pd.DataFrame, starts, logprobs) -> pd.DataFrame:
        """One row per pair (module docstring) from the items' token log-probs."""
        lm, reduction, conditional = self.lm, self.reduction, self.conditional
        texts = items["text"].tolist()
        scored = dict(zip(items["item_id"], logprobs))
        spans = dict(zip(items["item_id"], [t[s:] for t, s in zip(texts, starts or [0] * len(texts))]))
        # a multiple-choice question is scored against its highest-scoring distractor (strict maximum)
        scores = pd.Series({i: reduce(scored[i], spans[i], reduction) for i in items["item_id"]})
        pairs = to_pairs(items, strongest_distractor(items, scores))

        out = pairs.drop(columns=[c for c in pairs.columns if c.startswith(("item_id_", "prefix_", "continuation_"))])
        out.insert(3, "method", "direct")
        for side in ("good", "bad"):
            ids = pairs[f"item_id_{side}"]
            out[f"score_{side}"] = scores.loc[ids].to_numpy()
            out[f"n_tokens_{side}"] = [scored[i].n_tokens for i in ids]
            if conditional:
                out[f"spans_join_{side}"] = [scored[i].spans_join for i in ids]
        out["correct"] = out["score_good"] > out["score_bad"]
        out["truncated"] = [scored[g].truncated or scored[b].truncated
                            for g, b in zip(pairs["item_id_good"], pairs["item_id_bad"])]
        out["reduction"] = reduction
        out["scope"] = "continuation" if conditional else "full"
        out["bos_policy"] = lm.bos_policy
        out["model"] = lm.name
        out["fingerprint"] = lm.fingerprint
        return out


def _score_from(items: pd.DataFrame) -> list[int]:
    """Character index where the continuation starts: right after the prefix."""
    how = ("; a released record gets them from prefix_acceptable/prefix_unacceptable/property_phrase (COMPS), "
           "or from a 'property_phrase' (or 'property') field in its language that ends both of its sentences; "
           "add one, or drop --conditional to score the whole sentences")
    if "prefix" not in items.columns or "continuation" not in items.columns:
        raise BabelprobeError(f"conditional scoring needs 'prefix' and 'continuation' fields in the items{how}")
    starts = []
    for item_id, text, prefix, cont in items[["item_id", "text", "prefix", "continuation"]].itertuples(index=False):
        if not isinstance(prefix, str) or not isinstance(cont, str):
            raise BabelprobeError(f"item {item_id} has no prefix and continuation, which conditional scoring "
                                  f"needs{how}")
        if not text.startswith(prefix) or not text.endswith(cont):
            raise BabelprobeError(f"item {item_id}: text {text!r} is not prefix {prefix!r} + continuation {cont!r}")
        starts.append(len(prefix))
    return starts
