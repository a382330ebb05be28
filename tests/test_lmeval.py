"""lm-evaluation-harness multiple-choice tasks as items (`babelprobe.lmeval`, `items from-lm-eval`, `bench lm-eval`,
`--items lm-eval:...`), offline: task files written here, at test time, that `include` the installed harness's
own task files and point `dataset_path: json` at small local files (tests/data/lmeval, the bundled XCOPA and
Belebele samples). Five families and the three kinds of template: XCOPA (`!function` doc_to_text/doc_to_choice),
XStoryCloze and Belebele (Jinja templates), XWinograd (multiple input), Global-MMLU (a `doc_to_choice` list and a
`process_docs` function).

References: the templates written out from the harness's files (cited beside each), and the harness's own
pipeline, `simple_evaluate(..., log_samples=True)` with its HF backend (`HFLM`) on the same tiny model, for
every log-likelihood, decision and aggregate; then the bad inputs through the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import babelprobe as bp
from babelprobe.benchmarks.bridges import belebele
from babelprobe.benchmarks.bridges import lmeval as bench_lmeval
from babelprobe.bundled import bundled_sets
from babelprobe.cli import main
from tests.cli_errors import fails, refused
from tests.tiny import tiny_lm

DATA = Path(__file__).parent / "data" / "lmeval"
XCOPA = bundled_sets("lm-eval")["lm-eval-sample"].location
BELEBELE = bundled_sets("belebele")["belebele-sample"].location
FAMILIES = {  # family: its tasks here
    "xcopa": ("xcopa_et", "xcopa_zh"),
    "xstorycloze": ("xstorycloze_en", "xstorycloze_ru"),
    "xwinograd": ("xwinograd_en", "xwinograd_jp"),
    "global_mmlu": ("global_mmlu_de_stem", "global_mmlu_de_business"),
    "belebele": ("belebele_eng_Latn", "belebele_zho_Hans"),
}
# groups of tasks of unequal sizes (xwinograd 3 and 2 documents, Global-MMLU 3 and 2), so weighting matters
GROUPS = {"xcopa_local": (FAMILIES["xcopa"], True), "xwinograd_local": (FAMILIES["xwinograd"], True),
          "global_mmlu_de_local": (FAMILIES["global_mmlu"], False)}
ALL_TASKS = [task for tasks in FAMILIES.values() for task in tasks]


def installed() -> Path:
    lm_eval = pytest.importorskip("lm_eval", reason="lm_eval (the lm-eval extra) is not installed")
    return Path(lm_eval.__file__).parent / "tasks"


def write_task(folder: Path, task: str, include: str, files: dict[str, Path]) -> None:
    """A task file that includes the installed harness's own and reads local JSON Lines files instead of the hub."""
    import yaml

    config = {"include": str(installed() / include), "task": task, "dataset_path": "json", "dataset_name": None,
              "dataset_kwargs": {"data_files": {split: str(path) for split, path in files.items()}}}
    (folder / f"{task}.yaml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")


