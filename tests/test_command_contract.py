"""The command contract (babelprobe/cli/registry.py), checked on every registered command the way
scikit-learn's `parametrize_with_checks` checks every estimator: a command added to `COMMANDS` is checked
here without a line of its own beyond its smallest invocation (`BASE`).

Conformance: the parser's commands are the registry's; every settings field has help and a flag; settings
round-trip through the record the run keeps; the run directory is a declared kind that `report` reads.

The bad-input catalogue: for every command, every case its flags allow (missing, empty, truncated,
unreadable, wrong-kind and other-model inputs, `--limit` 0 and negative, out-of-range layers, running
numbers out of range, contradictory flags, `--out` that is a file, a directory, or another command's run,
with and without `--overwrite`) must end in exactly one line `babelprobe: error: ...`, exit 2, no
traceback, before any model loads (`load_model` raises here), with nothing written and nothing of another
run deleted: every file of the world the case runs in, inputs and other runs, is byte for byte as it was.
Known exceptions are declared in one dict, `EXCEPTIONS`, each with its reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from babelprobe.cli import build_parser, main
from babelprobe.cli.registry import COMMANDS, SORTS, Command
from babelprobe.runs import LAYOUTS

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------- world

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Inputs every case may read, made once: two tiny models (the second: the same tokenizer, other
    weights), an item file, activation stores, compare, neurons and SAE runs of each model, an SAE folder
    and a finished bench run."""
    import babelprobe as bp
    from tests.tiny import tiny_lm

    root = tmp_path_factory.mktemp("world")
    paths = {}
    lms = {}
    for name, seed in (("model", 0), ("other_model", 1)):
        lm = tiny_lm("llama", seed=seed, max_positions=512)
        lm.model.save_pretrained(root / name)
        lm.tokenizer.save_pretrained(root / name)
        lms[name] = bp.load_model(str(root / name), device="cpu", dtype="float32")
        paths[name] = root / name
    items = bp.load_items("xcomps-sample", languages=["en", "de"], limit=3)
    bp.write_items(items, root / "items.jsonl")
    paths["items"] = root / "items.jsonl"
    for name, lm_name in (("", "model"), ("_other", "other_model")):
        lm = lms[lm_name]
        bp.compare(lm, items, root / f"cmp{name}", folds=2, progress=False)
        paths[f"cmp{name}"] = root / f"cmp{name}"
        paths[f"acts{name}"] = root / f"cmp{name}" / "acts"
        bp.language_neurons(lm, items, root / f"neu{name}", min_tokens=1, figures=False, progress=False)
        paths[f"neurons{name}"] = root / f"neu{name}"
    corpus = root / "corpus"  # a folder of <lang>.txt: `sae train`'s, `neurons`' and the ppl readout's input
    corpus.mkdir()
    for code, text in (("en", "A dog can bark. A cat can climb trees. Birds can fly."),
                       ("de", "Ein Hund kann bellen. Eine Katze kann klettern. Vögel können fliegen.")):
        (corpus / f"{code}.txt").write_text("\n".join([text] * 8) + "\n", encoding="utf-8")
    paths["corpus"] = corpus
    tiny_sae = dict(layers=2, width=16, k=4, tokens=256, batch_size=64, window=16)
    bp.train_sae(lms["model"], corpus, root / "saef", **tiny_sae)
    paths["sae"] = root / "saef"
    bp.sae_features(lms["other_model"], items, bp.train_sae(lms["other_model"], corpus, root / "saef_other",
                                                            **tiny_sae).sae,
                    root / "sae_run_other", ks="1", folds=2, ablate=1, n_random=1, n_boot=0, progress=False)
    paths["sae_run_other"] = root / "sae_run_other"
    bp.run_benchmark("stingray", lms["model"], "stingray-sample", root / "bench", limit=1, progress=False,
                     figures=False)
    paths["bench"] = root / "bench"
    cut = root / "acts_truncated"
    shutil.copytree(paths["acts"], cut)
    shard = sorted(cut.glob("shard-*.h5"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    paths["acts_truncated"] = cut
    (root / "empty.jsonl").write_text("", encoding="utf-8")
    (root / "malformed.jsonl").write_text('{"item_id": "a", "pair_id": \n', encoding="utf-8")
    (root / "empty_dir").mkdir()
    (root / "concepts_empty.csv").write_text("", encoding="utf-8")
    (root / "concepts_header.csv").write_text("concept_id,language,word\n", encoding="utf-8")
    (root / "mmlu.json").write_text(json.dumps([{"question": "Which animal can bark?", "choices": ["dog", "cat", "fish"],
                                                 "answer": "dog"}]), encoding="utf-8")  # pitfalls-search's seeds
    paths["seeds"] = root / "mmlu.json"
    paths.update(task_folder(root / "tasks"))
    paths.update({name: root / f for name, f in (("empty", "empty.jsonl"), ("malformed", "malformed.jsonl"),
                                                 ("empty_dir", "empty_dir"), ("concepts_empty", "concepts_empty.csv"),
                                                 ("concepts_header", "concepts_header.csv"))})
    paths["root"] = root
    return paths


def task_folder(folder: Path) -> dict:
    """lm-evaluation-harness task files of the installed harness's XCOPA-et task on local data (the bundled
    sample's file): `xcopa_et`, `xcopa_et_missing` (its data file not there) and `xcopa_et_locked` (its data file
    a case makes unreadable). Without the harness installed the folder is there and empty."""
    import importlib.util

    from babelprobe.bundled import bundled_sets

    folder.mkdir()
    (folder.parent / "task_data").mkdir()
    locked = folder.parent / "task_data" / "locked.jsonl"  # not in the task folder, whose files are checked
    data = bundled_sets("lm-eval")["lm-eval-sample"].location / "xcopa_et.jsonl"
    locked.write_bytes(data.read_bytes())
    spec = importlib.util.find_spec("lm_eval")
    if spec is not None:
        installed = Path(spec.submodule_search_locations[0]) / "tasks" / "xcopa" / "default_et.yaml"
        for task, file in (("xcopa_et", data), ("xcopa_et_missing", folder / "missing.jsonl"),
                           ("xcopa_et_locked", locked)):
            config = {"include": str(installed), "task": task, "dataset_path": "json", "dataset_name": None,
                      "dataset_kwargs": {"data_files": {"validation": str(file), "test": str(file)}}}
            (folder / f"{task}.yaml").write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    return {"tasks_dir": folder, "locked_data": locked, "lm_items": f"lm-eval:xcopa_et@{folder}"}


def snapshot(root: Path) -> dict:
    """Every file under `root` with its content hash."""
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(root.rglob("*")) if f.is_file()}


def fake_run(path: Path, kind: str) -> Path:
    """A finished-looking run directory of `kind` (its manifest and files; what they hold is never read by a
    refused command)."""
    layout = LAYOUTS[kind]
    path.mkdir(parents=True, exist_ok=True)
    for name in {*layout.files, *([layout.manifest] if layout.manifest else [])}:
        (path / name).write_text("{}" if name.endswith(".json") else "x\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------- invocations

# The smallest run of each command; {slot}s are filled from the world (and {out}: a fresh path).
BASE = {
    ("models",): "models --model {model}",
    ("items", "list"): "items list",
    ("items", "show"): "items show {source} --limit 1",
    ("items", "convert"): "items convert multiblimp {source} --limit 1 --out {out}.jsonl",
    ("items", "from-lm-eval"): "items from-lm-eval {tasks} --include-path {include_path} --limit 1 --out {out}.jsonl",
    ("score", "direct"): "score direct --model {model} --items {items} --out {out}.csv",
    ("score", "meta"): "score meta --model {model} --items {items} --out {out}.csv",
    ("extract",): "extract --model {model} --items {items} --out {out}",
    ("verify",): "verify {acts}",
    ("probe",): "probe --acts {acts} --folds 2 --out {out}.csv",
    ("compare",): "compare --model {model} --items {items} --folds 2 --out {out}",
    ("diff",): "diff {base} {other} --out {out}",
    ("intervene",): "intervene --model {model} --items {items} --probes {probes} --method ablate --layers 1 --out {out}",
    ("neurons",): "neurons --model {model} --items {items} --min-tokens 1 --out {out}",
    ("patch",): "patch --model {model} --protocol pairs --items {items} --out {out}",
    ("lens",): "lens --model {model} --items {items} --out {out}",
    ("align",): "align --acts {acts} --out {out}",
    ("sae",): "sae --model {model} --items {items} --sae {sae} --folds 2 --out {out}",
    ("sae", "fetch"): "sae fetch --release gemma-scope-2-270m-pt-res --sae-id layer_12_width_16k_l0_medium --out {out}",
    ("sae", "train"): "sae train --model {model} --corpus {corpus} --layers 2 --width 16 --k 4 --tokens 128 "
                      "--batch-size 64 --window 16 --out {out}",
    ("report",): "report --results {results} --out {out}",
    ("bench", "pitfalls-search"): "bench pitfalls-search --model {model} --items {items} --languages Chinese --out {out}",
    ("bench", "pitfalls-affinity"): "bench pitfalls-affinity --model {model} --items {items} --out {out}",
    ("bench", "figures"): "bench figures {runs} --out {out}",
    ("bench", "lm-eval"): "bench lm-eval --model {model} --tasks {tasks} --include-path {include_path} --limit 1 "
                          "--out {out}",
    ("sweep",): "sweep --models {model} --items {items} --out {out}",
}
SAMPLES = {"stingray": "stingray-sample", "eclektic": "eclektic-sample", "consistency": "consistency-sample",
           "pitfalls": "pitfalls-sample", "multiblimp": "multiblimp-sample", "belebele": "belebele-sample",
           "xnli": "xnli-sample", "pawsx": "pawsx-sample", "pitfalls-affinity": "pitfalls-sample"}
for _name in SAMPLES:
    BASE.setdefault(("bench", _name), f"bench {_name} --model {{model}} --items {{items}} --limit 1 --out {{out}}")
# What each slot holds unless a case says otherwise.
DEFAULTS = {"model": "model", "items": "items", "acts": "acts", "probes": "cmp", "compare": "cmp", "base": "cmp",
            "other": "cmp_other", "sae": "sae", "neurons": "neurons", "results": "cmp", "runs": "bench", "source": "items",
            "corpus": "corpus", "concepts": "concepts_header", "transfer_table": "items", "include_path": "tasks_dir",
            "locked_data": "locked_data"}
SLOT_DEFAULTS = {("items", "convert"): {"source": "multiblimp-sample"},
                 **{("bench", name): {"items": sample} for name, sample in SAMPLES.items()},
                 ("items", "from-lm-eval"): {"tasks": "xcopa_et"}, ("bench", "lm-eval"): {"tasks": "xcopa_et"}}
SLOT_WORLD = {("bench", "pitfalls-search"): {"items": "seeds"},  # slots filled from the world, by command
              ("bench", "lm-eval"): {"items": "lm_items"}}
# An input that the smallest run does not name, with the invocation that does.
WITH_INPUT = {
    ("intervene", "--neurons"): "intervene --model {model} --items {items} --method neurons --neurons {neurons} "
                                "--off en --readouts direct --out {out}",
    ("intervene", "--sae"): "intervene --model {model} --items {items} --method sae --sae {sae} --readouts direct "
                            "--out {out}",
    ("neurons", "--corpus"): "neurons --model {model} --corpus {corpus} --min-tokens 1 --out {out}",
    ("intervene", "--corpus"): "intervene --model {model} --items {items} --method neurons --neurons {neurons} "
                               "--off en --readouts ppl --corpus {corpus} --out {out}",
    ("patch", "--concepts"): "patch --model {model} --protocol translation --concepts {concepts} --out {out}",
    ("patch", "--compare"): "patch --model {model} --protocol pairs --items {items} --compare {compare} --out {out}",
    ("lens", "--acts"): "lens --model {model} --acts {acts} --out {out}",
    ("lens", "--compare"): "lens --model {model} --items {items} --compare {compare} --out {out}",
    ("align", "--compare"): "align --compare {compare} --out {out}",
    ("sae", "--acts"): "sae --model {model} --items {items} --sae {sae} --acts {acts} --folds 2 --out {out}",
    ("probe", "--items"): "probe --acts {acts} --items {items} --folds 2 --out {out}.csv",
    ("compare", "--acts"): "compare --model {model} --items {items} --acts {acts} --folds 2 --out {out}",
    ("report", "--other"): "report --results {results} --other {other} --out {out}",
    ("report", "--transfer-table"): "report --results {results} --transfer-table {transfer_table} --out {out}",
    ("bench lm-eval", "--items"): "bench lm-eval --model {model} --items {items} --limit 1 --out {out}",
}


@dataclasses.dataclass
class Case:
    command: Command
    name: str
    template: str
    slots: dict = dataclasses.field(default_factory=dict)  # slot -> a world name, or a literal with "="
    extra: tuple = ()         # arguments added at the end
    needles: tuple = ()       # what the error line must say
    unreadable: str | None = None  # a slot whose path this process cannot read
    out: str | None = None    # what --out is before the run: "file", "dir" or a run kind
    needs: tuple = ()         # optional packages the case needs (skipped without them)
    without: tuple = ()       # packages that do not import in the case (an extra not installed)

    @property
    def id(self) -> str:
        return f"{self.command.name}: {self.name}"


def slot_of(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def shown_flags(command: Command) -> set[str]:
    parser = build_parser()
    for word in command.path:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    return {o for a in parser._actions for o in a.option_strings if a.help != argparse.SUPPRESS}


def template_for(command: Command, slot: str) -> str | None:
    base = BASE[command.path]
    flag = "--" + slot.replace("_", "-")
    if (command.path[0], flag) in WITH_INPUT and command.path == (command.path[0],):
        return WITH_INPUT[(command.path[0], flag)]
    return base if "{" + slot + "}" in base else WITH_INPUT.get((command.name, flag))


def generic_cases(command: Command) -> list[Case]:
    """The catalogue's cases that follow from a command's flags, inputs and output (module docstring)."""
    flags, base, cases = shown_flags(command), BASE[command.path], []
    add = lambda name, **kw: cases.append(Case(command, name, kw.pop("template", base), **kw))  # noqa: E731
    if "--limit" in flags:
        add("--limit 0", extra=("--limit", "0"), needles=("--limit", "0"))
        add("--limit -1 (a negative limit)", extra=("--limit", "-1"), needles=("--limit", "-1"))
    if "--batch-tokens" in flags:
        add("--batch-tokens 0", extra=("--batch-tokens", "0"), needles=("--batch-tokens",))
    if "--n-boot" in flags:
        add("--n-boot -1", extra=("--n-boot", "-1"), needles=("--n-boot",))
    if "--batch-size" in flags:
        add("--batch-size 0", extra=("--batch-size", "0"), needles=("--batch-size",))
    if command.out == "dir":
        add("--out is a file", out="file", needles=("--out",))
        other = "neurons" if command.kind != "neurons" else "patch"
        add(f"--out holds a {other} run", out=other, needles=("--out", other))
        if "--overwrite" in flags:
            add(f"--out holds a {other} run, --overwrite", out=other, extra=("--overwrite",), needles=("--out", other))
    if command.out in ("table", "items"):
        add("--out is a directory", out="dir", needles=("--out", "directory"))
        add("--out inside a compare run", out="compare", needles=("--out", "compare"))
    for name, sort in command.inputs.items():
        slot = slot_of(name)
        template = template_for(command, slot)
        if template is None:
            continue
        shown = name if name.startswith("-") else ""
        if sort in ("tasks", "lm-eval"):
            cases += task_cases(command, name, sort, template)
            continue
        if sort == "items":
            add(f"{name} missing file", template=template, slots={slot: "=missing.jsonl"}, needles=("missing.jsonl",))
            add(f"{name} empty file", template=template, slots={slot: "empty"}, needles=("empty.jsonl",))
            add(f"{name} unreadable", template=template, slots={slot: "items"}, unreadable=slot,
                needles=("items.jsonl", "permission denied"))
            add(f"{name} malformed", template=template, slots={slot: "malformed"}, needles=("malformed.jsonl",))
            add(f"{name} lm-eval:TASK@DIR, DIR missing", template=template, slots={slot: "=lm-eval:xcopa_et@nowhere"},
                needles=(shown, "task folder nowhere", "no such directory"))
            continue
        if sort == "corpus":  # a bundled name or hf: is not a path: the corpus loader explains a missing one
            add(f"{name} missing", template=template, slots={slot: "=nowhere"}, needles=("nowhere",))
            add(f"{name} unreadable", template=template, slots={slot: "corpus"}, unreadable=slot,
                needles=(shown, "permission denied"))
            add(f"{name} an empty directory", template=template, slots={slot: "empty_dir"}, needles=("empty_dir",))
            continue
        sort = "file" if sort == "concepts" else sort  # a bundled set's name is not a path: a file otherwise
        is_dir = sort not in ("file",)
        add(f"{name} missing", template=template, slots={slot: "=nowhere"}, needles=(shown, "nowhere", "no such"))
        readable = {"store": "acts", "new-store": "acts", "compare": "cmp", "neurons": "neurons", "sae-run": "sae_run_other",
                    "sae-folder": "sae", "run": "cmp", "bench": "bench", "probes": "cmp", "dir": "empty_dir",
                    "file": DEFAULTS.get(slot, "items")}[sort]
        readable = {"other": "cmp_other"}.get(slot, readable)  # report's --other: not the --results beside it
        add(f"{name} unreadable", template=template, slots={slot: readable}, unreadable=slot,
            needles=(shown, "permission denied"))
        if is_dir and sort != "dir":
            add(f"{name} an empty directory", template=template, slots={slot: "empty_dir"}, needles=(shown, "empty_dir"))
            wrong = "neurons" if sort not in ("neurons",) else "cmp"
            if sort != "run":
                add(f"{name} a directory of another kind", template=template, slots={slot: wrong},
                    needles=(shown, Path(wrong).name[:3]))
        if sort == "file":
            add(f"{name} a directory", template=template, slots={slot: "empty_dir"}, needles=(shown, "empty_dir"))
        if sort in ("store", "new-store"):
            add(f"{name} a truncated store", template=template, slots={slot: "acts_truncated"},
                needles=("acts_truncated",))
        if command.model and sort in ("store", "new-store", "neurons", "sae-run", "probes"):
            other = {"store": "acts_other", "new-store": "acts_other", "neurons": "neurons_other",
                     "sae-run": "sae_run_other", "probes": "cmp_other"}[sort]
            if sort != "sae-run":
                add(f"{name} of another model", template=template, slots={slot: other}, needles=("another model",))
    if command.model and "--layers" in flags and command.path[0] in ("extract", "compare", "patch", "intervene", "sae"):
        add("--layers beyond the model", extra=("--layers", "99"), needles=("--layers", "99"))
    if "--model" in flags and "{model}" in base:
        add("--model missing", slots={"model": "=no-such-model"}, needles=("no-such-model",))
    return cases


def task_cases(command: Command, name: str, sort: str, template: str) -> list[Case]:
    """lm-evaluation-harness tasks (`tasks`: names beside --include-path; `lm-eval`: a source lm-eval:TASK@DIR):
    an unknown task, a generation task, a task whose local data file is missing or unreadable, the lm-eval
    extra not installed; a source that is an item file, or whose task folder is missing."""
    slot, shown = slot_of(name), name if name.startswith("-") else ""
    named = (lambda task: f"=lm-eval:{task}@{{tasks_dir}}") if sort == "lm-eval" else (lambda task: f"={task}")
    case = lambda what, **kw: Case(command, f"{name} {what}", template, **kw)  # noqa: E731
    cases = [
        case("an unknown task", slots={slot: named("xcopa_ett")}, needs=("lm_eval",),
             needles=("unknown lm-evaluation-harness task 'xcopa_ett'", "did you mean xcopa_et")),
        case("a generation task", slots={slot: named("gsm8k")}, needs=("lm_eval",),
             needles=("'gsm8k' is a generate_until task", "multiple_choice tasks only")),
        case("a task whose data file is missing", slots={slot: named("xcopa_et_missing")}, needs=("lm_eval",),
             needles=("'xcopa_et_missing' cannot be built", "missing.jsonl", "no such file")),
        case("a task whose data file is unreadable", slots={slot: named("xcopa_et_locked")}, needs=("lm_eval",),
             unreadable="locked_data", needles=("'xcopa_et_locked' cannot be built", "locked.jsonl",
                                                "permission denied")),
        case("without the lm-eval extra installed", without=("lm_eval",), needles=("need the lm_eval package",
                                                                                  "babelprobe[lm-eval]")),
    ]
    if sort == "lm-eval":
        cases += [case("an item file, not tasks", slots={slot: "items"}, needles=(shown, "items.jsonl", "tasks")),
                  case("lm-eval:TASK@DIR, DIR missing", slots={slot: "=lm-eval:xcopa_et@nowhere"},
                       needles=(shown, "task folder nowhere", "no such directory"))]
    return cases


# Cases by hand: the twelve bad ones of issue 39 and contradictory flags, per command.
def hand_cases() -> list[Case]:
    by = {c.path: c for c in COMMANDS}
    c = lambda path, name, template, **kw: Case(by[path], name, template, **kw)  # noqa: E731
    return [
        c(("neurons",), "bad 1: --limit -1 dropped each group's last pair", BASE[("neurons",)],
          extra=("--limit", "-1"), needles=("--limit", "-1")),
        c(("bench", "xnli"), "bad 2: --limit -1", BASE[("bench", "xnli")].replace("--limit 1", "--limit -1"),
          needles=("--limit", "-1")),
        c(("items", "convert"), "bad 3: --limit -1", BASE[("items", "convert")].replace("--limit 1", "--limit -1"),
          needles=("--limit", "-1")),
        c(("bench", "belebele"), "bad 4: --limit 0 (a traceback after the model loaded)",
          BASE[("bench", "belebele")].replace("--limit 1", "--limit 0"), needles=("--limit", "0")),
        c(("bench", "pitfalls-affinity"), "bad 5: --limit 0", BASE[("bench", "pitfalls-affinity")],
          extra=("--limit", "0"), needles=("--limit", "0")),
        c(("patch",), "bad 6: an empty --concepts CSV", WITH_INPUT[("patch", "--concepts")],
          slots={"concepts": "concepts_empty"}, needles=("concepts_empty.csv",)),
        c(("sae", "train"), "bad 7: unreadable --corpus", BASE[("sae", "train")], unreadable="corpus",
          needles=("--corpus", "permission denied")),
        c(("intervene",), "bad 8: unreadable --neurons", WITH_INPUT[("intervene", "--neurons")],
          unreadable="neurons", needles=("--neurons", "permission denied")),
        c(("report",), "bad 9: unreadable --results", BASE[("report",)], unreadable="results",
          needles=("--results", "permission denied")),
        c(("sae",), "bad 10: --layers 1 with a layer-2 SAE", BASE[("sae",)], extra=("--layers", "1"),
          needles=("--layers", "layer 2")),
        c(("sae",), "bad 11: a truncated store", WITH_INPUT[("sae", "--acts")], slots={"acts": "acts_truncated"},
          needles=("acts_truncated",)),
        c(("patch",), "bad 12: --compare of another item set", WITH_INPUT[("patch", "--compare")],
          slots={"items": "=xcomps-sample"}, extra=("--languages", "en,zh", "--limit", "1"),
          needles=("--compare", "items")),
        # weak ones: checked only after the model loaded
        c(("patch",), "weak: a layer beyond the model", BASE[("patch",)], extra=("--layers", "2-9"),
          needles=("--layers", "2-9")),
        c(("intervene",), "weak: --neurons of another model", WITH_INPUT[("intervene", "--neurons")],
          slots={"neurons": "neurons_other"}, needles=("--neurons", "another model")),
        c(("intervene",), "weak: --sae of another model", WITH_INPUT[("intervene", "--sae")],
          slots={"sae": "sae_run_other"}, needles=("--sae", "another model")),
        c(("sae",), "weak: --acts of another model", WITH_INPUT[("sae", "--acts")], slots={"acts": "acts_other"},
          needles=("another model",)),
        c(("bench", "stingray"), "weak: --out a file", BASE[("bench", "stingray")], out="file", needles=("--out",)),
        # contradictory flags
        c(("neurons",), "contradiction: --corpus with --items", WITH_INPUT[("neurons", "--corpus")],
          extra=("--items", "xcomps-sample"), needles=("--corpus", "--items")),
        c(("patch",), "contradiction: --concepts with --protocol pairs", BASE[("patch",)],
          extra=("--concepts", "xcomps-sample"), needles=("--concepts",)),
        c(("patch",), "contradiction: a translation flag with --protocol pairs", BASE[("patch",)],
          extra=("--n-pairs", "3"), needles=("--n-pairs",)),
        c(("intervene",), "contradiction: --off without --method neurons", BASE[("intervene",)],
          extra=("--off", "en"), needles=("--off",)),
        c(("intervene",), "contradiction: --method neurons without --neurons", BASE[("intervene",)].replace(
          "--probes {probes} --method ablate --layers 1", "--method neurons --off en"), needles=("--neurons",)),
        c(("intervene",), "contradiction: --positions last with --readouts direct", BASE[("intervene",)],
          extra=("--positions", "last", "--readouts", "direct"), needles=("--positions",)),
        c(("lens",), "contradiction: --target without --acts", BASE[("lens",)], extra=("--target", "answer"),
          needles=("--target",)),
        c(("extract",), "contradiction: --device with --device-map", BASE[("extract",)],
          extra=("--device", "cpu", "--device-map", "auto"), needles=("--device",)),
        c(("extract",), "contradiction: --remote without --backend nnsight", BASE[("extract",)], extra=("--remote",),
          needles=("--remote",)),
        c(("extract",), "contradiction: --max-memory without --device-map", BASE[("extract",)],
          extra=("--max-memory", "0=1GiB"), needles=("--max-memory",)),
        c(("compare",), "contradiction: --layers of several layers", BASE[("compare",)], extra=("--layers", "1,2"),
          needles=("--layers",)),
        c(("probe",), "contradiction: --protocol paper with --fold-scheme grouped", BASE[("probe",)],
          extra=("--protocol", "paper", "--fold-scheme", "grouped"), needles=("--protocol paper", "drop")),
        c(("sae",), "contradiction: no --sae", BASE[("sae",)].replace("--sae {sae} ", ""), needles=("--sae",)),
        c(("score", "meta"), "contradiction: --prompt-language not among the prompts", BASE[("score", "meta")],
          extra=("--prompt-language", "xx"), needles=("xx",)),
        c(("align",), "contradiction: --matrix-layer not aligned", BASE[("align",)],
          extra=("--layers", "0-1", "--matrix-layer", "2"), needles=("--matrix-layer",)),
        c(("report",), "contradiction: --other of a neurons run", BASE[("report",)].replace("{results}", "{neurons}"),
          extra=("--other", "{cmp}"), needles=("--other",)),
        c(("sweep",), "contradiction: --folds 1", BASE[("sweep",)], extra=("--folds", "1"), needles=("--folds",)),
        c(("bench", "pitfalls-search"), "contradiction: no --languages",
          BASE[("bench", "pitfalls-search")].replace("--languages Chinese ", ""), needles=("--languages",)),
        c(("bench", "lm-eval"), "contradiction: --tasks with --items", BASE[("bench", "lm-eval")],
          extra=("--items", "{items}"), needles=("--tasks", "--items")),
        c(("bench", "lm-eval"), "contradiction: --include-path without --tasks",
          BASE[("bench", "lm-eval")].replace("--tasks {tasks} ", ""), needles=("--include-path", "--tasks")),
        # lm-evaluation-harness tasks read by the other commands (items.load_items), before the model loads
        c(("compare",), "lm-eval: an unknown task in --items", BASE[("compare",)],
          slots={"items": "=lm-eval:xcopa_ett@{tasks_dir}"}, needs=("lm_eval",),
          needles=("unknown lm-evaluation-harness task 'xcopa_ett'",)),
        c(("extract",), "lm-eval: a task's unreadable data file in --items", BASE[("extract",)],
          slots={"items": "=lm-eval:xcopa_et_locked@{tasks_dir}"}, unreadable="locked_data", needs=("lm_eval",),
          needles=("locked.jsonl", "permission denied")),
        c(("items", "from-lm-eval"), "--out exists, no --overwrite", BASE[("items", "from-lm-eval")], out="file",
          needs=("lm_eval",), needles=("exists", "--overwrite")),
    ]


# Known exceptions: (command, case) -> why the case does not apply or is not refused as the rest are.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("align", "--acts of another model"):
        "align --acts reads a store and runs no model: the store's own model is the one aligned",
    ("compare", "--acts missing"):
        "compare --acts names the store to reuse or to create: a directory not there yet is extracted into",
    ("compare", "--acts an empty directory"):
        "compare --acts names the store to reuse or to create: an empty directory is extracted into",
}


def all_cases() -> list[Case]:
    cases = [case for command in COMMANDS for case in generic_cases(command)] + hand_cases()
    return [case for case in cases if (case.command.name, case.name) not in EXCEPTIONS]


def argv_of(case: Case, world: dict, out: Path) -> tuple[list[str], dict]:
    """The case's command line, and the value of every slot."""
    values = {slot: world[name] for slot, name in DEFAULTS.items() if name in world}
    values.update({slot: value for slot, value in SLOT_DEFAULTS.get(case.command.path, {}).items()})
    values.update({slot: world[name] for slot, name in SLOT_WORLD.get(case.command.path, {}).items()})
    for slot, name in case.slots.items():  # a literal (=...) may name a world path: {tasks_dir}
        values[slot] = name[1:].format(**{k: str(v) for k, v in world.items()}) if name.startswith("=") else world[name]
    values["out"] = out
    values["cmp"] = world["cmp"]
    values["neurons"] = values.get("neurons", world["neurons"])
    words = [word.format(**{k: str(v) for k, v in values.items()}) for word in case.template.split()]
    extra = [word.format(**{k: str(v) for k, v in values.items()}) for word in case.extra]
    return words + extra, values


def out_path(case: Case, tmp_path: Path) -> Path:
    return tmp_path / "run" / "out"


def prepare_out(case: Case, argv: list[str], tmp_path: Path) -> None:
    """Put what `case.out` says where --out points."""
    if case.out is None or "--out" not in argv:
        return
    out = Path(argv[argv.index("--out") + 1])
    if case.out == "file":
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("an earlier file\n", encoding="utf-8")
    elif case.out == "dir":
        out.mkdir(parents=True)
        (out / "kept.txt").write_text("kept\n", encoding="utf-8")
    elif case.command.out in ("table", "items"):  # --out inside a run of that kind
        fake_run(out.parent, case.out)
    else:
        fake_run(out, case.out)


CASES = all_cases()


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_line_before_the_model_loads_and_changes_nothing(case, world, tmp_path, capsys,
                                                                         monkeypatch):
    import babelprobe.models

    def no_loading(*args, **kwargs):
        raise AssertionError(f"{case.id}: the model was loaded before the input was refused")

    for module in case.needs:
        pytest.importorskip(module)
    for module in case.without:  # `import module` raises ImportError
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setattr(babelprobe.models, "load_model", no_loading)
    monkeypatch.setattr(babelprobe.models, "load_remote_model", no_loading)
    argv, values = argv_of(case, world, out_path(case, tmp_path))
    prepare_out(case, argv, tmp_path)
    if case.unreadable is not None:  # as chmod 000 makes it for a user who is not root (CI runs as root)
        denied = Path(values[case.unreadable])
        real = os.access
        monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: False if (
            mode & os.R_OK and (Path(path) == denied or denied in Path(path).parents)) else real(path, mode, *a, **k))
    before_world, before_run = snapshot(world["root"]), snapshot(tmp_path)
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("babelprobe: error:")]
    assert code == 2 and len(lines) == 1, f"{case.id}: exit {code}\n{err[-3000:]}"
    assert "Traceback" not in err, err
    for needle in case.needles:
        assert needle in lines[0], f"{case.id}: {needle!r} not in {lines[0]!r}"
    assert snapshot(world["root"]) == before_world, f"{case.id}: an input or another run changed"
    assert snapshot(tmp_path) == before_run, f"{case.id}: something was written"


