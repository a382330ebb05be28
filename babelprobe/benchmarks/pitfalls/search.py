"""The beam-search weakness finder of Cross-Lingual Pitfalls (Xu et al., ACL 2025, §2.2–2.4) and the
expanded pairs of its linguistic-affinity analysis (§3.3): grow English questions with distracting
context until a set of simulation models still answers them in English but fails in the target
language; then ask the found questions in other languages.

**Pieces** (all pluggable):
  - a perturber and a translator: anything with `generate(prompts, max_new_tokens, stop, temperature,
    seed) -> list[str]` (`generate.make_generator("local", lm)` or an OpenAI-compatible endpoint); the
    prompts are the paper's App. E templates (data/prompts/pitfalls_paper.tsv, `pitfalls.load_templates`);
  - simulation models: `LoadedModel`s (answered by likelihood, as `pitfalls.score_pitfalls` does),
    `pitfalls.ReleaseAnswerer`s (any generator, local or an endpoint, answering as the released run.py:
    the language's instruction without chain of thought, then an extraction; `answer="generate"`, the
    paper preset), callables `f(question, choices, language) -> index or choice`, or objects with
    `answer(questions, choices, languages) -> list[int]`;
  - a semantic similarity for the constraints of Eq. 4 (optional): a callable `pairs -> scores`,
    `JudgeSimilarity` (an LLM says whether two questions ask the same; 1 or 0) or `EmbeddingSimilarity`
    (cosine of mean-pooled hidden states of an encoder); `make_similarity("llm:SPEC" | "embedding:MODEL")`.

**Seeds.** English source questions every simulation model answers right are translated (question, choices
and answer together, a JSON reply) with the release's native template of the target language
(`translation="release"`, utils/prompt.py English2<Language>, 17 languages; a language without one is an
error) or App. E's (`translation="paper"`: fr, de, it, es; App. E's rules in English elsewhere) and, with
the semantic check, kept only if S(question, translation) ≥ θ'.

**Score.** For a bilingual question, β^E and β^T are the simulation models' mean accuracy in English
and in the target language; V = (β^E)^γ − β^T (γ = 2, `pitfalls.simulation_score`, Eq. 8).

**Search** (per batch of `batch_size` seed questions, W = 4):
  1. every question in the beam is expanded once per wrong option: the perturber writes a distraction
     towards that option with the App. E template ("Template for Generating Perturbation", temperature
     0.7, App. B.1; `{answer}` is the correct answer, which every simulation model gave), the translator
     translates it (the released code's plain translation prompt; the paper used Google Translate) and
     it is added before or after the question in both languages (the released code's rule: before if the
     distraction has an odd number of characters), concatenated as run.py does (no separator);
  2. with the semantic check (`semantic_check`, on in the paper preset; θ = θ' = 0.5 are babelprobe's), children with S(qE, qE') < θ or S(qE', qT') < θ' are dropped (Eq. 4);
  3. children no longer answered right in English by every model are dropped (β^E ≥ 1 − ε, ε = 0
     as released: `english_min`); the others are scored with V;
  4. inclusion: a child with V ≥ θinc becomes a candidate, at most r per seed question (redundancy);
  5. potential: once any child reaches V ≥ θpot, the batch may search to depth d2 instead of d1;
  6. the beam is the w best children by V, without those already failed by every model in the target
     language (nothing left to find) and those of seeds that have r candidates.
Defaults are the paper's: w = 12, d1 = 4, d2 = 6, θpot = 0.6, θinc = 0.8, r = 3, γ = 2 (App. B.1). They
agree with the released run.py (queue 12; depth 4, or 6 once a child has β^T ≤ 0.4, i.e. V ≥ 0.6; max_good
3, counting children with β^T ≤ 0.2, i.e. V ≥ 0.8), which also writes out children with 0.6 ≤ V < 0.8;
its eva.py leaves those out of the evaluation.

`beam_search` returns the candidates (in the released record format plus `seed_id`, `depth`) and the
trace: every child with its parent, the wrong option it targets, the distraction, the similarities,
β^E, β^T, V and what happened to it. `direct_perturbation` is the paper's DP baseline (Table 1).

**Expanded pairs** (§3.3, App. B.2): `expand_pairs` translates the target-language portion of each
language's found pairs into every other language (the original question with its choices and answer by
the App. E template, the added context by plain translation), `cross_evaluate` asks them to several
models, and `pitfalls.affinity_accuracy` / `pitfalls.relative_affinity` turn the rows into D.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from babelprobe.benchmarks.pitfalls.answers import ReleaseAnswerer
from babelprobe.benchmarks.pitfalls.prompts import (
    format_choices,
    format_prompt,
    load_prompts,
    load_release,
    load_templates,
    release_template,
    template_for,
)
from babelprobe.benchmarks.pitfalls.settings import SearchSettings
from babelprobe.benchmarks.pitfalls.summary import simulation_score
from babelprobe.errors import BabelprobeError
from babelprobe.languages import language_code
from babelprobe.models import LoadedModel

# ------------------------------------------------------------------------------------ simulation models

class LikelihoodAnswerer:
    """A simulation model that answers by likelihood: the Pitfalls prompt, each choice scored as its
    continuation, the best one chosen."""

    def __init__(self, lm: LoadedModel, reduction: str = "per_byte", prompts: pd.DataFrame | None = None,
                 batch_tokens: int = 4096):
        self.lm, self.reduction, self.batch_tokens = lm, reduction, batch_tokens
        self.prompts = load_prompts() if prompts is None else prompts
        self.name = lm.name

    def answer(self, questions: list[str], choices: list[list[str]], languages: list[str]) -> list[int]:
        from babelprobe.benchmarks.core.choices import option_scores

        requests = [format_prompt(q, c, lang, self.prompts) for q, c, lang in zip(questions, choices, languages, strict=True)]
        scores = option_scores(self.lm, [p for p, _ in requests], [o for _, o in requests],
                               reduction=self.reduction, share_prefix=True, batch_tokens=self.batch_tokens,
                               progress=False)
        return [int(np.argmax(s)) for s in scores]


class FunctionAnswerer:
    """A simulation model from a function `f(question, choices, language) -> index or choice text`."""

    def __init__(self, function: Callable, name: str | None = None):
        self.function = function
        self.name = name or getattr(function, "__name__", "function")

    def answer(self, questions: list[str], choices: list[list[str]], languages: list[str]) -> list[int]:
        answers = []
        for q, c, lang in zip(questions, choices, languages, strict=True):
            out = self.function(q, c, lang)
            if isinstance(out, str):
                answers.append(c.index(out) if out in c else -1)  # an answer that is not a choice is wrong
            else:
                answers.append(int(out))
        return answers


def as_simulation_models(models) -> list:
    """Wrap LoadedModels and plain functions; objects with an `answer` method are used as they are."""
    wrapped = []
    for model in models:
        if isinstance(model, LoadedModel):
            wrapped.append(LikelihoodAnswerer(model))
        elif hasattr(model, "answer"):
            wrapped.append(model)
        elif callable(model):
            wrapped.append(FunctionAnswerer(model))
        else:
            raise BabelprobeError(f"simulation model {model!r} is neither a LoadedModel, a function nor has answer()")
    if not wrapped:
        raise BabelprobeError("the search needs at least one simulation model")
    return wrapped


def simulate(models: list, questions: list[str], choices: list[list[str]], answers: list[int],
             languages: list[str]) -> np.ndarray:
    """Mean accuracy over the simulation models of each question (β, Eq. 7). A model's answer of None (a
    failed extraction, `answers.ReleaseAnswerer`) leaves it out of that question's denominator, and a
    question no model answered has β = 0, as the released `utils/answers.py` `simulate` counts
    (`correct_number / len(responses)`, 0 without responses)."""
    if not questions:
        return np.zeros(0)
    right, answered = np.zeros(len(questions)), np.zeros(len(questions))
    for model in models:
        given = model.answer(questions, choices, languages)
        answered += [a is not None for a in given]
        right += [a is not None and a == gold for a, gold in zip(given, answers, strict=True)]
    return np.divide(right, answered, out=np.zeros(len(questions)), where=answered > 0)


# ----------------------------------------------------------------------------------------- generation

def _generate(generator, prompts: list[str], settings: SearchSettings, cache: Path | None,
              temperature: float = 0.0) -> list[str]:
    """Generate (greedy unless `temperature`), through the resumable cache of `generate_cached` when a cache
    file is given. The paper's 0.001 for translation and checks (App. B.1) is greedy decoding here."""
    if not prompts:
        return []
    sampling = {"temperature": temperature, "seed": settings.seed} if temperature > 0 else {}
    if cache is not None:
        from babelprobe.benchmarks.core.generate import generate_cached

        return generate_cached(generator, prompts, cache, max_new_tokens=settings.max_new_tokens, **sampling)
    return generator.generate(prompts, max_new_tokens=settings.max_new_tokens, **sampling)


