"""The translation protocol of Dumas et al., "Separating Tongue from Thought" (ACL 2025), as the released code
runs it (Butanium/llm-lang-agnostic: src/prompt_tools.py, src/interventions.py, notebooks
patchscope_shifted_translation.ipynb and obj_patch_translation.ipynb; the patches are nnterp's
`patchscope_lens` and the repository's `object_lens`).

Prompts (`prompts_from_df`): `shots` translation examples of other concepts, then the query, from the
templates in data/prompts/translation.tsv, languages named in their own language
(translation_names.tsv):

    Deutsch: "Katze" - Italiano: "gatto"          (× shots)
    Français: "chien" - 中文: "

P(concept in language) (`Prompt.get_target_probs`, `process_tokens_with_tokenization`): the sum of the
next-token probabilities of the first token of each of the concept's words in that language, written
with and without a leading space (the token of a bare space left out), each token counted once.

- exp1 (`shifted_translation_plot`): a source prompt in_S → out_S of concept C^S and a target prompt
  in_T → out_T of another concept C^T. For each layer j, only block j's output at the target's last token
  is replaced by the source's (at its last token). Read at the target's next token: P(C^T in out_T),
  P(C^S in out_T), P(C^S in out_S), P(C^T in out_S) and, for the latent language, P(C^S or C^T in it) (one
  set: both concepts' tokens). A pair is kept only when these token sets are disjoint (`has_no_collisions`;
  the set of C^T in the latent language alone is not checked, as there).
- exp2 (`object_patching_plot`): the source concept's state at its last token (the source prompts cut
  after it: `get_obj_id`) in each source language pair, averaged over the pairs ("mean") or the first
  pair's alone ("first"), written at the target concept's last token into every block output j..L
  (`object_lens`, num_patches=-1). Read: P(C^T in out_T), P(C^S in out_T) and, with a latent language
  (`extra_langs=["en"]`: the set "src + tgt en", both concepts' English words), P(C^S or C^T in it), the
  pair kept when these sets are disjoint; `--latent none` is `extra_langs=[]`.
- Pairs: the (source concept, target concept) product in a seeded random order, same concept skipped, the
  first `n_pairs` without collisions (fewer is an error, where the released code skips the setting).
- Baselines, unpatched: the source prompt's own P(C^S in out_S) (exp2: mean over the source prompts, each
  in its own output language) and the target prompt's P(C^T in out_T).

Where babelprobe differs: the random draws are seeded (`seed`); one concept list serves source and target
prompts (the concepts with words in every language of the configuration); a prompt whose concept cannot
be cut from the closing quote by tokens (exp2) is not used, where the released code stops; a tokenizer
that gives the same first token with and without the space counts it once, where the released code stops.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from babelprobe.errors import BabelprobeError
from babelprobe.models import LoadedModel
from babelprobe.patching.core import UNPATCHED, Target, patched_copies, read_states, token_set_probs
from babelprobe.patching.settings import PAPER_CONFIGS, TranslationSettings, prompt_names

MEASURES = ("p_src_concept_tgt_lang", "p_tgt_concept_tgt_lang", "p_src_concept_src_lang", "p_tgt_concept_src_lang",
            "p_latent")
COLUMNS = ("config", "exp", "variant", "pair_idx", "src_concept", "tgt_concept", "layer", *MEASURES, "base_src",
           "base_tgt")


# --------------------------------------------------------------------------------------------- concepts

def load_concepts(source="xcomps-sample") -> pd.DataFrame:
    """The concept words: `concept_id, language, word` rows (a concept may list several words in a language:
    the first is the one the prompts use, all count in its token set). `source`: "xcomps-sample" (its
    concepts.csv), "dumas-concepts" (the 12 languages of the paper's configurations), a table file (CSV,
    TSV, Parquet, JSONL) or a DataFrame."""
    from babelprobe.bundled import BUNDLED

    if isinstance(source, pd.DataFrame):
        frame, where = source, "the concepts"
    elif str(source) in BUNDLED and BUNDLED[str(source)].benchmark in ("xcomps", "patching"):
        where = BUNDLED[str(source)].location
        where = where / "concepts.csv" if where.is_dir() else where
        frame = pd.read_csv(where, dtype=str, keep_default_na=False)
    else:
        from pathlib import Path

        where = Path(source).expanduser()
        if not where.is_file():
            raise BabelprobeError(f"--concepts {source}: no such file (a CSV with concept_id, language, word, or "
                                  "xcomps-sample)")
        frame = _read_concepts(where)
    missing = [c for c in ("concept_id", "language", "word") if c not in frame.columns]
    if missing:
        raise BabelprobeError(f"{where}: missing column {missing[0]!r}; concepts need concept_id, language, word")
    frame = frame[["concept_id", "language", "word"]].astype(str)
    frame = frame.assign(word=frame["word"].str.strip())
    empty = frame[frame["word"] == ""]
    if len(empty):
        row = empty.iloc[0]
        raise BabelprobeError(f"{where}: concept {row['concept_id']!r} has an empty word in {row['language']!r}")
    return frame.drop_duplicates().reset_index(drop=True)


def _read_concepts(path) -> pd.DataFrame:
    from babelprobe.tables import read_csv, read_table

    if path.suffix in (".tsv", ".tab"):
        return read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    if path.suffix == ".csv":
        return read_csv(path, dtype=str, keep_default_na=False)
    return read_table(path)


def word_lists(concepts: pd.DataFrame, languages: list[str]) -> dict[str, dict[str, list[str]]]:
    """{concept: {language: words}} for the concepts that have words in every one of `languages`, in the
    concepts' order."""
    grouped = concepts[concepts["language"].isin(languages)].groupby(["concept_id", "language"], sort=False)["word"]
    words: dict[str, dict[str, list[str]]] = {}
    for (concept, language), values in grouped:
        words.setdefault(concept, {})[language] = list(values)
    return {c: w for c, w in words.items() if all(lang in w for lang in languages)}