# ------------------------------------------------------------------------------- the library's doors

# Each runner with an input it reads (by its parameter's name) and the world entry made unreadable there: the
# runner refuses it with the line the command line gives (`inputs.check_input`, the registry's own check), the
# parameter in place of the flag, before the model loads.
LIBRARY = {
    "probe": (lambda w, o: __import__("babelprobe").probe(w["acts"], o / "n.csv", folds=2), "store", "acts"),
    "compare": (lambda w, o: __import__("babelprobe").compare(w["items"], o, acts=w["acts"], folds=2,
                                                                model=str(w["model"])), "acts", "acts"),
    "diff": (lambda w, o: __import__("babelprobe").diff(w["cmp"], o, other=w["cmp_other"]), "other", "cmp_other"),
    "intervene --probes": (lambda w, o: __import__("babelprobe").intervene(
        w["items"], o, probes=w["cmp"], layers="1", model=str(w["model"])), "probes", "cmp"),
    "intervene --neurons": (lambda w, o: __import__("babelprobe").intervene(
        w["items"], o, neurons=w["neurons"], methods="neurons", off="en", readouts="direct", model=str(w["model"])),
        "neurons", "neurons"),
    "language_neurons": (lambda w, o: __import__("babelprobe").language_neurons(
        None, o, corpus=w["empty_dir"], model=str(w["model"])), "corpus", "empty_dir"),
    "patch_pairs": (lambda w, o: __import__("babelprobe").patch_pairs(w["items"], o, compare=w["cmp"],
                                                                      model=str(w["model"])), "compare", "cmp"),
    "patch_translation": (lambda w, o: __import__("babelprobe").patch_translation(
        w["concepts_header"], o, model=str(w["model"])), "concepts", "concepts_header"),
    "lens": (lambda w, o: __import__("babelprobe").lens(None, o, acts=w["acts"], model=str(w["model"])), "acts", "acts"),
    "align": (lambda w, o: __import__("babelprobe").align(None, o, compare=w["cmp"]), "compare", "cmp"),
    "sae_features": (lambda w, o: __import__("babelprobe").sae_features(w["items"], o, sae=w["sae"], folds=2,
                                                                        model=str(w["model"])), "sae", "sae"),
    "train_sae": (lambda w, o: __import__("babelprobe").train_sae(str(w["model"]), w["corpus"], o, layers=2, width=16,
                                                                  k=4, tokens=256, batch_size=64, window=16),
                  "corpus", "corpus"),
    "write_report": (lambda w, o: __import__("babelprobe").write_report(w["cmp"], o), "results", "cmp"),
    "run_benchmark": (lambda w, o: __import__("babelprobe").run_benchmark(w["items"], o, name="stingray",
                                                                          model=str(w["model"])), "items", "items"),
    "plot_runs": (lambda w, o: __import__("babelprobe").plot_runs([w["bench"]], o), "runs", "bench"),
    "score_pairs": (lambda w, o: __import__("babelprobe").score_pairs(w["items"], o / "d.csv", method="direct",
                                                                      model=str(w["model"])), "items", "items"),
    "sweep": (lambda w, o: __import__("babelprobe").sweep([str(w["items"])], o, models=[str(w["model"])]),
              "items", "items"),
}


