"""Multiple-choice questions as items: one item per answer option, in the form lm-evaluation-harness asks them.

Both doors into harness-style scoring build their items here: the hand-written bridges (`benchmarks/bridges`:
MultiBLiMP, Belebele, XNLI, PAWS-X read from their releases) and any harness task (`babelprobe.lmeval`: the
harness's own task objects). It sits in the items layer so that `load_items("lm-eval:...")` can use it
(docs/design.md "Layers").

A question is a dict (a row of a frame) with `id`, `language`, `subset`, `config`, `context` (or `contexts`,
one per option: the harness's "multiple input" tasks, XWinograd), `delimiter`, `choices` (what the harness
normalises by: `acc_norm` divides an option's LL by its characters, `acc_bytes` by its UTF-8 bytes),
`targets` (what follows the delimiter in each request; default: the choices; under multiple input the one
shared target), `gold` (the gold option's index) and optionally `parallel_id`, `template_note`, `splits`
(MultiBLiMP: the release's own prefix/continuation split of each option) and the fields named in `keep`.

Items (docs/design.md "Contracts: Items"): `pair_id` = NAME-CONFIG-ID names the question, `label` is 1 for the
gold option and 0 for the others, `prefix` is the option's context and `continuation` the delimiter and its
target (`text` = prefix + continuation); `context`, `delimiter`, `choice`, `target`, `option` (its index),
`gold`, `n_options`, `config`, `script` and `template_note` keep what scoring needs.
"""

from __future__ import annotations

import sys
import unicodedata
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def options(name: str, questions: pd.DataFrame, keep: tuple[str, ...] = ()) -> pd.DataFrame:
    """One item per option of every question (module docstring); `name` begins every pair_id."""
    import pandas as pd

    scripts = {language: text_script([c for q in group.to_dict("records") for c in _contexts(q)] +
                                     [c for cs in group["choices"] for c in cs])
               for language, group in questions.groupby("language", sort=False)}
    rows = []
    for q in questions.to_dict("records"):
        pair_id = f"{name}-{q['config']}-{q['id']}"
        contexts, targets = _contexts(q), _targets(q)
        splits = q.get("splits")
        for i, choice in enumerate(q["choices"]):
            continuation = q["delimiter"] + targets[i]
            # MultiBLiMP: the release's own split, (None, None) where it has none (the fields stay empty)
            prefix, rest = splits[i] if isinstance(splits, list) else (contexts[i], continuation)
            rows.append({"item_id": f"{pair_id}-{i}", "pair_id": pair_id, "language": q["language"],
                         "subset": q["subset"], "label": int(i == q["gold"]), "text": contexts[i] + continuation,
                         "prefix": prefix, "continuation": rest, "context": contexts[i], "delimiter": q["delimiter"],
                         "choice": choice, "target": targets[i], "option": i, "gold": q["gold"],
                         "n_options": len(q["choices"]), "config": q["config"], "script": scripts[q["language"]],
                         "template_note": q.get("template_note", "") or "",
                         **({"parallel_id": q["parallel_id"]} if "parallel_id" in q else {}),
                         **{field: q[field] for field in keep}})
    return pd.DataFrame(rows)


def _contexts(question: dict) -> list[str]:
    contexts = question.get("contexts")
    return list(contexts) if isinstance(contexts, list) else [question["context"]] * len(question["choices"])


def _targets(question: dict) -> list[str]:
    targets = question.get("targets")
    return list(targets) if isinstance(targets, list) else list(question["choices"])


SCRIPT_OF_NAME = {"CJK": "Han", "HIRAGANA": "Kana", "KATAKANA": "Kana", "HALFWIDTH": "Kana"}


def text_script(texts: list[str]) -> str:
    """The writing system most of the letters of `texts` are in ('Latin', 'Cyrillic', 'Han', 'Arabic', ...;
    'Japanese' where Kana are among them), by the first word of each letter's Unicode name (as
    `latent.tokens.token_script` names a token's)."""
    counts = Counter()
    for text in texts:
        for char in text:
            if unicodedata.category(char).startswith("L"):
                first = unicodedata.name(char, "UNKNOWN").split()[0]
                counts[SCRIPT_OF_NAME.get(first, first.title())] += 1
    if not counts:
        return "none"
    return "Japanese" if counts["Kana"] else counts.most_common(1)[0][0]


def report_skipped(items: pd.DataFrame, where: str, unit: str = "records", by: str = "language") -> None:
    """One line per language (or other field `by` of the problems) with skipped questions on stderr (a
    reader's `items.attrs["skipped"]` and `attrs["read"]`): how many of how many `unit`, and the first three
    reasons."""
    grouped: dict[str, list[dict]] = {}
    for problem in items.attrs.get("skipped", []):
        grouped.setdefault(problem[by], []).append(problem)
    for group, problems in grouped.items():
        reasons = "; ".join(f"{p['source']}: {p['reason']}" for p in problems[:3])
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        print(f"babelprobe: {where} [{group}]: skipped {len(problems)} of {items.attrs['read'][group]} "
              f"{unit} that cannot be scored ({reasons}{more})", file=sys.stderr)