def clean(text: str) -> str:
    """A generated distraction or translation: the first paragraph, without the template's
    `{Generated Distraction: <...>}` wrapping, an echoed label or quotes."""
    text = text.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    for label in ("Generated Distraction:", "Distraction:", "Translation:", "New question:"):
        if text.startswith(label):
            text = text[len(label):].strip()
    text = text.split("\n\n")[0].strip()
    if text.startswith("<") and text.endswith(">"):
        text = text[1:-1].strip()
    return text.strip('"“”')


def parse_translation(output: str, n_choices: int) -> dict | None:
    """The translator's JSON reply `{"text": ..., "choices": [...], "answer": ...}` (App. E output format),
    or None when it is not that JSON or has another number of choices."""
    text = re.sub(r"^```(?:json)?|```$", "", output.strip()).strip()
    start, end = text.find("{"), text.rfind("}")
    if not 0 <= start < end:
        return None
    try:
        value = json.loads(text[start:end + 1])
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("text"), str) or not value["text"].strip():
        return None
    choices = value.get("choices")
    if not isinstance(choices, list) or len(choices) != n_choices or not all(isinstance(c, str) and c.strip()
                                                                           for c in choices):
        return None
    return {"text": value["text"].strip(), "choices": [c.strip() for c in choices], "answer": value.get("answer")}