def concepts_digest(words: dict) -> str:
    """A content hash of the word lists a configuration uses (recorded with the run)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(words, ensure_ascii=False, sort_keys=True).encode()).hexdigest()[:16]


def check_concepts(concepts: pd.DataFrame, settings: TranslationSettings, where: str) -> dict:
    """The word lists of the configuration; one-line errors for a language without words and for fewer
    concepts than a prompt needs (shots + 1)."""
    present = set(concepts["language"])
    for code in settings.languages():
        if code not in present:
            raise BabelprobeError(f"{where} has no words in {code!r} (languages: {', '.join(sorted(present))})")
    words = word_lists(concepts, settings.languages())
    if len(words) < settings.shots + 1:
        raise BabelprobeError(f"{where}: only {len(words)} concepts have words in every language of the configuration "
                              f"({', '.join(settings.languages())}); a prompt needs --shots {settings.shots} + 1")
    return words


# ---------------------------------------------------------------------------------------------- prompts

def templates() -> tuple[str, str]:
    """The shot and query templates (data/prompts/translation.tsv)."""
    from babelprobe.prompts import read_prompts

    table = read_prompts("translation", ("part", "template")).set_index("part")["template"]
    return table["shot"], table["query"]


@dataclass
class Prompts:
    """The translation prompts of one configuration: one per (concept, input language, output language),
    its few-shot examples drawn from the other concepts with a generator seeded by (seed, concept, pair),
    so that a prompt is the same whichever experiment asks for it."""

    words: dict[str, dict[str, list[str]]]
    shots: int
    seed: int
    names: dict[str, str] = field(default_factory=prompt_names)
    parts: tuple[str, str] = field(default_factory=templates)

    def text(self, concept: str, pair: tuple[str, str]) -> str:
        shot, query = self.parts
        rng = np.random.default_rng([self.seed, zlib.crc32(f"{concept}|{pair[0]}|{pair[1]}".encode())])
        others = [c for c in self.words if c != concept]
        chosen = [others[i] for i in rng.choice(len(others), size=self.shots, replace=False)]
        names = {"in_name": self.names[pair[0]], "out_name": self.names[pair[1]]}
        body = "".join(shot.format(**names, in_word=self.words[c][pair[0]][0], out_word=self.words[c][pair[1]][0])
                       for c in chosen)
        return body + query.format(**names, in_word=self.words[concept][pair[0]][0])


def first_tokens(tokenizer, words: list[str]) -> list[int]:
    """The first token of each word and of the word after a space (that of a bare space left out), each once
    (`process_tokens_with_tokenization`)."""
    space = tokenizer(" ", add_special_tokens=False).input_ids[:1]
    out = []
    for word in words:
        plain = tokenizer(word, add_special_tokens=False).input_ids[:1]
        spaced = tokenizer(" " + word, add_special_tokens=False).input_ids[:1]
        out += plain + ([] if spaced == space else spaced)
    return list(dict.fromkeys(out))


def no_collisions(sets: list[list[int]]) -> bool:
    """Whether no token is in two of the sets (`Prompt.has_no_collisions`)."""
    tokens = [t for s in sets for t in s]
    return len(tokens) == len(set(tokens))


def concept_position(lm: LoadedModel, prompt: str) -> int | None:
    """The position of the query concept's last token in the encoded prompt (`get_obj_id`): the prompt cut
    at its second-last quote and the rest must tokenise to the prompt's tokens; None when they do not."""
    parts = prompt.split('"')
    start, end = '"'.join(parts[:-2]), '"' + '"'.join(parts[-2:])
    tokenize = lm.tokenizer
    ids_start = tokenize(start, add_special_tokens=False).input_ids
    ids_end = tokenize(end, add_special_tokens=False).input_ids
    full = lm.encode([prompt])[0].ids
    if full[len(full) - len(ids_start) - len(ids_end):] != ids_start + ids_end:
        return None
    return len(full) - len(ids_end) - 1