@pytest.mark.parametrize("runner", LIBRARY)
def test_a_runner_refuses_an_unreadable_input_as_the_command_line_does(runner, world, tmp_path, monkeypatch):
    import babelprobe.models
    from babelprobe.errors import BabelprobeError

    call, name, entry = LIBRARY[runner]
    monkeypatch.setattr(babelprobe.models, "load_model", lambda *a, **k: pytest.fail(f"{runner} loaded the model"))
    denied, real = Path(world[entry]), os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: False if (
        mode & os.R_OK and (Path(path) == denied or denied in Path(path).parents)) else real(path, mode, *a, **k))
    before = snapshot(world["root"])
    with pytest.raises(BabelprobeError) as refused:
        call(world, tmp_path / "out")
    assert str(refused.value) == f"{name} {denied}: permission denied (not readable by this user); fix its " \
                                 "permissions or point elsewhere"
    assert snapshot(world["root"]) == before and not (tmp_path / "out").exists()


def test_a_truncated_store_and_an_unreadable_item_file_in_the_library(world, monkeypatch):
    import babelprobe as bp
    from babelprobe.errors import BabelprobeError

    with pytest.raises(BabelprobeError, match=f"store {world['acts_truncated']}: .*shard-00000.h5"):
        bp.probe(world["acts_truncated"], folds=2)  # every shard opens: before the sweep reads one
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: False if Path(path) == world["items"] else
                        real(path, mode, *a, **k))
    with pytest.raises(BabelprobeError, match=f"item source {world['items']}: permission denied"):
        bp.load_items(str(world["items"]))  # was the reader's PermissionError traceback