def write_group(folder: Path, group: str, tasks: tuple[str, ...], weight_by_size: bool) -> None:
    import yaml

    config = {"group": group, "task": list(tasks), "metadata": {"version": 1.0},
              "aggregate_metric_list": [{"metric": "acc", "aggregation": "mean", "weight_by_size": weight_by_size}]}
    (folder / f"_{group}.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("lm-eval-tasks")
    for lang in ("et", "zh"):
        path = XCOPA / f"xcopa_{lang}.jsonl"
        write_task(folder, f"xcopa_{lang}", f"xcopa/default_{lang}.yaml", {"validation": path, "test": path})
    for lang in ("en", "ru"):
        path = DATA / "xstorycloze" / f"{lang}.jsonl"
        write_task(folder, f"xstorycloze_{lang}", f"xstorycloze/default_{lang}.yaml", {"train": path, "eval": path})
    for lang in ("en", "jp"):
        write_task(folder, f"xwinograd_{lang}", f"xwinograd/xwinograd_{lang}.yaml",
                   {"test": DATA / "xwinograd" / f"{lang}.jsonl"})
    for category in ("stem", "business"):
        write_task(folder, f"global_mmlu_de_{category}", f"global_mmlu/default/de/global_mmlu_de_{category}.yaml",
                   {"test": DATA / "global_mmlu" / "de-test.jsonl", "dev": DATA / "global_mmlu" / "de-dev.jsonl"})
    for config in ("eng_Latn", "zho_Hans"):
        write_task(folder, f"belebele_{config}", f"belebele/belebele_{config}.yaml", {"test": BELEBELE / f"{config}.jsonl"})
    for group, (tasks, weighted) in GROUPS.items():
        write_group(folder, group, tasks, weighted)
    # a task whose data file is missing (read only by the test of that refusal)
    write_task(folder, "xcopa_et_missing", "xcopa/default_et.yaml", {"test": folder / "missing.jsonl"})
    return folder


def source(task_dir: Path, *tasks: str) -> str:
    return f"lm-eval:{','.join(tasks)}@{task_dir}"


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def questions(items: pd.DataFrame, task: str) -> list[tuple[list, list, int]]:
    """Per document of `task`, in order: its requests (context, continuation) and gold index."""
    part = items[items["task"] == task].sort_values(["doc_id", "option"])
    return [(list(zip(doc["context"], doc["delimiter"] + doc["target"])), int(doc["gold"].iloc[0]))
            for _, doc in part.groupby("doc_id", sort=True)]


# ---------------------------------------------------------------------------------- the templates

def test_xcopa_requests_are_the_harness_functions_written_out(task_dir):
    # lm_eval/tasks/xcopa/utils.py: doc_to_text = premise.strip()[:-1] + " " + connector[question] (et: effect
    # "seetõttu", cause "sest"; zh: "所以", "因为"); doc_to_choice: each choice's first letter lower-cased;
    # default_<lang>.yaml: doc_to_target label, target_delimiter " " (the default)
    connectors = {"et": {"cause": "sest", "effect": "seetõttu"}, "zh": {"cause": "因为", "effect": "所以"}}
    items = bp.load_items(source(task_dir, "xcopa_et", "xcopa_zh"))
    for lang in ("et", "zh"):
        expected = []
        for r in records(XCOPA / f"xcopa_{lang}.jsonl"):
            context = r["premise"].strip()[:-1] + f" {connectors[lang][r['question']]}"
            expected.append(([(context, " " + c[0].lower() + c[1:]) for c in (r["choice1"], r["choice2"])], r["label"]))
        assert questions(items, f"xcopa_{lang}") == expected, lang
    assert set(items["language"]) == {"et", "zh"} and set(items["subset"]) == {"xcopa_et", "xcopa_zh"}
    assert set(items["task_version"]) == {"1.0"} and set(items["split"]) == {"test"}
    # the same document in both languages: one parallel_id, from the harness's document index
    gold = items[items["label"] == 1]
    assert gold.groupby("parallel_id")["language"].nunique().eq(2).all()
    assert sorted(gold["parallel_id"].unique()) == [f"xcopa-{i}" for i in range(4)]


def test_xwinograd_multiple_input_gives_each_option_its_context(task_dir):
    # lm_eval/tasks/xwinograd/utils.py: doc_to_choice = sentence[:idx] + option (the contexts), doc_to_target =
    # sentence[idx + 1:].strip() (one target after every context), doc_to_text = {"1": 0, "2": 1}[answer]
    items = bp.load_items(source(task_dir, "xwinograd_en", "xwinograd_jp"))
    for lang in ("en", "jp"):
        expected = []
        for r in records(DATA / "xwinograd" / f"{lang}.jsonl"):
            idx = r["sentence"].index("_")
            target = " " + r["sentence"][idx + 1:].strip()
            expected.append(([(r["sentence"][:idx] + o, target) for o in (r["option1"], r["option2"])],
                             {"1": 0, "2": 1}[r["answer"]]))
        assert questions(items, f"xwinograd_{lang}") == expected, lang
    # what acc_norm divides by under multiple input: the choices, i.e. the contexts (api/task.py process_results)
    assert (items["choice"] == items["context"]).all()
    assert set(items["language"]) == {"en", "ja"}  # the harness's "jp" is ISO 639-1 ja


def test_global_mmlu_process_docs_filters_and_the_letter_is_the_gold(task_dir):
    # global_mmlu/default/de: _de_template_yaml doc_to_text "{{question.strip()}}\nA. {{option_a}}\nB. ...
    # \nAnswer:", doc_to_choice ["A", "B", "C", "D"], doc_to_target answer (a letter: its index among the
    # choices); utils.py process_<category>: the documents of one subject_category
    items = bp.load_items(source(task_dir, "global_mmlu_de_local"))
    rows = records(DATA / "global_mmlu" / "de-test.jsonl")
    for task, category in (("global_mmlu_de_stem", "STEM"), ("global_mmlu_de_business", "Business")):
        expected = []
        for r in (r for r in rows if r["subject_category"] == category):
            context = (f"{r['question'].strip()}\nA. {r['option_a']}\nB. {r['option_b']}\nC. {r['option_c']}\n"
                       f"D. {r['option_d']}\nAnswer:")
            expected.append(([(context, f" {letter}") for letter in "ABCD"], "ABCD".index(r["answer"])))
        assert questions(items, task) == expected, task
    assert set(items["task"]) == set(FAMILIES["global_mmlu"])  # the group expanded; Humanities filtered out
    assert items["pair_id"].nunique() == 5


def test_xstorycloze_and_belebele_jinja_templates(task_dir):
    # xstorycloze/default_ar.yaml: doc_to_text "{{[input_sentence_1, ..., input_sentence_4]|join(' ')}}",
    # doc_to_choice "{{[sentence_quiz1, sentence_quiz2]}}", doc_to_target "{{answer_right_ending-1}}";
    # belebele/_default_template_yaml: "P: {{flores_passage}}\nQ: {{question.strip()}}\nA: ... \nAnswer:",
    # choices A-D, gold ['1', '2', '3', '4'].index(correct_answer_num): the bridge's own template
    items = bp.load_items(source(task_dir, *FAMILIES["xstorycloze"], *FAMILIES["belebele"]))
    for r, (requests, gold) in zip(records(DATA / "xstorycloze" / "ru.jsonl"), questions(items, "xstorycloze_ru")):
        context = " ".join(r[f"input_sentence_{i}"] for i in range(1, 5))
        assert requests == [(context, " " + r["sentence_quiz1"]), (context, " " + r["sentence_quiz2"])]
        assert gold == r["answer_right_ending"] - 1
    for r, (requests, gold) in zip(records(BELEBELE / "zho_Hans.jsonl"), questions(items, "belebele_zho_Hans")):
        assert requests == [(belebele.context(r), f" {letter}") for letter in "ABCD"]
        assert gold == int(r["correct_answer_num"]) - 1
    assert set(items.loc[items["task"].str.startswith("belebele"), "language"]) == {"en", "zh"}


def test_languages_select_tasks_before_their_data_is_read(task_dir, monkeypatch):
    from babelprobe import lmeval

    built = []
    original = lmeval.build
    monkeypatch.setattr(lmeval, "build", lambda leaf, src: built.append(leaf.name) or original(leaf, src))
    items = bp.load_items(source(task_dir, "xcopa_local", "xstorycloze_en"), languages=["zh"], limit=2)
    assert built == ["xcopa_zh"] and set(items["task"]) == {"xcopa_zh"}
    assert items["doc_id"].tolist() == [0, 0, 1, 1]  # the harness's --limit: the first documents


# ------------------------------------------------------------------------ against the harness's pipeline

@pytest.fixture(scope="module")
def harness_lm():
    """A tiny model whose tokenizer puts BOS first itself, as Gemma's does (the harness conditions a non-empty
    context on BOS only then; babelprobe always does)."""
    from tokenizers.processors import TemplateProcessing

    installed()
    lm = tiny_lm("llama", max_positions=2048)  # the tiny tokenizer spends about a token per CJK byte
    lm.tokenizer._tokenizer.post_processor = TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", lm.tokenizer.bos_token_id)])
    return lm


def simple_evaluate(lm, task_dir: Path, tasks: list[str]) -> dict:
    """The harness's own evaluation (`lm_eval.simple_evaluate`, zero-shot, its HF backend around the same model
    and tokenizer), with the per-document samples (`log_samples`)."""
    from lm_eval import simple_evaluate as evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    model = HFLM(pretrained=lm.model, tokenizer=lm.tokenizer, batch_size=4, device="cpu")
    return evaluate(model=model, tasks=tasks, task_manager=TaskManager(include_path=str(task_dir)), log_samples=True)


@pytest.fixture(scope="module")
def both(harness_lm, task_dir):
    """babelprobe's rows and summary (`bench lm-eval`'s run) and the harness's results on every task here."""
    wanted = ["xcopa_local", "global_mmlu_de_local", "xwinograd_local", *FAMILIES["xstorycloze"], *FAMILIES["belebele"]]
    data = bench_lmeval.load(source(task_dir, *wanted))
    rows = bench_lmeval.run(data, harness_lm, progress=False)
    return rows, bench_lmeval.summarize(rows), simple_evaluate(harness_lm, task_dir, wanted)


@pytest.mark.parametrize("family", FAMILIES)
def test_lls_and_decisions_equal_the_harness_log_samples(family, both):
    """Every option's LL (|Δ| ≤ 1e-4: float32 log-softmax of logits of magnitude ≲ 16 is exact to ~16 × 1.2e-7
    ≈ 2e-6 per token, and an option has ≤ 50 scored tokens here) and every acc / acc_norm decision."""
    rows, _, theirs = both
    for task in FAMILIES[family]:
        ours = rows[rows["task"] == task].sort_values("doc_id").reset_index(drop=True)
        samples = sorted(theirs["samples"][task], key=lambda s: s["doc_id"])
        assert ours["doc_id"].tolist() == [s["doc_id"] for s in samples], task
        width = max(len(s["filtered_resps"]) for s in samples)
        lls = np.array([[ll for ll, _ in s["filtered_resps"]] + [np.nan] * (width - len(s["filtered_resps"]))
                        for s in samples])
        np.testing.assert_allclose(ours[[f"ll_{i}" for i in range(width)]].to_numpy(float), lls, atol=1e-4, rtol=0)
        for metric in ("acc", "acc_norm"):
            if metric in samples[0]:
                assert ours[metric].tolist() == [s[metric] for s in samples], (task, metric)


def test_aggregates_carry_the_harness_names_and_values(both):
    """Per task `acc,none` (and its stderr), per group the harness's aggregate, weighted by size or not."""
    _, summary, theirs = both
    named = summary[summary["metric"].str.contains(",", regex=False)].set_index(["subset", "metric"])
    for name, result in theirs["results"].items():
        for key, value in result.items():
            if key.split(",")[0] in ("acc", "acc_norm") and isinstance(value, float):
                assert named.loc[(name, key), "value"] == pytest.approx(value, abs=1e-12), (name, key)
            if key == "acc_stderr,none" and name in ALL_TASKS:
                assert named.loc[(name, "acc,none"), "stderr"] == pytest.approx(value, abs=1e-12), name
    assert {"xcopa_local", "xwinograd_local", "global_mmlu_de_local"} <= set(theirs["groups"])
    assert named.loc[("xwinograd_local", "acc,none"), "interval"].endswith("weighted by size")
    assert named.loc[("global_mmlu_de_local", "acc,none"), "interval"].endswith("unweighted")


def test_the_bridges_are_presets_of_the_same_path(task_dir, harness_lm):
    """Belebele read by its hand-written bridge and by the harness's own task files: the same requests, gold,
    LLs and decisions (one scoring path; LLs to 1e-9: the same texts in the same batches)."""
    bridge = belebele.run(belebele.load("belebele-sample", languages=["en", "zh"]), harness_lm, progress=False)
    harness = bench_lmeval.run(bench_lmeval.load(source(task_dir, *FAMILIES["belebele"])), harness_lm,
                               progress=False)
    bridge = bridge.sort_values("language", kind="stable").reset_index(drop=True)  # each file's order
    harness = harness.sort_values(["language", "doc_id"]).reset_index(drop=True)
    assert bridge["language"].tolist() == harness["language"].tolist()
    columns = [f"ll_{i}" for i in range(4)]
    np.testing.assert_allclose(bridge[columns].to_numpy(float), harness[columns].to_numpy(float), atol=1e-9, rtol=0)
    for column in ("gold", "pred", "acc", "acc_norm", "acc_bytes", "correct"):
        assert bridge[column].tolist() == harness[column].tolist(), column


def test_the_bench_runner_takes_the_canonical_form_and_the_contracts(task_dir, harness_lm, tmp_path):
    """`run(items, out, settings, runtime)` (a source or what `load` read), and the benchmark contract's
    `run(data, models, settings, out, progress)` that `run_benchmark` calls: the same rows."""
    from babelprobe.benchmarks.base import Models
    from babelprobe.runtime import Runtime

    data = bench_lmeval.load(source(task_dir, "xcopa_local"))
    old = bench_lmeval.run(data, Models(harness_lm, progress=False), None, tmp_path / "old")
    new = bench_lmeval.run(source(task_dir, "xcopa_local"), tmp_path / "new", None,
                           Runtime(model=harness_lm, progress=False))
    assert new.drop(columns=["model"], errors="ignore").equals(old.drop(columns=["model"], errors="ignore"))


# ------------------------------------------------------------------------------------- the commands

@pytest.fixture(scope="module")
def harness_dir(tmp_path_factory, harness_lm):
    path = tmp_path_factory.mktemp("tiny-harness")
    harness_lm.model.save_pretrained(path)
    harness_lm.tokenizer.save_pretrained(path)
    return path


def test_items_from_lm_eval_writes_one_item_per_option(task_dir, tmp_path, capsys):
    out = tmp_path / "xcopa.jsonl"
    assert main(["items", "from-lm-eval", "xcopa_local", "--include-path", str(task_dir), "--out", str(out)]) == 0
    assert "8 documents (xcopa_et 4, xcopa_zh 4), 16 items" in capsys.readouterr().out
    items = bp.load_items(str(out))
    assert len(items) == 16 and set(items["task"]) == {"xcopa_et", "xcopa_zh"}
    assert items.groupby("pair_id")["label"].sum().eq(1).all()
    fails(["items", "from-lm-eval", "xcopa_local", "--include-path", task_dir, "--out", out], capsys,
          "exists; pass --overwrite")


def test_bench_lm_eval_writes_rows_summary_and_figures(task_dir, harness_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["bench", "lm-eval", "--tasks", "global_mmlu_de_local,xwinograd_jp", "--include-path", str(task_dir),
                 "--model", str(harness_dir), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "global_mmlu_de_local acc,none" in printed and "xwinograd_jp acc,none" in printed
    rows, summary = pd.read_csv(out / "items.csv"), pd.read_csv(out / "summary.csv")
    assert set(rows["task"]) == {*FAMILIES["global_mmlu"], "xwinograd_jp"} and len(rows) == 7
    # acc per task is the mean of the rows' decisions; the group's is the mean of its tasks' (not weighted)
    named = summary[summary["metric"] == "acc,none"].set_index("subset")["value"]
    by_task = rows.groupby("task")["acc"].mean()
    assert named[by_task.index].to_numpy() == pytest.approx(by_task.to_numpy())
    assert named["global_mmlu_de_local"] == pytest.approx(by_task[list(FAMILIES["global_mmlu"])].mean())
    for figure in ("bridge_accuracy", "bridge_norm_gap"):
        assert (out / f"{figure}.png").exists()


def test_compare_joins_harness_items_and_draws_the_peak_layers(task_dir, harness_dir, both, tmp_path, capsys):
    """compare on harness items (issue 42: `compare --items lm-eval:xcopa_et,xcopa_zh@DIR` writes the joined table
    and the peak-layer figure): direct (full texts: with one context per document, the harness's choice, since
    the context's log-prob is the same for every option), neuro (the gold option's state against the others',
    folds keeping a document's options together) joined per document; the probe target is recorded; compare
    draws the peak layer per language × task itself, the figure `report` draws from the same directory."""
    from PIL import Image

    out = tmp_path / "cmp"
    assert main(["compare", "--items", source(task_dir, "xcopa_et", "xcopa_zh"), "--model", str(harness_dir),
                 "--folds", "2", "--out", str(out), "--no-progress"]) == 0
    assert "figures peak_heatmap, method_bars" in capsys.readouterr().out
    drawn = out / "figures" / "peak_heatmap.png"
    with Image.open(drawn) as image:
        assert image.format == "PNG" and min(image.size) > 100
    joined = pd.read_csv(out / "items.csv")
    assert len(joined) == 8 and {"direct_correct", "neuro_correct"} <= set(joined.columns)
    harness = both[0].set_index("pair_id")  # the harness's LLs (checked against simple_evaluate above)
    strict = harness["correct"]  # gold strictly above the other option: what direct's `correct` asks
    assert joined.set_index("pair_id")["direct_correct"].astype(bool).to_dict() == strict.loc[joined["pair_id"]].to_dict()
    recorded = json.loads((out / "compare.json").read_text())
    assert "gold option" in recorded["probe_target"]
    assert main(["report", "--results", str(out), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "peak_heatmap.png").read_bytes() == drawn.read_bytes()  # the same figure


def test_compare_conditional_is_the_harness_choice_under_multiple_input(task_dir, harness_dir, both, tmp_path):
    """XWinograd gives each option its own context: whole texts differ in their contexts, so `compare
    --conditional` scores what the harness scores, each option's target given its context (its `correct`: the
    gold option strictly above the others, from the LLs checked against simple_evaluate above)."""
    out = tmp_path / "cmp"
    assert main(["compare", "--items", source(task_dir, "xwinograd_local"), "--conditional", "--model", str(harness_dir),
                 "--folds", "2", "--out", str(out), "--no-progress"]) == 0
    direct = pd.read_csv(out / "direct.csv").set_index("pair_id")
    harness = both[0].set_index("pair_id")
    strict = harness.loc[direct.index]
    np.testing.assert_allclose(direct["score_good"], [row[f"ll_{int(row['gold'])}"] for _, row in strict.iterrows()],
                               atol=1e-4, rtol=0)  # as the LL test above: ≤ 50 tokens × 2e-6
    assert direct["correct"].astype(bool).tolist() == strict["correct"].tolist()
    assert json.loads((out / "compare.json").read_text())["stages"]["direct"]["conditional"] is True


def test_parallel_documents_join_in_patch_pairs_and_the_lens(task_dir, tmp_path, harness_dir, capsys):
    """The harness's document index joins XCOPA's languages (parallel_id): pair patching writes Chinese's gold
    option state into every language's document of the same index; the lens reads each option's choice."""
    out = tmp_path / "patch"
    assert main(["patch", "--protocol", "pairs", "--items", source(task_dir, "xcopa_local"), "--sources", "zh",
                 "--model", str(harness_dir), "--n-boot", "20", "--out", str(out), "--no-progress"]) == 0
    rows = pd.read_csv(out / "pairs.csv")
    assert set(rows["language"]) == {"et", "zh"} and set(rows["parallel_id"]) == {f"xcopa-{i}" for i in range(4)}
    acts, common = tmp_path / "acts", ["--items", source(task_dir, *FAMILIES["belebele"]), "--model", str(harness_dir),
                                       "--no-progress"]
    assert main(["extract", *common, "--out", str(acts)]) == 0
    assert main(["lens", *common, "--acts", str(acts), "--target", "choice", "--out", str(tmp_path / "lens")]) == 0
    lensed = pd.read_csv(tmp_path / "lens" / "lens.csv")
    assert set(lensed["language"]) == {"en", "zh"} and lensed["item_id"].nunique() == 2 * 3 * 4  # Belebele options


def test_unknown_task_is_one_line_and_writes_nothing(task_dir, tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    fails(["items", "from-lm-eval", "xcopa_ett", "--include-path", task_dir, "--out", out], capsys,
          "unknown lm-evaluation-harness task 'xcopa_ett'", "did you mean xcopa_et")
    assert not out.exists()


def test_a_generation_task_is_refused_naming_its_type(task_dir, tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    fails(["items", "from-lm-eval", "gsm8k", "--include-path", task_dir, "--out", out], capsys,
          "task 'gsm8k' is a generate_until task", "multiple_choice tasks only")
    assert not out.exists()


def test_without_the_extra_installed_it_is_one_line_before_any_model(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` raises ImportError
    out = tmp_path / "x.jsonl"
    fails(["items", "from-lm-eval", "xcopa_et", "--out", out], capsys, "need the lm_eval package",
          "babelprobe[lm-eval]")
    assert not out.exists()
    refused(["compare", "--items", "lm-eval:xcopa_et", "--model", tmp_path / "no-model", "--out", tmp_path / "cmp"],
            capsys, tmp_path / "cmp", "babelprobe[lm-eval]")
    refused(["bench", "lm-eval", "--tasks", "xcopa_et", "--model", tmp_path / "no-model", "--out", tmp_path / "run"],
            capsys, tmp_path / "run", "babelprobe[lm-eval]")


def test_a_missing_task_folder_and_an_unreadable_data_file(task_dir, tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    fails(["items", "from-lm-eval", "xcopa_et", "--include-path", tmp_path / "nowhere", "--out", out], capsys,
          "--include-path", "nowhere: no such directory")
    fails(["items", "from-lm-eval", "xcopa_et_missing", "--include-path", task_dir, "--out", out], capsys,
          "task 'xcopa_et_missing' cannot be built")
    assert not out.exists()


def test_task_language_from_metadata_dataset_name_and_name():
    from babelprobe.lmeval import family, task_language

    assert task_language("xcopa_et", {"dataset_name": None}) == "et"
    assert task_language("xwinograd_jp", {"dataset_name": "jp"}) == "ja"
    assert task_language("belebele_deu_Latn", {"dataset_name": "deu_Latn"}) == "de"
    assert task_language("belebele_hin_Latn", {}) == "hi-Latn"
    assert task_language("global_mmlu_full_am_abstract_algebra", {}) == "am"
    assert task_language("arc_challenge_mt_is", {}) == "is"  # the last language token: not "mt"
    assert task_language("include_base_44_albanian", {}) == "sq"
    assert task_language("multiblimp_eng", {}) == "en"
    assert task_language("my_task", {"metadata": {"language": "de"}}) == "de"
    assert task_language("sentiment", {"dataset_name": "default"}) is None
    assert family("global_mmlu_de_business", "de") == "global_mmlu_business"
    assert family("belebele_deu_Latn", "de") == "belebele"


# ------------------------------------------------------------------------------------- the default model

@pytest.mark.slow
def test_default_model_equals_the_harness_on_five_families(task_dir, default_lm):
    """Gemma-3-270M through babelprobe and through the harness's own evaluation (`simple_evaluate`, its HF backend
    loading the converted default model's directory itself): every decision (acc, acc_norm) equal, every option's
    LL within max(1e-3, 5e-5 per scored token): the harness's float32 log-softmax over the 262,144-entry
    vocabulary drifts by ~2e-5 per token from babelprobe's (float32 logits, float64 after logsumexp), and
    batch padding moves float32 sums by ~1e-6 per token."""
    from lm_eval import simple_evaluate as evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from babelprobe.models import _converted_default

    wanted = ["xcopa_local", "global_mmlu_de_local", "xwinograd_local", *FAMILIES["xstorycloze"], *FAMILIES["belebele"]]
    rows = bench_lmeval.run(bench_lmeval.load(source(task_dir, *wanted)), default_lm, progress=False)
    model = HFLM(pretrained=str(_converted_default()), dtype="float32", device="cpu", batch_size=4)
    theirs = evaluate(model=model, tasks=wanted, task_manager=TaskManager(include_path=str(task_dir)), log_samples=True)
    for task in ALL_TASKS:
        ours = rows[rows["task"] == task].sort_values("doc_id").reset_index(drop=True)
        samples = sorted(theirs["samples"][task], key=lambda s: s["doc_id"])
        assert ours["doc_id"].tolist() == [s["doc_id"] for s in samples], task
        for row, sample in zip(ours.itertuples(), samples):
            lls = np.array([ll for ll, _ in sample["filtered_resps"]])
            mine = np.array([getattr(row, f"ll_{k}") for k in range(len(lls))])
            scored = np.array([getattr(row, f"n_tokens_{k}") for k in range(len(lls))], float)
            assert (np.abs(mine - lls) <= np.maximum(1e-3, 5e-5 * scored)).all(), (task, row.doc_id, mine - lls)
            for metric in ("acc", "acc_norm"):
                if metric in sample:
                    assert getattr(row, metric) == sample[metric], (task, row.doc_id, metric)