def _check_length(lm: LoadedModel, prompt: str, concept: str, pair: tuple[str, str]) -> None:
    n = len(lm.tokenizer(prompt, add_special_tokens=False).input_ids) + (lm.bos_token_id is not None)
    if n > lm.max_length:
        raise BabelprobeError(f"the {'-'.join(pair)} translation prompt of concept {concept!r} has {n} tokens, more "
                              f"than the model's context of {lm.max_length}; use fewer --shots")


# ---------------------------------------------------------------------------------------------- configs

@dataclass(frozen=True)
class Config:
    """One experiment's language setting: source pair(s), target pair and (exp1) the latent language."""

    exp: str
    sources: tuple[tuple[str, str], ...]
    target: tuple[str, str]
    latent: str | None = None

    @property
    def name(self) -> str:
        return f"{','.join('-'.join(p) for p in self.sources)} → {'-'.join(self.target)}"


def configs(settings: TranslationSettings) -> list[Config]:
    """The experiments' configurations: the settings' own, or `--preset paper`'s (`PAPER_CONFIGS`)."""
    if settings.preset == "paper":
        return [Config(exp, tuple(tuple(p.split("-")) for p in sources), tuple(target.split("-")), settings.latent)
                for exp, sources, target in PAPER_CONFIGS if exp in settings.exps]
    target = tuple(settings.target.split("-"))
    out = []
    if "exp1" in settings.exps:
        out.append(Config("exp1", (tuple(settings.source.split("-")),), target, settings.latent))
    if "exp2" in settings.exps:
        out.append(Config("exp2", tuple(tuple(p.split("-")) for p in settings.source_pairs), target, settings.latent))
    return out