def test_the_catalogue_has_every_case_of_the_issue_and_more_than_150():
    names = {case.name for case in CASES}
    assert sum(name.startswith("bad ") for name in names) == 12
    assert len(CASES) >= 150, len(CASES)


# ------------------------------------------------------------------------------------------ conformance

def leaf_paths(parser, path=()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs or parser.get_default("func") is not None:
        yield path
    for action in subs:
        for name, sub in action.choices.items():
            yield from leaf_paths(sub, path + (name,))


def test_every_command_is_registered_and_has_its_smallest_run():
    commands = {p for p in leaf_paths(build_parser()) if p}
    assert commands == {c.path for c in COMMANDS}, commands ^ {c.path for c in COMMANDS}
    assert set(BASE) == commands, set(BASE) ^ commands


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_the_registry_entry_holds(command):
    if command.runner is not None:
        module, _, name = command.runner.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), command.runner
    if command.kind is not None:
        assert command.kind in LAYOUTS, command.kind
    for name, sort in command.inputs.items():
        assert sort in SORTS, (name, sort)
        if name.startswith("-"):
            assert name in shown_flags(command), name


def settings_classes():
    found = []
    for command in COMMANDS:
        for where in command.settings:
            module, _, name = where.partition(":")
            cls = getattr(importlib.import_module(module), name)
            if cls not in [c for _, c in found]:
                found.append((where, cls))
    return found


