"""The minimal-pair protocol of `babelprobe patch` (babelprobe's join of patching with the benchmarks; not in
Dumas et al.): does the acceptable concept, read in another language, make the model accept the property
in the target language?

Items need `parallel_id` (the same content across languages), `prefix` and `continuation` (COMPS-style:
the concept, then the property phrase). For a minimal pair in language T (acceptable item g, unacceptable
item b), source language S and layer j:

    written:  the state of S's acceptable item (the item of S with g's parallel_id) at its last prefix token,
              block outputs j..L (with several sources, the mean of their states);
    into:     b, at its last prefix token (the token before its first scored one), block outputs j..L;
    score:    s = direct's conditional score, the sum of the log-probabilities of the continuation's tokens
              given the prefix (`score_direct(conditional=True)`; the patched run through the same token
              positions and vocabulary projection, `core.logprobs`);
    recovery: r_j = (s_patched − s_bad) / (s_good − s_bad): 0 = as unacceptable as before, 1 = as acceptable
              as the acceptable item.

Controls (`controls`): `target`, T's own acceptable item as the source (the upper bound: the concept in
the pair's own language), and `other`, another pair's acceptable item in S, one whose prefix names neither
of the pair's concepts (the lower bound: a concept unrelated to the property). One row per pair ×
control × layer: `pair_id, parallel_id, language, source, subset, layer, control, s_good, s_bad,
s_patched, recovery` (pair_id joins a compare directory's items.csv).
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd
import torch

from babelprobe.benchmarks.core.logprobs import logprobs_of_states, scored_positions
from babelprobe.errors import BabelprobeError
from babelprobe.models import LoadedModel
from babelprobe.patching.core import UNPATCHED, Target, patched_copies, read_states

COLUMNS = ("pair_id", "parallel_id", "language", "source", "subset", "layer", "control", "s_good", "s_bad",
           "s_patched", "recovery")
CONTROLS = ("source", "target", "other")  # `source`: the patch itself; the two controls


def check_items(items: pd.DataFrame, sources: tuple[str, ...]) -> pd.DataFrame:
    """The minimal pairs to patch into, checked before any model work: the fields, every item's prefix and
    continuation, the source languages among the items. Returns `to_pairs(items)`."""
    from babelprobe.items import to_pairs

    for name in ("parallel_id", "prefix", "continuation"):
        if name not in items.columns or items[name].isna().all():
            raise BabelprobeError(f"the items have no {name!r} field, which patch --protocol pairs needs "
                                  "(parallel_id links the same content across languages; prefix and continuation "
                                  "split each sentence into the concept and the property); add it to the item file")
    items = items[items["label"].isin([0, 1])]
    for row in items[["item_id", "text", "prefix", "continuation", "parallel_id"]].itertuples(index=False):
        if not all(isinstance(v, str) and v for v in (row.prefix, row.continuation, row.parallel_id)):
            raise BabelprobeError(f"item {row.item_id} has no parallel_id, prefix or continuation; patch --protocol "
                                  "pairs needs all three on every item")
        if not row.text.startswith(row.prefix) or not row.text.endswith(row.continuation):
            raise BabelprobeError(f"item {row.item_id}: text {row.text!r} is not prefix {row.prefix!r} + "
                                  f"continuation {row.continuation!r}")
    languages = set(items["language"])
    missing = [s for s in sources if s not in languages]
    if missing:
        raise BabelprobeError(f"--sources {','.join(sources)}: no items in {missing[0]!r} (the items' languages: "
                              f"{', '.join(sorted(languages))})")
    return to_pairs(items)


class _Texts:
    """Every text used, encoded once, with its last prefix token and scored positions."""

    def __init__(self, lm: LoadedModel, items: pd.DataFrame):
        self.items = items.set_index("item_id")
        ids = list(self.items.index)
        encodings = lm.encode(self.items["text"].tolist(), names=ids)
        self.enc = dict(zip(ids, encodings))
        self.scored = {i: scored_positions(e, len(self.items.at[i, "prefix"])) for i, e in self.enc.items()}

    def at(self, item_id: str) -> int:
        """The last prefix token: the one before the first scored token (it predicts it)."""
        return self.scored[item_id][0] - 1


def pair_rows(lm: LoadedModel, items: pd.DataFrame, pairs: pd.DataFrame, sources: tuple[str, ...],
              layers: list[int], controls: bool = True, seed: int = 0, batch_tokens: int = 4096,
              padding_side: str = "left") -> pd.DataFrame:
    """The rows (COLUMNS, and `s_unpatched`: the bad item's score from the patched run's own unpatched copy)
    of every pair of `pairs` in a language (module docstring). `items`: every item, sources included."""
    from babelprobe.benchmarks.direct import score_direct

    items = items[items["label"].isin([0, 1])]
    texts = _Texts(lm, items)
    good = items[items["label"] == 1]
    by_parallel = {(lang, pid): item for lang, pid, item in good[["language", "parallel_id", "item_id"]]
                   .drop_duplicates(["language", "parallel_id"]).itertuples(index=False)}
    bad_parallel = items[items["label"] == 0].set_index("pair_id")["parallel_id"]
    pairs = pairs[[all((s, pid) in by_parallel for s in sources) for pid in pairs["parallel_id"]]].reset_index(drop=True)
    if pairs.empty:
        return pd.DataFrame(columns=[*COLUMNS, "s_unpatched"])

    candidates = sorted({pid for (lang, pid) in by_parallel if all((s, pid) in by_parallel for s in sources)})
    prefix_in = {(lang, pid): prefix for lang, pid, prefix in  # every item's: the bad items' concepts too
                 items[["language", "parallel_id", "prefix"]].drop_duplicates(["language", "parallel_id"])
                 .itertuples(index=False)}
    kinds = CONTROLS if controls else CONTROLS[:1]
    others = [_other_concept(pair, bad_parallel.get(pair.pair_id), candidates, prefix_in, sources[0], seed)
              if controls else None for pair in pairs.itertuples()]

    # every state written: the acceptable items' last prefix tokens, one pass over the items needed
    needed = [by_parallel[s, pid] for pid in pairs["parallel_id"] for s in sources]
    if controls:
        needed += [by_parallel[lang, pid] for lang, pid in zip(pairs["language"], pairs["parallel_id"])]
        needed += [by_parallel[s, pid] for pid in others if pid is not None for s in sources]
    needed = list(dict.fromkeys(needed))
    states, _ = read_states(lm, [texts.enc[i] for i in needed], [texts.at(i) for i in needed],
                            [[texts.at(i)] for i in needed], batch_tokens)
    state_of = {item: states[k] for k, item in enumerate(needed)}
    mean_of = {}  # parallel_id -> the mean state over the sources

    def mean_state(pid):
        if pid not in mean_of:
            mean_of[pid] = torch.stack([state_of[by_parallel[s, pid]] for s in sources]).mean(dim=0)
        return mean_of[pid]

    targets = []
    for pair, other in zip(pairs.itertuples(), others):
        bad = pair.item_id_bad
        sets = [mean_state(pair.parallel_id)]
        if controls:
            sets.append(state_of[by_parallel[pair.language, pair.parallel_id]])
            sets.append(mean_state(other) if other is not None else torch.full_like(sets[0], float("nan")))
        onward = [tuple(range(j, lm.n_layers + 1)) for j in layers]
        copies = [UNPATCHED] + [(k, o) for k in range(len(sets)) for o in onward]
        enc = texts.enc[bad]
        targets.append(Target(enc.ids, texts.at(bad), [p - 1 for p in texts.scored[bad]], torch.stack(sets), copies))
    finals = patched_copies(lm, targets, batch_tokens, padding_side)

    direct = score_direct(lm, items[items["pair_id"].isin(pairs["pair_id"])], conditional=True,
                          batch_tokens=batch_tokens, progress=False).set_index("pair_id")
    tokens = [[t.ids[p + 1] for p in t.read] for t in targets]
    flat = logprobs_of_states(lm, torch.cat([f.reshape(-1, f.shape[-1]) for f in finals]),
                              [tok for t, ids in zip(targets, tokens) for tok in ids * len(t.copies)])
    frames, start, source_name = [], 0, "+".join(sources)
    for pair, target, ids, other in zip(pairs.itertuples(), targets, tokens, others):
        size = len(target.copies) * len(ids)
        scores = flat[start:start + size].reshape(len(target.copies), len(ids)).sum(axis=1)
        start += size
        s_good, s_bad = direct.at[pair.pair_id, "score_good"], direct.at[pair.pair_id, "score_bad"]
        patched = scores[1:].reshape(len(kinds), len(layers))
        for k, control in enumerate(kinds):
            frames.append(pd.DataFrame({
                "pair_id": pair.pair_id, "parallel_id": pair.parallel_id, "language": pair.language,
                "source": pair.language if control == "target" else source_name, "subset": pair.subset,
                "layer": layers, "control": control, "s_good": s_good, "s_bad": s_bad, "s_patched": patched[k],
                "recovery": (patched[k] - s_bad) / (s_good - s_bad) if s_good != s_bad else np.nan,
                "s_unpatched": scores[0], "other_parallel_id": other if control == "other" else ""}))
    return pd.concat(frames, ignore_index=True)


def _other_concept(pair, bad_parallel, candidates: list[str], prefix_in: dict, language: str, seed: int):
    """Another pair's acceptable concept for the lower-bound control: a parallel_id whose prefix in the
    (first) source language differs from those of the pair's two concepts, drawn with a generator seeded by
    the pair."""
    own = {prefix_in.get((language, pair.parallel_id)), prefix_in.get((language, bad_parallel))}
    pool = [pid for pid in candidates if prefix_in.get((language, pid)) not in own]
    if not pool:
        return None
    rng = np.random.default_rng([seed, zlib.crc32(str(pair.pair_id).encode())])
    return pool[int(rng.integers(len(pool)))]