@dataclass
class Plan:
    """The pairs of one configuration: per pair the concepts, prompts, positions and token sets."""

    config: Config
    pairs: pd.DataFrame  # pair_idx, src_concept, tgt_concept, target_prompt, source_prompts (list), sets (list)
    candidates: int      # candidate pairs looked at
    unusable: int        # candidates left out because a prompt's concept could not be cut from its quote


def plan_pairs(lm: LoadedModel, prompts: Prompts, config: Config, n_pairs: int, seed: int) -> Plan:
    """The first `n_pairs` collision-free pairs of the configuration in a seeded random order (module
    docstring); one-line error when there are fewer."""
    concepts = list(prompts.words)
    tokens: dict[tuple[str, str], list[int]] = {}
    positions: dict[tuple[str, tuple], int | None] = {}

    def token_set(concept, language):
        if (concept, language) not in tokens:
            tokens[concept, language] = first_tokens(lm.tokenizer, prompts.words[concept][language])
        return tokens[concept, language]

    def position(concept, pair):
        if (concept, pair) not in positions:
            positions[concept, pair] = concept_position(lm, prompts.text(concept, pair))
        return positions[concept, pair]

    out_t = config.target[1]
    rng = np.random.default_rng([seed, zlib.crc32(config.name.encode())])
    rows, looked, unusable = [], 0, 0
    for flat in rng.permutation(len(concepts) ** 2):
        src, tgt = concepts[flat // len(concepts)], concepts[flat % len(concepts)]
        if src == tgt:
            continue
        looked += 1
        if config.exp == "exp1":
            out_s = config.sources[0][1]
            sets = [token_set(src, out_t), token_set(tgt, out_t), token_set(src, out_s), token_set(tgt, out_s)]
            if config.latent:
                sets.append(list(dict.fromkeys(token_set(tgt, config.latent) + token_set(src, config.latent))))
            # has_no_collisions: target tokens, the target concept in out_S, src out_S, src out_T, src + tgt latent
            if not no_collisions(sets):
                continue
            sets = sets + ([] if config.latent else [[]])
            own = [token_set(src, out_s)]
        else:
            sets = [token_set(src, out_t), token_set(tgt, out_t), [], [], []]
            checked = sets[:2]
            if config.latent:  # object_patching_plot(extra_langs=[latent]): "src + tgt LANG" joins the check
                sets[4] = list(dict.fromkeys(token_set(tgt, config.latent) + token_set(src, config.latent)))
                checked = [*checked, sets[4]]
            if not no_collisions(checked):
                continue
            if position(tgt, config.target) is None or any(position(src, p) is None for p in config.sources):
                unusable += 1
                continue
            own = [token_set(src, p[1]) for p in config.sources]
        for concept, pair in [(tgt, config.target), *((src, p) for p in config.sources)]:
            _check_length(lm, prompts.text(concept, pair), concept, pair)
        rows.append({"pair_idx": len(rows), "src_concept": src, "tgt_concept": tgt,
                     "target_prompt": prompts.text(tgt, config.target),
                     "source_prompts": [prompts.text(src, p) for p in config.sources],
                     "sets": sets, "source_sets": own})
        if len(rows) == n_pairs:
            break
    if len(rows) < n_pairs:
        raise BabelprobeError(f"could only collect {len(rows)} of {n_pairs} pairs for {config.name} (pairs whose "
                              "token sets overlap are left out); lower --n-pairs or give more concepts (--concepts)")
    return Plan(config, pd.DataFrame(rows), looked, unusable)


# -------------------------------------------------------------------------------------------------- run

def run_plan(lm: LoadedModel, plan: Plan, layers: list[int], batch_tokens: int = 4096,
             padding_side: str = "left") -> pd.DataFrame:
    """The rows of one configuration's pairs (COLUMNS): per pair, layer (and exp2 variant) the patched
    probabilities and the unpatched baselines."""
    config, pairs = plan.config, plan.pairs
    # the source prompts: each run once; the state at the query's last token (exp1) or the concept's (exp2)
    sources = list(dict.fromkeys(p for prompts in pairs["source_prompts"] for p in prompts))
    source_ids = [e for e in lm.encode(sources)]
    at = [len(e.ids) - 1 if config.exp == "exp1" else concept_position(lm, text)
          for e, text in zip(source_ids, sources)]
    states, finals = read_states(lm, source_ids, at, [[len(e.ids) - 1] for e in source_ids], batch_tokens)
    index = {text: i for i, text in enumerate(sources)}
    source_sets = [s for row in pairs["source_sets"] for s in row]
    source_probs = token_set_probs(lm, torch.cat([finals[index[p]] for row in pairs["source_prompts"] for p in row]),
                                   [[s] for s in source_sets])[:, 0]
    base_src = np.split(source_probs, np.cumsum([len(row) for row in pairs["source_prompts"]])[:-1])

    targets = []
    for row in pairs.itertuples():
        ids = lm.encode([row.target_prompt])[0].ids
        rows = [index[p] for p in row.source_prompts]
        if config.exp == "exp1":
            target = Target(ids, len(ids) - 1, [len(ids) - 1], states[rows[:1]],
                            [UNPATCHED] + [(0, (j,)) for j in layers])
        else:
            onward = [tuple(range(j, lm.n_layers + 1)) for j in layers]
            mean_first = torch.stack([states[rows].mean(dim=0), states[rows[0]]])
            target = Target(ids, concept_position(lm, row.target_prompt), [len(ids) - 1], mean_first,
                            [UNPATCHED] + [(0, o) for o in onward] + [(1, o) for o in onward])
        targets.append(target)
    outs = patched_copies(lm, targets, batch_tokens, padding_side)
    finals = torch.cat([o[:, 0] for o in outs])
    probs = token_set_probs(lm, finals, [row.sets for row in pairs.itertuples() for _ in range(len(targets[0].copies))])
    probs = probs.reshape(len(pairs), len(targets[0].copies), len(MEASURES))

    variants = [("single", 0)] if config.exp == "exp1" else [("mean", 0), ("first", len(layers))]
    frames = []
    for variant, offset in variants:
        for k, layer in enumerate(layers):
            frame = pd.DataFrame(probs[:, 1 + offset + k], columns=list(MEASURES))
            frame.insert(0, "layer", layer)
            frames.append(pd.concat([pairs[["pair_idx", "src_concept", "tgt_concept"]].reset_index(drop=True)
                                     .assign(variant=variant), frame], axis=1)
                          .assign(base_src=[float(np.mean(b)) for b in base_src], base_tgt=probs[:, 0, 1]))
    out = pd.concat(frames, ignore_index=True).assign(config=config.name, exp=config.exp)
    if config.exp == "exp2":
        out[["p_src_concept_src_lang", "p_tgt_concept_src_lang"]] = np.nan
    if not config.latent:
        out["p_latent"] = np.nan
    return out[list(COLUMNS)].sort_values(["variant", "pair_idx", "layer"], kind="stable").reset_index(drop=True)


def pair_table(plans: list[Plan], lm: LoadedModel) -> pd.DataFrame:
    """translation_pairs.csv: per configuration and pair the concepts, the prompts and the token sets (as
    tokens), to read what was run."""
    rows = []
    for plan in plans:
        for row in plan.pairs.itertuples():
            rows.append({"config": plan.config.name, "exp": plan.config.exp, "pair_idx": row.pair_idx,
                         "src_concept": row.src_concept, "tgt_concept": row.tgt_concept,
                         "source_prompt": row.source_prompts[0], "target_prompt": row.target_prompt,
                         **{f"tokens_{name.removeprefix('p_')}": " ".join(lm.tokenizer.convert_ids_to_tokens(s))
                            for name, s in zip(MEASURES, row.sets)}})
    return pd.DataFrame(rows)