@pytest.mark.parametrize("where, cls", settings_classes(), ids=[w for w, _ in settings_classes()])
def test_every_setting_has_help_and_round_trips_through_the_record(where, cls):
    from babelprobe.settings import from_record, settings_for, settings_record

    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, where
    for field in dataclasses.fields(cls):
        assert field.metadata.get("help"), f"{where}.{field.name} has no help (declare it with option())"
    presets = ["default", *getattr(cls, "PROTOCOLS", {})]
    # a paper preset that calls an LLM (ECLeKTiC's judge, Pitfalls' extractor) needs it named
    named = {"judge": "self"} if "eclektic" in where else {"extractor": "self"} if "AffinitySettings" in where else {}
    for protocol in presets:
        settings = settings_for(cls, protocol, **(named if protocol == "paper" else {}))
        record = json.loads(json.dumps(settings_record(settings)))  # as the manifest keeps it
        assert from_record(cls, record) == settings, (where, protocol)


REPORTED_BY_WRITE_REPORT = {"compare", "probe"}  # analysis.report.write_report reads them itself
NO_REPORT = {"store": "an activation store is an input of other commands; `babelprobe verify` checks it",
             "intervene": "an intervention run is reported by `report` of the compare directory it sits in "
                          "(analysis.interventions.report_section) and draws its own figures",
             "sweep": "a sweep's cells are probe directories, each reported by `report --results CELL`"}


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.kind], ids=[c.name for c in COMMANDS if c.kind])
def test_the_run_directory_is_a_declared_kind_with_a_report(command):
    from babelprobe.analysis.report import REPORTS

    assert command.kind in LAYOUTS
    assert command.kind in REPORTS or command.kind in REPORTED_BY_WRITE_REPORT or command.kind in NO_REPORT, \
        f"{command.name} writes a {command.kind} directory that `babelprobe report` cannot read"
