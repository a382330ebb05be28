"""lm-evaluation-harness multiple-choice tasks as items (`--items lm-eval:TASK[,TASK...][@DIR]`,
`babelprobe items from-lm-eval`, `babelprobe bench lm-eval`).

The harness's own objects make the requests, never a copy of its YAML files: its `TaskManager` (the
installed task folder, plus a user's folder, `@DIR` or `--include-path DIR`, as its `--include_path`) finds
the tasks, expands groups and tags to their tasks and builds each `ConfigurableTask` (its dataset, its
`process_docs`, Jinja templates and `!function`s); `build_all_requests` makes every document's requests,
zero-shot unless the task's config sets `num_fewshot`, with the few-shot seed `simple_evaluate` uses
(lm_eval 0.4.13 `evaluator.py`: `fewshot_random_seed=DEFAULT_OTHER_SEED`, 1234). A task pointed at local
files (`dataset_path: json`, `dataset_kwargs: {data_files: ...}`) runs offline.

Each document is one question (`babelprobe.questions`): its requests' contexts and continuations (the
continuation is the task's `target_delimiter` and the choice, or under "multiple input", XWinograd, the
shared target after each context), the choices the harness normalises by (`doc_to_choice`), and the gold
index as `process_results` finds it (lm_eval/api/task.py, ConfigurableTask.process_results: `doc_to_text`
under multiple input, else `doc_to_target`; an int is the index, a string the choice it names). Items keep
`task`, `task_version`, `doc_id` (the harness's document index), `split`, `harness_metrics` (the task's
metric_list) and `parallel_id` = FAMILY-DOC_ID (the task's name without its language: `xcopa-0`), which joins
the same document across languages where a family's data sets are parallel (XCOPA, XStoryCloze, Belebele).
`subset` and `config` are the task's name. The language comes from the task's metadata (`language`),
else its `dataset_name`, else its name (`LANGUAGE_ALIASES`, ISO 639-3 and Belebele variants through
data/bridges/configs.csv, English language names), else `--language`.

Refused in one line before any data set is read: the harness not installed (the `lm-eval` extra), an
unknown task, a task that is not `multiple_choice` (its output type named), a missing include folder, a
task's local data file missing or unreadable (`check_data_files`). A task with several gold answers per
document (`multiple_target`) is refused after it is built; a document whose gold index is outside its
choices (the harness warns and scores it wrong) is skipped and counted.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from numbers import Integral
from pathlib import Path
from typing import TYPE_CHECKING

from babelprobe.bundled import bundled_sets
from babelprobe.errors import BabelprobeError
from babelprobe.languages import bridge_configs, codes_by_name, language_codes
from babelprobe.paths import check_path
from babelprobe.questions import options, report_skipped

if TYPE_CHECKING:
    import pandas as pd

PREFIX = "lm-eval:"
NAME = "lm-eval"
FEWSHOT_SEED = 1234  # lm_eval.defaults.DEFAULT_OTHER_SEED: simple_evaluate's fewshot_random_seed
SCORED_METRICS = ("acc", "acc_norm", "acc_bytes")  # what babelprobe computes of a task's metric_list
# task and data-set names the harness uses for a language that are not its ISO 639-1 code
LANGUAGE_ALIASES = {"jp": "ja"}
INSTALL = "pip install 'babelprobe[lm-eval]' (lm-evaluation-harness)"


@dataclass(frozen=True)
class Source:
    """What `lm-eval:TASK[,TASK...][@DIR]` names: task, group or tag names (glob patterns too, as the
    harness's `--tasks`), and the user's task folder."""

    tasks: tuple[str, ...]
    include_path: str | None = None

    def __str__(self) -> str:
        return PREFIX + ",".join(self.tasks) + (f"@{self.include_path}" if self.include_path else "")


def is_source(source) -> bool:
    """Whether `source` names harness tasks (`lm-eval:...`) or the bundled harness sample."""
    return isinstance(source, str) and (source.startswith(PREFIX) or source in bundled_sets(NAME))


def parse(source: str) -> Source:
    """`lm-eval:xcopa_et,xcopa_it@tasks/` -> Source(("xcopa_et", "xcopa_it"), "tasks/"); a bundled sample's
    name -> its tasks and folder."""
    if source in bundled_sets(NAME):
        return sample_source(source)
    body = source.removeprefix(PREFIX)
    names, at, folder = body.partition("@")
    tasks = tuple(dict.fromkeys(t.strip() for t in names.split(",") if t.strip()))
    if not tasks:
        raise BabelprobeError(f"{source!r} names no task; write lm-eval:TASK[,TASK...][@DIR] (e.g. lm-eval:xcopa_et)")
    if at and not folder.strip():
        raise BabelprobeError(f"{source!r}: nothing after '@'; give the folder of your task files or drop the '@'")
    return Source(tasks, folder.strip() or None)


def source_of(tasks: list[str] | tuple[str, ...], include_path: str | Path | None = None) -> str:
    """The `lm-eval:` spelling of a task list and folder (`--tasks`, `--include-path`)."""
    return str(Source(tuple(tasks), str(include_path) if include_path else None))


# ---------------------------------------------------------------------------------------- the harness

def harness():
    """The installed `lm_eval` package, or a one-line error saying how to install it."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager  # noqa: F401  (what every use needs: fail here, not midway)
    except ImportError as err:
        raise BabelprobeError(f"lm-evaluation-harness tasks need the lm_eval package, which does not import "
                              f"({err}); {INSTALL}") from err
    return lm_eval


def task_manager(include_path: str | None = None):
    """The harness's TaskManager: its installed tasks, then `include_path`'s (which override them, as in the
    harness). Built once per folder: indexing the installed tasks reads ~15k YAML files."""
    harness()  # every time: an uninstalled harness is one line even after a manager was built
    return _task_manager(include_path)


@cache
def _task_manager(include_path: str | None):
    from lm_eval.tasks import TaskManager

    with _quiet():
        return TaskManager(include_path=include_path)


@contextmanager
def _quiet():
    """The harness's INFO/WARNING log lines (a user task overriding an installed one, default aggregations) and
    the data sets' progress bars kept off stderr while tasks are indexed and built; errors still show."""
    from datasets.utils import logging as datasets_logging

    logger = logging.getLogger("lm_eval")
    level, bars = logger.level, datasets_logging.is_progress_bar_enabled()
    logger.setLevel(logging.ERROR)
    datasets_logging.disable_progress_bar()  # "Generating test split" per task file
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            datasets_logging.enable_progress_bar()


@dataclass
class Leaf:
    """One task to read: its name, what `TaskManager.load` builds it from (its name, or a group's inline
    config) and its config as the index has it (None for a Python task: checked once built)."""

    name: str
    spec: str | dict
    config: dict | None


@dataclass
class Resolved:
    """The tasks a source names (groups and tags expanded) and every group met on the way, with its leaf
    tasks, aggregate metrics and version."""

    leaves: list[Leaf]
    groups: dict[str, dict]


def resolve(source: Source) -> Resolved:
    """The tasks `source` names, groups and tags expanded, checked against the index before any data set is
    read: unknown names and tasks that are not multiple-choice are refused in one line."""
    if source.include_path is not None and not Path(source.include_path).expanduser().is_dir():
        raise BabelprobeError(f"lm-eval task folder {source.include_path!r} is not a directory")
    tm = task_manager(_folder(source))
    names = []
    for name in source.tasks:
        matched = tm.match_tasks([name]) if any(c in name for c in "*?[") else [name] if name in tm.task_index else []
        if not matched:
            raise BabelprobeError(_unknown(name, tm.all_tasks, source.include_path))
        names += matched
    leaves: dict[str, Leaf] = {}
    groups: dict[str, dict] = {}
    for name in names:
        for leaf in _leaves(tm, name, groups):
            leaves.setdefault(leaf.name, leaf)
    for leaf in leaves.values():
        kind = (leaf.config or {}).get("output_type", "generate_until" if leaf.config is not None else None)
        if kind is not None and kind != "multiple_choice":
            raise BabelprobeError(_not_multiple_choice(leaf.name, kind))
    return Resolved(list(leaves.values()), groups)


def _folder(source: Source) -> str | None:
    return str(Path(source.include_path).expanduser().resolve()) if source.include_path else None


def _leaves(tm, name: str, groups: dict[str, dict]) -> list[Leaf]:
    """The leaf tasks under `name`; the groups met go into `groups` (lm_eval/api/group.py `Group.aggregate`:
    a group's metrics are aggregated over all its leaf tasks)."""
    from lm_eval.tasks._index import Kind

    entry = tm.task_index[name]
    if entry.kind == Kind.TASK:
        return [Leaf(name, name, dict(entry.cfg or {}))]
    if entry.kind == Kind.PY_TASK:
        return [Leaf(name, name, None)]
    if name in groups:
        return []
    if entry.kind == Kind.TAG:
        children = sorted(entry.tags)
    else:  # a group: its `task` list (names, or inline configs that override a task's)
        listed = (entry.cfg or {}).get("task", [])
        children = list(listed) if isinstance(listed, list) else [listed]
        groups[name] = {}  # a group inside itself is read once
    out = []
    for child in children:
        if isinstance(child, dict):
            child_name = str(child.get("task"))
            base = tm.task_index.get(child_name)
            config = {**((base.cfg or {}) if base is not None else {}), **child}
            out.append(Leaf(child_name, child, config if "output_type" in config else None))
        elif child in tm.task_index:
            out += _leaves(tm, child, groups)
        else:
            raise BabelprobeError(f"lm-evaluation-harness group {name!r} lists {child!r}, which is no task it knows")
    if entry.kind == Kind.GROUP:
        aggregate = (entry.cfg or {}).get("aggregate_metric_list") or []
        aggregate = aggregate if isinstance(aggregate, list) else [aggregate]
        groups[name] = {"tasks": list(dict.fromkeys(leaf.name for leaf in out)),
                        "aggregate": [{"metric": str(a["metric"]), "weight_by_size": bool(a.get("weight_by_size", True))}
                                      for a in aggregate if isinstance(a, dict) and "metric" in a],
                        "version": str(((entry.cfg or {}).get("metadata") or {}).get("version", ""))}
    return out


def _unknown(name: str, known: list[str], include_path: str | None) -> str:
    import difflib

    close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    where = f" (installed tasks and those in {include_path})" if include_path else " (installed tasks; a folder of " \
        "your own: lm-eval:TASK@DIR or --include-path DIR)"
    return f"unknown lm-evaluation-harness task {name!r}{where}{hint}"


def _not_multiple_choice(name: str, kind: str) -> str:
    return (f"lm-evaluation-harness task {name!r} is a {kind} task; babelprobe reads multiple_choice tasks only "
            "(each document a question with choices to score)")


# ------------------------------------------------------------------------------------------- reading

def load(source: str, languages: list[str] | None = None, limit: int | None = None,
         language: str | None = None, report: bool = True) -> pd.DataFrame:
    """The items of `source` (`lm-eval:...` or the bundled sample): one per option of every document of every
    task; `languages` keeps tasks by their language (before any data set is read), `limit` the first N
    documents of each task (the harness's `--limit`), `language` is the language of tasks that do not say.
    `attrs`: `read` and `skipped` (documents per language), `harness` (each task's version, metrics and
    split; each group's tasks and aggregate metrics). `report` prints the skipped documents."""
    import pandas as pd

    parsed = parse(source) if isinstance(source, str) else source
    resolved = resolve(parsed)
    every = [(leaf, leaf_language(leaf, language)) for leaf in resolved.leaves]
    chosen = [(leaf, lang) for leaf, lang in every if not languages or lang in languages]
    if languages:
        have = {lang for _, lang in every}
        missing = sorted(set(languages) - have)
        if missing:
            raise BabelprobeError(f"{source}: no task in language {', '.join(missing)}; its tasks' languages are "
                                  f"{', '.join(sorted(have))}")
    for leaf, _ in chosen:  # every task's local files, before the first data set is read
        check_data_files(leaf)
    parts, read, skipped, tasks = [], Counter(), [], {}
    for leaf, lang in chosen:
        task = build(leaf, parsed)
        questions, problems = task_questions(task, leaf.name, lang, limit)
        read[lang] += len(questions) + len(problems)
        skipped += problems
        parts.append(questions)
        tasks[leaf.name] = task_record(task, lang)
    questions = pd.concat(parts, ignore_index=True)
    if questions.empty:  # every document skipped
        first = f"; first: {skipped[0]['source']}: {skipped[0]['reason']}" if skipped else ""
        raise BabelprobeError(f"{source}: no document can be scored ({len(skipped)} skipped{first})")
    keep = ("task", "task_version", "doc_id", "split", "harness_metrics")
    items = options(NAME, questions, keep=keep)
    items.attrs.update(read=dict(read), skipped=skipped, harness={"tasks": tasks, "groups": resolved.groups})
    if report:
        report_skipped(items, str(source), "documents")
    return items


def check_data_files(leaf: Leaf) -> None:
    """A task's local data files (`dataset_kwargs: {data_files: ...}` beside `dataset_path: json`, csv, ...)
    there and readable: one line naming the task and the file, instead of the data set library's traceback
    midway through the tasks. Globs and URLs are left to the data set library."""
    for file in local_data_files(leaf.config or {}):
        check_path(file, f"lm-evaluation-harness task {leaf.name!r} cannot be built: data file {file}", "file")


def local_data_files(config: dict) -> list[Path]:
    """The plain local paths among a task config's `dataset_kwargs.data_files` (a path, a list, or a dict of
    split -> path or list)."""
    files = (config.get("dataset_kwargs") or {}).get("data_files") if isinstance(config, dict) else None
    values = files.values() if isinstance(files, dict) else [files]
    paths = [v for value in values for v in (value if isinstance(value, (list, tuple)) else [value])]
    return [Path(p).expanduser() for p in paths
            if isinstance(p, str) and "://" not in p and not any(c in p for c in "*?[")]


def build(leaf: Leaf, source: Source):
    """The harness's task object (`TaskManager.load`), its data set read. A data set that cannot be read, a
    template that fails: one line naming the task."""
    tm = task_manager(_folder(source))
    try:
        with _quiet():
            task = tm.load([leaf.spec])["tasks"][leaf.name]
    except BabelprobeError:
        raise
    except Exception as err:  # a data set offline or missing, a broken template: all user-facing
        raise BabelprobeError(f"lm-evaluation-harness task {leaf.name!r} cannot be built ({_first_line(err)})") from err
    if task.OUTPUT_TYPE != "multiple_choice":
        raise BabelprobeError(_not_multiple_choice(leaf.name, task.OUTPUT_TYPE))
    return task


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def task_questions(task, name: str, language: str, limit: int | None) -> tuple[pd.DataFrame, list[dict]]:
    """The task's documents as questions (module docstring) and the documents skipped, with why."""
    import pandas as pd

    if task.get_config("num_fewshot") is None:
        task.set_config(key="num_fewshot", value=0)  # as simple_evaluate does without --num_fewshot
    task.set_fewshot_seed(seed=FEWSHOT_SEED)
    with _quiet():
        task.build_all_requests(limit=limit, rank=0, world_size=1)
    by_doc: dict[int, list] = {}
    for instance in task.instances:
        by_doc.setdefault(instance.doc_id, []).append(instance)
    delimiter = task.config.target_delimiter
    split = task.config.test_split or task.config.validation_split
    metrics = ",".join(str(m["metric"]) for m in (task.config.metric_list or []) if isinstance(m, dict))
    rows, problems = [], []
    for doc_id, instances in sorted(by_doc.items()):
        instances.sort(key=lambda i: i.idx)
        doc = instances[0].doc
        choices = [str(c) for c in task.doc_to_choice(doc)]
        requests = [i.arguments[:2] for i in instances[:len(choices)]]  # acc_mutual_info's extra requests after
        where = f"{name} doc {doc_id}"
        gold = gold_index(task, doc, choices, name)
        problem = ("gold answer outside the choices" if gold is None else
                   "a request whose continuation does not start with the target delimiter"
                   if any(not c.startswith(delimiter) for _, c in requests) else
                   "an empty request" if any(not (ctx + cont).strip() for ctx, cont in requests) else "")
        if problem:
            problems.append({"language": language, "config": name, "source": where, "reason": problem})
            continue
        rows.append({"id": str(doc_id), "language": language, "subset": name, "config": name,
                     "contexts": [ctx for ctx, _ in requests], "delimiter": delimiter, "choices": choices,
                     "targets": [cont[len(delimiter):] for _, cont in requests], "gold": gold,
                     "parallel_id": f"{family(name, language)}-{doc_id}", "task": name,
                     "task_version": str(getattr(task, "VERSION", "") or ""), "doc_id": int(doc_id), "split": split,
                     "harness_metrics": metrics, "template_note": ""})
    return pd.DataFrame(rows), problems


def gold_index(task, doc, choices: list[str], name: str) -> int | None:
    """The gold option as the harness's `process_results` finds it (module docstring); None where it is not
    one of the choices (the harness's -100)."""
    gold = task.doc_to_text(doc) if task.multiple_input else task.doc_to_target(doc)
    if isinstance(gold, list) or task.multiple_target:
        raise BabelprobeError(f"lm-evaluation-harness task {name!r} gives several gold answers per document "
                              "(multiple targets); babelprobe's questions have one")
    if isinstance(gold, Integral) and not isinstance(gold, bool):
        gold = int(gold)
        return gold if 0 <= gold < len(choices) else None
    if isinstance(gold, str):
        return choices.index(gold) if gold in choices else None
    return None


def task_record(task, language: str) -> dict:
    """What the summary names from the harness: the task's version, language and metric_list."""
    metrics = [str(m["metric"]) for m in (task.config.metric_list or []) if isinstance(m, dict)]
    return {"version": str(getattr(task, "VERSION", "") or ""), "language": language, "metrics": metrics}


# ------------------------------------------------------------------------------------------ languages

def leaf_language(leaf: Leaf, given: str | None = None) -> str:
    """The task's language (module docstring); `given` where the task does not say. A task that says
    another language than `given` is an error naming both."""
    config = leaf.config or {}
    found = task_language(leaf.name, config)
    if found and given and found != given:
        raise BabelprobeError(f"lm-evaluation-harness task {leaf.name!r} is in {found}, but --language {given} was "
                              "given; drop --language (or use --languages to select)")
    if found or given:
        return found or given
    raise BabelprobeError(f"cannot tell the language of lm-evaluation-harness task {leaf.name!r} from its metadata, "
                          "dataset_name or name; give it with --language CODE (or metadata: {language: CODE} in "
                          "its YAML)")


def task_language(name: str, config: dict) -> str | None:
    """The language a task's metadata, dataset_name or name gives (module docstring), None where none does."""
    metadata = config.get("metadata") or {}
    for key in ("language", "lang"):
        value = metadata.get(key) if isinstance(metadata, dict) else None
        if isinstance(value, str) and (code := language_of_word(value) or language_of_tokens(value.split("_"))):
            return code
    dataset = config.get("dataset_name")
    if isinstance(dataset, str) and (code := language_of_tokens(dataset.split("_"))):
        return code
    return language_of_tokens(name.split("_"), last=True)


def language_of_tokens(tokens: list[str], last: bool = False) -> str | None:
    """The language named by a Belebele variant among `tokens` (`deu`, `Latn`), else by one token (an ISO 639
    code, an alias, an English name); the last such token with `last` (task names put the language after
    the family: `global_mmlu_full_am_anatomy`, `arc_challenge_mt_is`)."""
    for a, b in zip(tokens, tokens[1:]):
        if (code := _variants().get(f"{a}_{b}")) is not None:
            return code
    found = [code for token in tokens if (code := language_of_word(token))]
    return (found[-1] if last else found[0]) if found else None


def language_of_word(word: str) -> str | None:
    word = word.strip()
    if word in LANGUAGE_ALIASES:
        return LANGUAGE_ALIASES[word]
    if word in language_codes():
        return word
    if word in _iso_639_3():
        return _iso_639_3()[word]
    return codes_by_name().get(word.lower()) if len(word) > 3 else None


@cache
def _variants() -> dict[str, str]:
    """Belebele's variants (`deu_Latn`) -> their item language (data/bridges/configs.csv)."""
    table = bridge_configs()
    rows = table[table["dataset"] == "belebele"]
    return dict(zip(rows["config"], rows["language"]))


@cache
def _iso_639_3() -> dict[str, str]:
    """ISO 639-3 codes of the bridged releases (MultiBLiMP's configs, Belebele's variants' first part) -> the
    item language babelprobe gives them (without a script suffix)."""
    table = bridge_configs()
    out = {}
    for config, language in zip(table["config"], table["language"]):
        if "-" not in language:
            out.setdefault(config.split("_")[0], language)
    return out


def family(name: str, language: str) -> str:
    """The task's name without its language (`xcopa_et` -> `xcopa`, `belebele_deu_Latn` -> `belebele`,
    `global_mmlu_de_business` -> `global_mmlu_business`): the same document in another language has the
    same family and doc id."""
    tokens = name.split("_")
    for k, (a, b) in enumerate(zip(tokens, tokens[1:])):
        if _variants().get(f"{a}_{b}") == language:
            return "_".join(tokens[:k] + tokens[k + 2:]) or name
    for k in range(len(tokens) - 1, -1, -1):
        if language_of_word(tokens[k]) == language:
            return "_".join(tokens[:k] + tokens[k + 1:]) or name
    return name


# ------------------------------------------------------------------------------------- bundled sample

def sample_counts(name: str) -> tuple[int, set[str]]:
    """A bundled harness sample's documents (its test files' records) and languages, read without the
    harness (`babelprobe items list`)."""
    folder = bundled_sets(NAME)[name].location
    spec = json.loads((folder / "tasks.json").read_text(encoding="utf-8"))
    documents = sum(len([line for line in (folder / task["data_files"]["test"]).read_text(encoding="utf-8")
                         .splitlines() if line.strip()]) for task in spec["tasks"])
    return documents, {task_language(task["task"], {}) for task in spec["tasks"]}


def sample_source(name: str) -> Source:
    """A bundled harness sample (`bundled.py`: a folder of data files and `tasks.json`, written for
    babelprobe) as a task folder: one YAML per task that `include`s the installed harness's own task file
    and points `dataset_path: json` at the sample's files. Written once into babelprobe's cache."""
    import hashlib

    import platformdirs

    lm_eval = harness()
    folder = bundled_sets(NAME)[name].location
    spec = json.loads((folder / "tasks.json").read_text(encoding="utf-8"))
    installed = Path(lm_eval.__file__).parent / "tasks"
    texts = {}
    for task in spec["tasks"]:
        files = {split: str((folder / file).resolve()) for split, file in task["data_files"].items()}
        lines = [f"include: {json.dumps(str(installed / task['include']))}", f"task: {task['task']}",
                 "dataset_path: json", "dataset_name: null",
                 f"dataset_kwargs: {json.dumps({'data_files': files})}"]
        texts[f"{task['task']}.yaml"] = "\n".join(lines) + "\n"
    digest = hashlib.sha256(json.dumps(texts, sort_keys=True).encode()).hexdigest()[:12]
    out = Path(platformdirs.user_cache_dir("babelprobe")) / "lm-eval-tasks" / f"{name}-{digest}"
    if not out.is_dir():
        import tempfile

        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + "."))
        for file, text in texts.items():
            (staging / file).write_text(text, encoding="utf-8")
        try:
            staging.replace(out)  # whole, or not at all (another process may have written it first)
        except OSError:
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
    return Source(tuple(t["task"] for t in spec["tasks"]), str(out))