def translate_records(texts: list[str], choices: list[list[str]], answers: list[str], language_name: str,
                      translator, templates: pd.DataFrame, settings: SearchSettings,
                      cache: Path | None) -> list[dict | None]:
    """Question, choices and answer translated together with the release's native template of the language
    (`settings.translation == "release"`) or App. E's (its `*` row, ours, where App. E has none); None where
    the reply is unusable (the release asks gpt-4o-mini to pull the JSON out of the reply; here it is parsed)."""
    if settings.translation == "release":
        template = release_template(load_release(), "translate", language_code(language_name))
    else:
        template, _ = template_for(templates, "translate", language_code(language_name))
    prompts = [template.format(question=t, choices=format_choices(c), ground_truth=a, language=language_name)
               for t, c, a in zip(texts, choices, answers, strict=True)]
    outputs = _generate(translator, prompts, settings, cache)
    return [parse_translation(o, len(c)) for o, c in zip(outputs, choices, strict=True)]


def translate_texts(texts: list[str], language_name: str, translator, templates: pd.DataFrame,
                    settings: SearchSettings, cache: Path | None) -> list[str]:
    """Plain translations (added context): the released code's prompt; empty texts stay empty."""
    template, _ = template_for(templates, "translate_text", "*")
    todo = sorted({t for t in texts if t.strip()})
    done = dict(zip(todo, (clean(o) for o in _generate(translator, [template.format(target=language_name, text=t)
                                                                      for t in todo], settings, cache))))
    return [done.get(t, "") for t in texts]


# -------------------------------------------------------------------------------------------- similarity

class JudgeSimilarity:
    """S(a, b) ∈ {0, 1}: an LLM judges whether two questions ask the same (the released code's
    check_question_semantic prompt, its verdict read by a second call with extract_check_question)."""

    def __init__(self, generator, templates: pd.DataFrame | None = None, max_new_tokens: int = 1024,
                 cache: Path | None = None):
        self.generator, self.cache = generator, cache
        self.templates = load_templates() if templates is None else templates
        self.settings = SearchSettings(max_new_tokens=max_new_tokens)
        self.name = f"llm:{generator.name}"

    def __call__(self, pairs: list[tuple[str, str]]) -> list[float]:
        check, _ = template_for(self.templates, "check", "*")
        extract, _ = template_for(self.templates, "check_extract", "*")
        judged = _generate(self.generator, [check.format(ori_question=a, question=b) for a, b in pairs],
                           self.settings, self.cache)
        verdicts = _generate(self.generator, [extract.format(prompt=j) for j in judged], self.settings, self.cache)
        return [float(_verdict(v, j)) for v, j in zip(verdicts, judged, strict=True)]


def _verdict(extracted: str, judged: str) -> bool:
    """Yes from the extraction's JSON `check_result`, else the judge's last yes/no word; otherwise No."""
    match = re.search(r'"check_result"\s*:\s*"?\s*(yes|no)', extracted, re.I)
    if not match:
        words = re.findall(r"\b(yes|no)\b", judged, re.I)
        return bool(words) and words[-1].lower() == "yes"
    return match.group(1).lower() == "yes"


class EmbeddingSimilarity:
    """S(a, b) = cosine of the mean-pooled last hidden states of an encoder (a hub id or local directory,
    loaded with transformers' AutoModel, remote code off)."""

    def __init__(self, spec: str, batch_size: int = 16):
        from transformers import AutoModel, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(spec)
            self.model = AutoModel.from_pretrained(spec).eval()
        except (OSError, ValueError) as err:
            raise BabelprobeError(f"cannot load the embedding model {spec!r}: {str(err).splitlines()[0]}") from None
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        self.batch_size, self.name = batch_size, f"embedding:{spec}"

    def embed(self, texts: list[str]) -> np.ndarray:
        import torch

        vectors = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(texts[start:start + self.batch_size], padding=True, truncation=True,
                                   return_tensors="pt")
            with torch.inference_mode():
                states = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
            vectors.append(((states * mask).sum(1) / mask.sum(1)).float().numpy())
        return np.concatenate(vectors) if vectors else np.zeros((0, 0))

    def __call__(self, pairs: list[tuple[str, str]]) -> list[float]:
        if not pairs:
            return []
        a, b = self.embed([p[0] for p in pairs]), self.embed([p[1] for p in pairs])
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        return [float(x) for x in cos]


def make_similarity(spec: str, models=None, templates: pd.DataFrame | None = None,
                    settings: SearchSettings = SearchSettings(), cache: Path | None = None):  # noqa: B008 (frozen)
    """None for 'none'; a `JudgeSimilarity` for 'llm:GENERATOR'; an `EmbeddingSimilarity` for 'embedding:MODEL'."""
    if spec == "none":
        return None
    kind, _, rest = spec.partition(":")
    if kind == "llm" and rest:
        from babelprobe.benchmarks.base import as_models

        return JudgeSimilarity(as_models(models).generator(rest), templates, settings.max_new_tokens, cache)
    if kind == "embedding" and rest:
        return EmbeddingSimilarity(rest)
    raise BabelprobeError(f"unknown similarity {spec!r}; use none, llm:SPEC or embedding:MODEL")


