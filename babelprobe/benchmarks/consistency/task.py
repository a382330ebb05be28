"""Task definitions and prompt files of the self-consistency benchmark: the classification tasks with
their input fields, labels and label words per language (data/prompts/consistency.json: `load_spec`,
`get_task`, `Task`) and the prompts (`load_prompts`, `Prompts`): the instruction in three parts per task
and language (App. B, Table 6; consistency_instructions.tsv), the App. B task template, App. C's
translation prompts, babelprobe's one-shot translation and paraphrase prompts and answer cues
(consistency_prompts.tsv)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from babelprobe.bundled import DATA
from babelprobe.errors import BabelprobeError
from babelprobe.languages import language_names
from babelprobe.prompts import check_placeholders, read_prompts

SPEC_FILE = DATA / "prompts" / "consistency.json"
INSTRUCTIONS = "consistency_instructions"
PROMPTS = "consistency_prompts"
PARTS = ("prefix", "sentence", "suffix")  # the instruction parts §3.3 translates in separate requests


@dataclass
class Task:
    """A classification task: its input fields, labels and label words per language."""

    name: str
    fields: list[str]
    labels: list[int]
    label_words: dict[str, dict[int, list[str]]]  # language (or "*") -> label -> words, first = main

    def words(self, language: str, where: str = "") -> dict[int, list[str]]:
        if language in self.label_words:
            return self.label_words[language]
        if "*" in self.label_words:
            return self.label_words["*"]
        raise BabelprobeError(f"task {self.name} has no label words for language {language!r}{where}; add them "
                              f"to 'label_words' in the task file (--spec), e.g. copy {SPEC_FILE.name}")


def load_spec(path: str | Path | None = None) -> dict:
    """The task definitions (data/prompts/consistency.json or your own file)."""
    file = Path(path) if path else Path(str(SPEC_FILE))
    try:
        spec = json.loads(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise BabelprobeError(f"cannot read task file {file}: {err.strerror}") from err
    except json.JSONDecodeError as err:
        raise BabelprobeError(f"{file}:{err.lineno}: malformed JSON ({err.msg})") from err
    if "tasks" not in spec:
        raise BabelprobeError(f"{file}: missing top-level field 'tasks'")
    return spec


def get_task(name: str, spec: dict) -> Task:
    if name not in spec["tasks"]:
        raise BabelprobeError(f"unknown task {name!r}; the task file defines {', '.join(spec['tasks'])}")
    t = spec["tasks"][name]
    for key in ("fields", "labels", "label_words"):
        if key not in t:
            raise BabelprobeError(f"task {name} lacks field {key!r} in the task file")
    if len(t["fields"]) != 2:
        raise BabelprobeError(f"task {name}: the task prompt (App. B) takes two input fields, not {t['fields']}")
    labels = sorted(int(k) for k in t["labels"])
    words = {lang: {int(k): list(v) for k, v in table.items()} for lang, table in t["label_words"].items()}
    for lang, table in words.items():
        if sorted(table) != labels:
            raise BabelprobeError(f"task {name}: label words for {lang!r} cover labels {sorted(table)}, not {labels}")
    return Task(name=name, fields=list(t["fields"]), labels=labels, label_words=words)


@dataclass
class Prompts:
    """The prompt files: instructions per (task, language) and the templates by name (see `load_prompts`)."""

    task: str
    instructions: dict[tuple[str, str], dict[str, str]]
    paper: dict[tuple[str, str], str]  # (source, target) -> App. C template; "*" for any
    oneshot: str | None
    paraphrase: str | None
    cue: dict[str, str]
    example: dict[str, str]
    paraphrase_example: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)

    def instruction(self, task: str, language: str) -> dict[str, str]:
        """The three parts of the task's instruction in `language` (prefix, sentence, suffix)."""
        if (task, language) not in self.instructions:
            known = ", ".join(sorted(lang for t, lang in self.instructions if t == task))
            raise BabelprobeError(f"{self.files['instructions']}: no {task} instruction in {language!r} (has "
                                  f"{known}); add a row (task, language, prefix, sentence, suffix) and pass it "
                                  "with --instructions")
        return self.instructions[(task, language)]

    def question(self, parts: dict[str, str], texts: list[str], language: str, cue: bool) -> str:
        """The App. B task prompt around the two input texts, then the answer cue when asked."""
        prompt = self.task.format(**parts, text1=texts[0], text2=texts[1])
        if not cue:
            return prompt
        if language not in self.cue:
            raise BabelprobeError(f"{self.files['prompts']}: no answer cue ('cue' row) for language {language!r}, "
                                  "e.g. a row 'cue<TAB>de<TAB>*<TAB>Antwort:'; or use --no-cue")
        return f"{prompt}\n{self.cue[language]}"

    def translation(self, text: str, source: str, target: str, style: str) -> tuple[str, str]:
        """The prompt that asks for `text` in `target`, and the example answer it shows ('' if none)."""
        names = language_names()
        if style == "paper":
            template = next((self.paper[key] for key in ((source, target), (source, "*"), ("*", target), ("*", "*"))
                             if key in self.paper), None)
            if template is None:
                raise BabelprobeError(f"no App. C translation prompt from {source!r} into {target!r} (the paper gives "
                                      "en->any, de->en, zh->en); add a 'translate-paper' row to your prompt file "
                                      "(--prompts) or use --translation-prompt oneshot")
            return template.format(target=names.get(target, target), text=text), ""
        for lang in (source, target):
            if lang not in self.example:
                raise BabelprobeError(f"{self.files['prompts']}: no one-shot example sentence ('example' row) for "
                                      f"language {lang!r}; add one (the same sentence in every language)")
        prompt = self.oneshot.format(source=names.get(source, source), target=names.get(target, target),
                                     source_example=self.example[source], target_example=self.example[target],
                                     text=text)
        return prompt, self.example[target]

    def paraphrase_prompt(self, text: str, language: str) -> tuple[str, str]:
        if language not in self.example or language not in self.paraphrase_example:
            raise BabelprobeError(f"{self.files['prompts']}: no paraphrase example ('example' and "
                                  f"'paraphrase-example' rows) for language {language!r}; add them or use "
                                  "--baseline none")
        prompt = self.paraphrase.format(language=language_names().get(language, language),
                                        example=self.example[language],
                                        example_paraphrase=self.paraphrase_example[language], text=text)
        return prompt, self.paraphrase_example[language]


