"""The StingrayBench questions: the prompt file (data/prompts/stingray.tsv, the released code's prompts;
`load_prompts`), one request per record and question (`build_requests`) and how a question meets the
model's chat template (`chat_renderer`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from babelprobe.benchmarks.core.options import CHAT_TEMPLATE
from babelprobe.benchmarks.stingray.settings import TASKS
from babelprobe.errors import BabelprobeError
from babelprobe.prompts import check_placeholders, read_prompts

if TYPE_CHECKING:
    from babelprobe.models import LoadedModel

PROMPT_KEYS = ("semantic", "usage_l1", "usage_l2")
PLACEHOLDERS = {"semantic": ("lang1_sentence", "lang2_sentence"), "usage_l1": ("lang1_sentence",),
                "usage_l2": ("lang2_sentence",)}
WORD_FIELDS = ("word", "word_l1", "word_l2", "meaning_l1", "meaning_l2", "lang_en_sentence")


def load_prompts(path: str | Path | None = None) -> dict:
    """The prompt set: {task: {"template", "answer", "options", "line"}} for semantic, usage_l1, usage_l2,
    from a prompt file (`prompts.read_prompts`; default the released one, data/prompts/stingray.tsv)
    with columns task, template, options (labels separated by |) and optionally answer (the cue after
    the template in plain-text likelihood scoring). Usage options are [yes, no]; semantic [A, B, C]."""
    rows = read_prompts(path or "stingray", ("task", "template", "options"), optional=("answer",))
    prompts = {r["task"]: {"template": r["template"], "answer": r.get("answer") or "",
                           "options": r["options"].split("|"), "line": r["line"]} for r in rows.to_dict("records")}
    for key, n_options in zip(PROMPT_KEYS, (3, 2, 2), strict=True):
        if key not in prompts:
            raise BabelprobeError(f"{rows['line'].iloc[0].rsplit(':', 1)[0]}: no row for task {key!r}")
        if len(prompts[key]["options"]) != n_options:
            raise BabelprobeError(f"{prompts[key]['line']}: task {key!r} needs {n_options} options separated by |")
        other = [p for p in PLACEHOLDERS["semantic"] if p not in PLACEHOLDERS[key]]
        check_placeholders(prompts[key]["template"], prompts[key]["line"], PLACEHOLDERS[key],
                           allowed=WORD_FIELDS + tuple(other), once=False)
    return prompts


def build_requests(records: pd.DataFrame, prompts: dict | None = None,
                   tasks: tuple[str, ...] = TASKS, split_words: bool = True) -> pd.DataFrame:
    """One row per record × question: the `question` (the filled template), the plain likelihood
    `prompt` (question + answer cue), its answer options, the gold option and the side it is about.
    `split_words`: a true cognate's usage question names the word of its language ({word_l1} / {word_l2},
    as the released src/generation_baseline.py splits "L1 word, L2 word"); False: both name the record's
    unsplit word, "w1, w2", as the released src/likelihood_eval.py passes it."""
    prompts = prompts or load_prompts()
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise BabelprobeError(f"unknown StingrayBench task {', '.join(unknown)}; use {', '.join(TASKS)}")
    rows = []
    for record in records.to_dict("records"):
        fields = {k: record.get(k) or "" for k in ("lang1_sentence", "lang2_sentence", *WORD_FIELDS)}
        if not split_words:
            fields["word_l1"] = fields["word_l2"] = fields["word"]
        if "semantic" in tasks:
            answer = record["semantic_answer"]
            side = {"A": "L1", "B": "L2", "C": "both"}[answer]
            rows.append(_request(record, "semantic", side, prompts["semantic"], fields, "ABC".index(answer)))
        if "usage" in tasks:
            for side in ("L1", "L2"):
                gold = 0 if record[f"usage_{side.lower()}"] == "Yes" else 1
                rows.append(_request(record, "usage", side, prompts[f"usage_{side.lower()}"], fields, gold))
    return pd.DataFrame(rows)


def _request(record: dict, task: str, side: str, prompt: dict, fields: dict, gold: int) -> dict:
    language = {"L1": record["l1"], "L2": record["l2"], "both": f"{record['l1']}-{record['l2']}"}[side]
    question = prompt["template"].format(**fields)
    return {"item_id": f"{record['record_id']}-{task}" + ("" if task == "semantic" else f"-{side.lower()}"),
            "pair_id": record["record_id"], "language": language, "subset": record["subset"],
            "pair": record["pair"], "task": task, "side": side, "word": record["word"],
            "question": question, "prompt": question + prompt["answer"], "options": list(prompt["options"]),
            "gold": gold}


def chat_renderer(lm: LoadedModel, chat: str):
    """How a question becomes the model's text: (render or None, prompt_format). `chat` off: plain
    text; auto: the chat template when the tokenizer has one, else plain; on: the chat template or a
    one-line error. The question is the user turn and the assistant turn is opened (its first tokens
    are the answer); a BOS the template writes is dropped because encoding puts BOS first anyway."""
    if chat not in CHAT_TEMPLATE:
        raise BabelprobeError(f"--chat-template: unknown value {chat!r}; use {', '.join(CHAT_TEMPLATE)}")
    template = getattr(lm.tokenizer, "chat_template", None)
    if chat == "off" or (chat == "auto" and not template):
        return None, "plain"
    if not template:
        raise BabelprobeError(f"model {lm.name} has no chat template (a base model?); use --chat-template auto or off")
    bos = lm.tokenizer.bos_token if lm.bos_policy == "bos" else None

    def render(question: str) -> str:
        try:
            text = lm.tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                    add_generation_prompt=True)
        except Exception as err:  # templates that reject the role or fail to render: user-facing
            raise BabelprobeError(f"cannot render the chat template of {lm.name}: {str(err).splitlines()[0]}") from err
        return text[len(bos):] if bos and text.startswith(bos) else text

    return render, "chat"