# ------------------------------------------------------------------------------------------------ seeds

def load_source_questions(path: str | Path, limit: int | None = None) -> pd.DataFrame:
    """English seed questions (`source/*.json` of the release: question, choices, answer)."""
    path = Path(path).expanduser()
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BabelprobeError(f"{path}: cannot read English source questions ({err})") from err
    if not isinstance(records, list):
        raise BabelprobeError(f"{path}: expected a list of questions")
    rows = []
    for i, record in enumerate(records[:limit] if limit is not None else records):
        at = f"{path}: record {i + 1}"
        for name in ("question", "choices", "answer"):
            if not isinstance(record, dict) or name not in record:
                raise BabelprobeError(f"{at}: missing field {name!r}")
        if record["answer"] not in record["choices"]:
            raise BabelprobeError(f"{at}: answer {record['answer']!r} is not among its choices {record['choices']!r}")
        rows.append({"seed_id": f"{path.stem}-{i:04d}", "question": record["question"], "choices": record["choices"],
                     "answer": record["answer"], "source": record.get("source", path.stem),
                     "category": record.get("category", "unknown")})
    return pd.DataFrame(rows)


def prepare_seeds(source: pd.DataFrame, target_name: str, translator, models, settings: SearchSettings = SearchSettings(),  # noqa: B008 (frozen)
                  templates: pd.DataFrame | None = None, cache: Path | None = None,
                  similarity: Callable | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Keep the English seed questions every simulation model answers right in English, translate them
    (question, choices and answer together: App. E) and, with a `similarity`, keep those whose translation
    passes S ≥ θ'. Returns (seeds, dropped with the reason)."""
    templates = load_templates(settings.templates) if templates is None else templates
    models = as_simulation_models(models)
    code = language_code(target_name)
    english = simulate(models, source["question"].tolist(), source["choices"].tolist(),
                       [c.index(a) for c, a in zip(source["choices"], source["answer"], strict=True)], ["en"] * len(source))
    right = [rate >= settings.english_min for rate in english]
    asked = source[right]
    translated = translate_records(asked["question"].tolist(), asked["choices"].tolist(), asked["answer"].tolist(),
                                   target_name, translator, templates, settings, cache)
    ok = [t is not None and len(set(t["choices"])) == len(t["choices"]) for t in translated]
    checked = [(q, t["text"]) for q, t, good in zip(asked["question"], translated, ok, strict=True) if good]
    scores = iter(similarity(checked) if similarity is not None and checked else [np.nan] * len(checked))
    seeds, dropped, answers = [], [], iter(translated)
    for row, rate, keep in zip(source.to_dict("records"), english, right, strict=True):
        reason, t, similar = "", None, np.nan
        if not keep:
            reason = "not answered right in English by the simulation models"
        else:
            t = next(answers)
            if t is None:
                reason = "the translation is not the JSON the template asks for, or has another number of choices"
            elif len(set(t["choices"])) < len(t["choices"]):
                reason = "translated choices are not distinct"
            else:
                similar = next(scores)
                if similarity is not None and similar < settings.theta_cross:
                    reason = f"the translation fails the semantic check (S = {similar:.3f} < θ' = {settings.theta_cross})"
        if reason:
            dropped.append({"seed_id": row["seed_id"], "reason": reason, "rate_ori": rate, "similarity": similar})
            continue
        k = row["choices"].index(row["answer"])  # the answer is the translation of the English answer's choice
        seeds.append({**row, "oriquestion": row["question"], "transori": t["text"], "transchoices": t["choices"],
                      "transanswer": t["choices"][k], "language": code, "language_name": target_name,
                      "prequestion": "", "sufquestion": "", "transpre": "", "transsuf": "", "rate_ori": rate,
                      "similarity": similar})
    return pd.DataFrame(seeds), pd.DataFrame(dropped, columns=["seed_id", "reason", "rate_ori", "similarity"])


# ----------------------------------------------------------------------------------------------- search

@dataclass
class Node:
    """A bilingual question in the search: its seed, added context in both languages, and scores."""

    seed: dict
    node_id: str
    parent_id: str | None = None
    depth: int = 0
    pre: str = ""
    suf: str = ""
    trans_pre: str = ""
    trans_suf: str = ""
    rate_ori: float = 1.0
    rate_trans: float = float("nan")
    value: float = float("nan")
    wrong_option: str = ""
    perturbation: str = ""
    translation: str = ""
    placement: str = ""
    sim_en: float = float("nan")
    sim_cross: float = float("nan")
    status: str = ""

    def english(self) -> str:
        return _join(self.pre, self.seed["oriquestion"], self.suf, "en")

    def target(self) -> str:
        return _join(self.trans_pre, self.seed["transori"], self.trans_suf, self.seed["language"])

    def answer_index(self) -> int:
        return self.seed["choices"].index(self.seed["answer"])

    def record(self) -> dict:
        """The candidate in the released record format (loadable by `pitfalls.load_pitfalls`)."""
        s = self.seed
        return {"question": self.english(), "choices": s["choices"], "answer": s["answer"],
                "oriquestion": s["oriquestion"], "transori": s["transori"], "transquestion": self.target(),
                "transchoices": s["transchoices"], "transanswer": s["transanswer"], "category": s["category"],
                "source": s["source"], "prequestion": self.pre, "sufquestion": self.suf, "transpre": self.trans_pre,
                "transsuf": self.trans_suf, "value": self.value, "rate_ori": self.rate_ori,
                "rate_trans": self.rate_trans, "seed_id": s["seed_id"], "node_id": self.node_id, "depth": self.depth}


def _join(pre: str, question: str, suf: str, language: str) -> str:
    """⊕ of §2.2 as the release computes it (run.py: `prequestion + oriquestion + sufquestion`, the added
    distraction `distraction + prequestion` or `sufquestion + distraction`): plain concatenation, in every
    language (the released data's questions are exactly these sums)."""
    return "".join((pre, question, suf))


@dataclass
class SearchResult:
    candidates: pd.DataFrame
    trace: pd.DataFrame
    seeds_dropped: pd.DataFrame = field(default_factory=pd.DataFrame)

    def records(self) -> list[dict]:
        return self.candidates.to_dict("records")


def beam_search(seeds: pd.DataFrame, perturber, translator, models, settings: SearchSettings = SearchSettings(),  # noqa: B008 (frozen)
                templates: pd.DataFrame | None = None, cache: Path | None = None, progress: bool = False,
                similarity: Callable | None = None) -> SearchResult:
    """Run the search over `seeds` (from `prepare_seeds`, or released records with empty context) in
    batches of `settings.batch_size`; see the module docstring for the algorithm."""
    templates = load_templates(settings.templates) if templates is None else templates
    models = as_simulation_models(models)
    candidates, trace = [], []
    batches = [seeds.iloc[i:i + settings.batch_size] for i in range(0, len(seeds), settings.batch_size)]
    for batch in tqdm(batches, desc="search", unit="batch", disable=not progress, dynamic_ncols=True):
        found, steps = _search_batch(batch.to_dict("records"), perturber, translator, models, settings, templates,
                                     cache, similarity)
        candidates += found
        trace += steps
    return SearchResult(pd.DataFrame(candidates), pd.DataFrame(trace))


def _search_batch(seeds: list[dict], perturber, translator, models, settings: SearchSettings, templates: pd.DataFrame,
                  cache: Path | None, similarity: Callable | None) -> tuple[list[dict], list[dict]]:
    beam = [Node(seed=s, node_id=s["seed_id"], rate_ori=s.get("rate_ori", 1.0)) for s in seeds]
    count = {s["seed_id"]: 0 for s in seeds}
    candidates, trace = [], []
    depth, limit = 0, settings.depth
    while depth < limit and beam:
        depth += 1
        children = _expand(beam, depth, perturber, translator, settings, templates, cache)
        _score(children, models, settings, similarity)
        children.sort(key=lambda n: -n.value if not np.isnan(n.value) else np.inf)  # stable on ties
        for child in children:
            if np.isnan(child.value):
                continue
            if child.value >= settings.potential:
                limit = settings.max_depth
            if child.value >= settings.inclusion and count[child.seed["seed_id"]] < settings.redundancy:
                count[child.seed["seed_id"]] += 1
                candidates.append(child.record())
                child.status = "included"
        alive = [c for c in children if not np.isnan(c.value) and c.rate_trans > 0
                 and count[c.seed["seed_id"]] < settings.redundancy]
        beam = alive[:settings.width]
        in_beam = {c.node_id for c in beam}
        for child in children:
            trace.append({"seed_id": child.seed["seed_id"], "node_id": child.node_id, "parent_id": child.parent_id,
                          "depth": child.depth, "wrong_option": child.wrong_option, "placement": child.placement,
                          "perturbation": child.perturbation, "translation": child.translation,
                          "sim_en": child.sim_en, "sim_cross": child.sim_cross,
                          "rate_ori": child.rate_ori, "rate_trans": child.rate_trans, "value": child.value,
                          "status": child.status or ("kept" if child.node_id in in_beam else "pruned"),
                          "in_beam": child.node_id in in_beam, "depth_limit": limit})
    return candidates, trace


def _expand(beam: list[Node], depth: int, perturber, translator, settings: SearchSettings, templates: pd.DataFrame,
            cache: Path | None) -> list[Node]:
    """One child per (question in the beam, wrong option): perturb, translate, attach before or after."""
    perturb, _ = template_for(templates, "perturb", "en")
    specs = [(node, wrong) for node in beam for wrong in node.seed["choices"] if wrong != node.seed["answer"]]
    prompts = [perturb.format(question=node.english(), answer=node.seed["answer"], wrong_answer=wrong)
               for node, wrong in specs]
    perturbations = [clean(o) for o in _generate(perturber, prompts, settings, cache, settings.perturb_temperature)]
    language_name = beam[0].seed["language_name"] if beam else ""
    translations = translate_texts(perturbations, language_name, translator, templates, settings, cache)
    children = []
    for k, ((node, wrong), delta, trans) in enumerate(zip(specs, perturbations, translations, strict=True)):
        before = len(delta) % 2 == 1  # the released code's placement rule
        child = Node(seed=node.seed, node_id=f"{node.node_id}.{k}", parent_id=node.node_id, depth=depth,
                     pre=node.pre, suf=node.suf, trans_pre=node.trans_pre, trans_suf=node.trans_suf,
                     wrong_option=wrong, perturbation=delta, translation=trans, placement="before" if before else "after")
        if not delta or not trans:
            child.rate_ori, child.status = 0.0, "no_text"  # nothing generated: kept in the trace only
        elif before:
            child.pre = _join(delta, node.pre, "", "en")
            child.trans_pre = _join(trans, node.trans_pre, "", node.seed["language"])
        else:
            child.suf = _join(node.suf, delta, "", "en")
            child.trans_suf = _join(node.trans_suf, trans, "", node.seed["language"])
        children.append(child)
    return children


def _score(children: list[Node], models: list, settings: SearchSettings, similarity: Callable | None) -> None:
    """Eq. 4's semantic checks (with a similarity), then β^E for every child left, then β^T and V for those
    every model still answers right in English."""
    live = [c for c in children if not c.status]
    if similarity is not None and live:
        scores = similarity([(c.seed["oriquestion"], c.english()) for c in live]
                            + [(c.english(), c.target()) for c in live])
        for child, s_en, s_cross in zip(live, scores[:len(live)], scores[len(live):], strict=True):
            child.sim_en, child.sim_cross = s_en, s_cross
            if s_en < settings.theta or s_cross < settings.theta_cross:
                child.status = "semantic_failed"
        live = [c for c in live if not c.status]
    english = simulate(models, [c.english() for c in live], [c.seed["choices"] for c in live],
                       [c.answer_index() for c in live], ["en"] * len(live))
    for child, rate in zip(live, english, strict=True):
        child.rate_ori = float(rate)
        if rate < settings.english_min:
            child.status = "english_failed"
    kept = [c for c in live if not c.status]
    target = simulate(models, [c.target() for c in kept], [c.seed["transchoices"] for c in kept],
                      [c.seed["transchoices"].index(c.seed["transanswer"]) for c in kept],
                      [c.seed["language"] for c in kept])
    for child, rate in zip(kept, target, strict=True):
        child.rate_trans = float(rate)
        child.value = float(simulation_score(child.rate_ori, rate, settings.gamma))


def direct_perturbation(seeds: pd.DataFrame, perturber, translator, models, settings: SearchSettings = SearchSettings(),  # noqa: B008 (frozen)
                        templates: pd.DataFrame | None = None, cache: Path | None = None) -> pd.DataFrame:
    """The DP baseline of §3.2 (Table 1): each seed perturbed once with App. E's "Template for Adding
    Direct Perturbation" (no search), the new question translated, β^E, β^T and V scored; `converted` is
    V ≥ θinc. With an empty template output the seed counts as not converted."""
    templates = load_templates(settings.templates) if templates is None else templates
    models = as_simulation_models(models)
    direct, _ = template_for(templates, "direct_perturb", "en")
    asked = [clean(o) for o in _generate(perturber, [direct.format(question=q) for q in seeds["oriquestion"]],
                                         settings, cache, settings.perturb_temperature)]
    target = [""] * len(asked)
    for name in dict.fromkeys(seeds["language_name"]):
        mine = [i for i, n in enumerate(seeds["language_name"]) if n == name]
        for i, text in zip(mine, translate_texts([asked[i] for i in mine], name, translator, templates, settings, cache),
                           strict=True):
            target[i] = text
    rows = seeds[["seed_id", "language", "language_name"]].copy()
    rows["question"], rows["transquestion"] = asked, target
    ok = [bool(a and t) for a, t in zip(asked, target, strict=True)]
    en = simulate(models, [a for a, good in zip(asked, ok, strict=True) if good],
                  [c for c, good in zip(seeds["choices"], ok, strict=True) if good],
                  [c.index(a) for c, a, good in zip(seeds["choices"], seeds["answer"], ok, strict=True) if good],
                  ["en"] * sum(ok))
    tg = simulate(models, [t for t, good in zip(target, ok, strict=True) if good],
                  [c for c, good in zip(seeds["transchoices"], ok, strict=True) if good],
                  [c.index(a) for c, a, good in zip(seeds["transchoices"], seeds["transanswer"], ok, strict=True) if good],
                  [lang for lang, good in zip(seeds["language"], ok, strict=True) if good])
    rows["rate_ori"], rows["rate_trans"] = np.nan, np.nan
    rows.loc[ok, "rate_ori"], rows.loc[ok, "rate_trans"] = en, tg
    rows["value"] = simulation_score(rows["rate_ori"], rows["rate_trans"], settings.gamma)
    rows["converted"] = (rows["rate_ori"] >= settings.english_min) & (rows["value"] >= settings.inclusion)
    return rows


def no_perturbation(seeds: pd.DataFrame, models, settings: SearchSettings = SearchSettings()) -> pd.DataFrame:  # noqa: B008
    """The NP baseline of §3.2 (Table 1): the seeds' plain translations, no added context, scored with
    β^E (kept from the seed step), β^T and V; `converted` is V ≥ θinc with β^E ≥ 1 − ε."""
    models = as_simulation_models(models)
    rows = seeds[["seed_id", "language", "language_name"]].copy()
    rows["rate_ori"] = seeds["rate_ori"].to_numpy(float)
    rows["rate_trans"] = simulate(models, seeds["transori"].tolist(), seeds["transchoices"].tolist(),
                                  [c.index(a) for c, a in zip(seeds["transchoices"], seeds["transanswer"], strict=True)],
                                  seeds["language"].tolist())
    rows["value"] = simulation_score(rows["rate_ori"], rows["rate_trans"], settings.gamma)
    rows["converted"] = (rows["rate_ori"] >= settings.english_min) & (rows["value"] >= settings.inclusion)
    return rows


def table1_frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["language", "seeds", "np", "dp", "ours", "np_converted", "dp_converted",
                                       "ours_converted"])