def load_prompts(instructions: str | Path | None = None, prompts: str | Path | None = None) -> Prompts:
    """The instruction file (task, language, prefix, sentence, suffix) and the template file (name,
    language, target, template); bundled ones unless paths are given."""
    table = read_prompts(instructions or INSTRUCTIONS, ("task", "language", *PARTS), optional=("origin",))
    found = {(r.task, r.language): {p: getattr(r, p) for p in PARTS} for r in table.itertuples(index=False)}
    rows = read_prompts(prompts or PROMPTS, ("name", "language", "target", "template"))
    by_name: dict[str, dict[tuple[str, str], str]] = {}
    for r in rows.itertuples(index=False):
        by_name.setdefault(r.name, {})[(r.language, r.target)] = r.template
        where = r.line
        if r.name == "task":
            check_placeholders(r.template, where, ("prefix", "suffix", "text1", "text2"), ("sentence",), once=False)
        elif r.name == "translate-paper":
            check_placeholders(r.template, where, ("text",), ("target",))
        elif r.name == "translate-oneshot":
            check_placeholders(r.template, where, ("text",), ("source", "target", "source_example", "target_example"),
                               once=False)
        elif r.name == "paraphrase":
            check_placeholders(r.template, where, ("text",), ("language", "example", "example_paraphrase"), once=False)
    if "task" not in by_name:
        raise BabelprobeError(f"{rows['line'].iloc[0].rsplit(':', 1)[0]}: no 'task' template row")

    def single(name: str) -> str | None:
        return next(iter(by_name.get(name, {}).values()), None)

    def per_language(name: str) -> dict[str, str]:
        return {lang: text for (lang, _), text in by_name.get(name, {}).items()}

    return Prompts(task=single("task"), instructions=found, paper=by_name.get("translate-paper", {}),
                   oneshot=single("translate-oneshot"), paraphrase=single("paraphrase"), cue=per_language("cue"),
                   example=per_language("example"), paraphrase_example=per_language("paraphrase-example"),
                   files={"instructions": table["line"].iloc[0].rsplit(":", 1)[0],
                          "prompts": rows["line"].iloc[0].rsplit(":", 1)[0]})