def conversion_table(language_name: str, seeds: int, np_rows: pd.DataFrame, dp_rows: pd.DataFrame,
                     candidates: list[dict]) -> dict:
    """One row of Table 1: the share of seed questions converted into weakness questions by no
    perturbation, direct perturbation and the search (a seed with at least one candidate)."""
    ours = len({c["seed_id"] for c in candidates})
    row = {"language": language_name, "seeds": seeds}
    for name, converted in (("np", int(np_rows["converted"].sum())), ("dp", int(dp_rows["converted"].sum())),
                            ("ours", ours)):
        row[f"{name}_converted"], row[name] = converted, converted / seeds if seeds else float("nan")
    return row


# ------------------------------------------------------------------------------------- expanded pairs

def expand_pairs(questions: pd.DataFrame, languages: list[str], translator, settings: SearchSettings = SearchSettings(),  # noqa: B008 (frozen)
                 templates: pd.DataFrame | None = None, cache: Path | None = None, per_language: int | None = None,
                 sample_seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The expanded pairs of §3.3 (App. B.2): for every seed language y among `questions` (rows of
    `pitfalls.load_pitfalls`; `per_language` of each sampled, the paper: 100), the target-language
    portion of each pair translated into every other language x of `languages` (English names): the
    original question with its choices and answer by the App. E template, the added context (transpre,
    transsuf) by plain translation. x = y keeps the pair as it is. Rows are in `load_pitfalls`' format
    with `language` = x and `seed_language` = y; the answer is the translation of the seed answer's
    choice. Returns (pairs, dropped with the reason)."""
    templates = load_templates(settings.templates) if templates is None else templates
    questions = questions.copy()
    questions.attrs = {}  # the loader's report (DataFrames) would make pandas compare frames when concatenating
    frames, dropped = [], []
    for _, seeds in questions.groupby("language_name", sort=False):
        if per_language is not None and len(seeds) > per_language:
            seeds = seeds.sample(per_language, random_state=sample_seed).sort_index()
        y = seeds["language"].iloc[0]
        frames.append(seeds.assign(seed_language=y))
        for name_x in languages:
            x = language_code(name_x)
            if x == y:
                continue
            records = translate_records(seeds["transori"].tolist(), seeds["transchoices"].tolist(),
                                        seeds["transanswer"].tolist(), name_x, translator, templates, settings, cache)
            pre = translate_texts(seeds["transpre"].fillna("").tolist(), name_x, translator, templates, settings, cache)
            suf = translate_texts(seeds["transsuf"].fillna("").tolist(), name_x, translator, templates, settings, cache)
            rows = []
            for q, t, p, s in zip(seeds.to_dict("records"), records, pre, suf, strict=True):
                if t is None:
                    dropped.append({"question_id": q["question_id"], "language": x, "seed_language": y,
                                    "reason": "the translation is not the JSON the template asks for, or has another "
                                              "number of choices"})
                    continue
                answer = t["choices"][q["transanswer_index"]]
                rows.append({**q, "question_id": f"{q['question_id']}>{x}", "language": x, "language_name": name_x,
                             "seed_language": y, "transori": t["text"], "transchoices": t["choices"],
                             "transanswer": answer, "transanswer_index": q["transanswer_index"], "transpre": p,
                             "transsuf": s, "transquestion": _join(p, t["text"], s, x)})
            if rows:
                frames.append(pd.DataFrame(rows))
    pairs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return pairs, pd.DataFrame(dropped, columns=["question_id", "language", "seed_language", "reason"])


def cross_evaluate(models: list, pairs: pd.DataFrame, reduction: str = "per_byte") -> pd.DataFrame:
    """Likelihood evaluation rows of expanded pairs (their perturbed target-language question) for every
    model in `models` (LoadedModels), concatenated; `pitfalls.affinity_accuracy` averages them over models."""
    from babelprobe.benchmarks.pitfalls.answers import score_pitfalls

    if isinstance(models, LoadedModel):
        models = [models]
    return pd.concat([score_pitfalls(lm, pairs, reduction=reduction, progress=False,
                                     variants=(("target", "perturbed"),)) for lm in models], ignore_index=True)


# -------------------------------------------------------------------------------------------------- CLI

def _chat(models, spec: str, chat_template: str):
    """A generator by spec, through its model's chat template as `chat_template` says (local ones)."""
    from babelprobe.benchmarks.core.generate import with_chat_template

    generator = models.generator(spec)
    return with_chat_template(generator, chat_template) if spec.startswith("local") else generator


def simulation_answerers(models, settings: SearchSettings, sim_models: list[str] = (), reduction: str = "per_byte"):
    """The simulation models: the local model and `sim_models`, answering by likelihood (model specs), or,
    with `settings.answer == "generate"`, the release's way (`ReleaseAnswerer`: generator specs, a bare model
    spec meaning `local:SPEC`; the extractor `settings.extractor`, default each model itself)."""
    from babelprobe.runtime import Runtime

    if settings.answer == "likelihood":
        return [LikelihoodAnswerer(models.lm, reduction)] + [LikelihoodAnswerer(Runtime(model=spec).lm, reduction)
                                                             for spec in sim_models]
    specs = ["local", *(s if s.startswith(("local", "openai:", "openai-completions:")) else f"local:{s}"
                        for s in sim_models)]
    extractor = None if settings.extractor == "generator" else _chat(models, settings.extractor, settings.chat_template)
    return [ReleaseAnswerer(_chat(models, spec, settings.chat_template), extractor,
                            max_new_tokens=settings.max_new_tokens) for spec in specs]


def search_languages(source: str | Path, languages: list[str], models, settings: SearchSettings, out: str | Path,
                     perturber: str = "local", translator: str = "local", sim_models: list[str] = (),
                     reduction: str = "per_byte", limit: int | None = None, overwrite: bool = False,
                     progress: bool = True) -> dict[str, tuple[int, int, list[dict]]]:
    """Search every target language (English names) from the English `source` questions; writes
    `OUT/<Language>.json` (candidates, loadable by `load_pitfalls`), `trace-<Language>.csv` and
    `seeds-dropped-<Language>.csv`. Generated text is kept in `OUT/generations.jsonl`, so a rerun resumes.
    Returns, per language, (seeds kept, seeds read, candidate records)."""
    from babelprobe.benchmarks.base import as_models
    from babelprobe.runs import open_run
    from babelprobe.tables import atomic_path, write_table

    models = as_models(models)
    release = load_release()
    for name in languages:  # clear errors for an unknown language or one without a release prompt, before any work
        code = language_code(name)
        if settings.translation == "release":
            release_template(release, "translate", code)
        if settings.answer == "generate":
            release_template(release, "simulate", code)
    templates = load_templates(settings.templates)
    questions = load_source_questions(source, limit)
    answerers = simulation_answerers(models, settings, sim_models, reduction)
    perturb, translate = (_chat(models, spec, settings.chat_template) for spec in (perturber, translator))
    identity = {"benchmark": "pitfalls-search", "fingerprint": models.lm.fingerprint,
                "sim_models": [m.name for m in answerers], "perturber": perturb.name, "translator": translate.name,
                "reduction": reduction, "settings": vars(settings)}
    lm = models.lm
    run = open_run(out, identity, record={"model": lm.name, "data": str(source)}, overwrite=overwrite,
                   what="a Pitfalls search")
    cache = run.path / "generations.jsonl"
    for answerer in answerers:  # generated simulation answers are kept beside the rest (resumable)
        if isinstance(answerer, ReleaseAnswerer):
            answerer.cache = cache
    judge = settings.similarity
    if settings.semantic_check and judge == "none":
        judge = "llm:local"  # babelprobe's choice: the local model judges (the release asked gpt-4o)
    similarity = make_similarity(judge, models, templates, settings, cache)
    found, table1 = {}, []
    for name in languages:
        seeds, dropped = prepare_seeds(questions, name, translate, answerers, settings, templates, cache, similarity)
        result = beam_search(seeds, perturb, translate, answerers, settings, templates, cache, progress,
                             similarity) if len(seeds) else None
        records = result.records() if result else []
        if settings.baselines:
            np_rows = no_perturbation(seeds, answerers, settings) if len(seeds) else pd.DataFrame(columns=["converted"])
            dp_rows = (direct_perturbation(seeds, perturb, translate, answerers, settings, templates, cache)
                       if len(seeds) else pd.DataFrame(columns=["converted"]))
            table1.append(conversion_table(name, len(seeds), np_rows, dp_rows, records))
            write_table(table1_frame(table1), run.path / "table1.csv")
        with atomic_path(run.path / f"{name}.json") as tmp:
            tmp.write_text(json.dumps(records, ensure_ascii=False, indent=1), encoding="utf-8")
        if result is not None and len(result.trace):
            write_table(result.trace, run.path / f"trace-{name}.csv")
        write_table(dropped, run.path / f"seeds-dropped-{name}.csv")
        found[name] = (len(seeds), len(questions), records)
    return found
