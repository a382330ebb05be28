"""The benchmark contract (babelprobe/benchmarks/base.py), checked on every registered benchmark the way
scikit-learn's `parametrize_with_checks` checks every estimator: a benchmark added to `BENCHMARKS` is
checked here without a line of its own. The contract's names and `__all__`; settings declared with
`option()` and help; its bundled sample loads; its flags build (and `bench NAME --help` imports neither
torch, transformers, matplotlib nor pandas); `run_benchmark` on the bundled sample with a tiny in-test
model writes items.csv, summary.csv, run.json and the figure, rows that carry the model and its
fingerprint and a summary in the contract's columns, computable from the rows alone. Then the shared
`metric_row` and `wide` against hand-made tables, and the old flag spellings kept as hidden aliases."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import babelprobe as bp
from babelprobe.benchmarks import bridges
from babelprobe.benchmarks.base import (
    BENCHMARKS,
    CONTRACT,
    OPTIONAL,
    SUMMARY_COLUMNS,
    benchmark,
    benchmark_settings,
    metric_row,
    wide,
)
from babelprobe.bundled import bundled_sets
from babelprobe.errors import BabelprobeError

NAMES = list(BENCHMARKS)
ROW_COLUMNS = ("pair_id", "language", "subset", "method", "model", "fingerprint")  # docs/design.md "Results"


def quick_settings(module):
    """The default settings with every length cap (`budget` fields, e.g. max_new_tokens) at 4 tokens."""
    caps = {f.name: 4 for f in dataclasses.fields(module.Settings) if f.metadata.get("budget")}
    return benchmark_settings(module, **caps)


@pytest.mark.parametrize("name", NAMES)
def test_contract_names_and_all(name):
    module = benchmark(name)
    missing = [attr for attr in CONTRACT if not hasattr(module, attr)]
    assert not missing, f"{name} lacks {missing}"
    assert module.NAME == name and module.TITLE
    present = [attr for attr in CONTRACT + OPTIONAL if hasattr(module, attr)]
    assert module.__all__[:len(present)] == [a for a in module.__all__ if a in present], "the contract comes first"
    assert set(present) <= set(module.__all__)
    for attr in module.__all__:
        assert getattr(module, attr) is not None, attr


# what a preset leaves to the user to name (ECLeKTiC's paper protocol: the judge, Gemini 2.0 Flash in the paper;
# Pitfalls': the extractor, gpt-4o-mini in the release)
NAMED = {("eclektic", "paper"): {"judge": "self"}, ("pitfalls", "paper"): {"extractor": "self"}}


@pytest.mark.parametrize("name", NAMES)
def test_settings_are_declared_with_option_and_help(name):
    module = benchmark(name)
    assert dataclasses.is_dataclass(module.Settings) and module.Settings.__dataclass_params__.frozen
    for field in dataclasses.fields(module.Settings):
        assert field.metadata.get("help"), f"{name}: field {field.name} has no help (declare it with option())"
        assert field.default is not dataclasses.MISSING, field.name
    module.Settings()  # the defaults are valid
    for protocol, preset in getattr(module, "PROTOCOLS", {}).items():
        assert set(preset) <= {f.name for f in dataclasses.fields(module.Settings)}, protocol
        settings = benchmark_settings(module, protocol, **NAMED.get((name, protocol), {}))
        assert all(getattr(settings, k) == v for k, v in preset.items() if v is not None), protocol


@pytest.mark.parametrize("name", NAMES)
def test_the_bundled_samples_load_and_pass_the_checks(name):
    module, settings = benchmark(name), benchmark(name).Settings()
    samples = bundled_sets(name)
    assert samples, f"{name} has no bundled sample (babelprobe/bundled.py)"
    for sample in samples:
        data = module.load(sample)
        assert len(data) > 0, sample
        if hasattr(module, "prepare"):
            data = module.prepare(data, settings)
        if hasattr(module, "check"):
            module.check(data, settings)


@pytest.mark.parametrize("name", NAMES)
def test_flags_build_from_the_settings(name, capsys):
    with pytest.raises(SystemExit) as done:
        bp_main(["bench", name, "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    for field in dataclasses.fields(benchmark(name).Settings):
        flag = field.metadata.get("flag", "--" + field.name.replace("_", "-"))
        assert flag in shown, f"{name}: {flag} missing from --help"
    # the CLI vocabulary (docs/design.md "Benchmarks"): ECLeKTiC only generates, so it has no --answer
    fields = {f.name for f in dataclasses.fields(benchmark(name).Settings)}
    assert re.search(r"--answer \{likelihood,generate[,\w]*\}", shown) or "answer" not in fields  # pitfalls: +cot
    # the bridges score as lm-evaluation-harness does by default: plain text, likelihood only
    assert "--chat-template [{off,auto,on}]" in shown or name in bridges.HARNESS_SCORED


def bp_main(argv):
    from babelprobe.cli import main

    return main(argv)


@pytest.mark.parametrize("name", NAMES)
def test_bench_help_imports_neither_torch_nor_matplotlib(name):
    code = ("import argparse, sys\n"
            "from babelprobe.cli import bench\n"
            "parser = argparse.ArgumentParser(prog='babelprobe')\n"
            "bench.register(parser.add_subparsers())\n"
            "try:\n"
            f"    parser.parse_args(['bench', {name!r}, '--help'])\n"
            "except SystemExit:\n"
            "    pass\n"
            "heavy = {'torch', 'transformers', 'matplotlib', 'pandas', 'babelprobe.models'} & set(sys.modules)\n"
            "print(sorted(heavy), file=sys.stderr)\n"
            "assert not heavy\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def tiny_wide():
    """The tiny model with room for a Belebele passage, byte-level tokenised (Hindi: ~900 tokens)."""
    from tests.tiny import tiny_lm

    return tiny_lm("llama", max_positions=2048)


@pytest.mark.parametrize("name", NAMES)
def test_run_benchmark_on_the_bundled_sample_writes_rows_summary_manifest_and_figure(name, tiny_wide, tmp_path):
    tiny_long = tiny_wide
    module = benchmark(name)
    out = tmp_path / name
    sample = next(iter(bundled_sets(name)))
    result = bp.run_benchmark(name, tiny_long, sample, out, quick_settings(module), limit=2, progress=False)
    for written in ("items.csv", "summary.csv", "run.json"):
        assert (out / written).stat().st_size > 0, written
    assert result.figures and all(path.exists() for path in result.figures)
    assert {p.suffix for p in result.figures} == {".pdf", ".png"}
    rows, summary = pd.read_csv(out / "items.csv"), pd.read_csv(out / "summary.csv")
    assert set(ROW_COLUMNS) <= set(rows.columns), set(ROW_COLUMNS) - set(rows.columns)
    asked = rows[rows["model"].notna()]
    assert set(asked["model"]) == {tiny_long.name} and set(asked["fingerprint"]) == {tiny_long.fingerprint}
    assert set(SUMMARY_COLUMNS) <= set(summary.columns) and len(summary)
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["benchmark"] == name and manifest["fingerprint"] == tiny_long.fingerprint
    again = module.summarize(rows)  # the summary is computed from the rows alone
    assert len(again) == len(summary)
    np.testing.assert_allclose(again["value"].to_numpy(float), summary["value"].to_numpy(float), equal_nan=True)
    assert module.format_summary(summary)


@pytest.mark.parametrize("name", [n for n in NAMES if getattr(benchmark(n), "PROTOCOLS", {})])
def test_a_flag_contradicting_the_protocol_is_one_line_and_writes_nothing(name, tmp_path, capsys):
    module = benchmark(name)
    fields = {f.name: f for f in dataclasses.fields(module.Settings)}
    protocol, preset = next(iter(module.PROTOCOLS.items()))
    field, value = next((fields[k], v) for k, v in preset.items()
                        if fields[k].metadata.get("choices") and not fields[k].metadata.get("budget"))
    other = next(c for c in fields[field.name].metadata["choices"] if c != value)
    flag = field.metadata.get("flag", "--" + field.name.replace("_", "-"))
    out = tmp_path / "out"
    code = bp_main(["bench", name, "--items", next(iter(bundled_sets(name))), "--protocol", protocol, flag, other,
                    "--model", str(tmp_path / "no-model"), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0] == f"babelprobe: error: --protocol {protocol} runs {flag} {value}; drop {flag} {other} or the --protocol"
    assert not out.exists()


# ------------------------------------------------------------------------------------ shared helpers

def test_metric_row_puts_the_cell_then_the_contract_columns():
    row = metric_row({"language": "de"}, "accuracy", 3 / 4, 0.3, 0.95, 4, "wilson", k=3)
    assert list(row) == ["language", *SUMMARY_COLUMNS, "k"]
    assert row["value"] == 0.75 and row["n"] == 4 and row["k"] == 3
    empty = metric_row({}, "records_skipped", 2, n=10)
    assert np.isnan(empty["ci_low"]) and empty["interval"] == "" and isinstance(empty["value"], float)


def test_wide_has_one_row_per_cell_and_a_column_per_metric():
    long = pd.DataFrame([
        metric_row({"pair": "en_de", "task": "usage"}, "accuracy", 0.5, 0.2, 0.8, 10, "wilson", n_unique=7),
        metric_row({"pair": "en_de", "task": "usage"}, "bias", -0.25, -0.5, 0.1, 10, "bootstrap", n_unique=7),
        metric_row({"pair": "zh_ja", "task": "usage"}, "accuracy", 1.0, 0.7, 1.0, 6, "wilson", n_unique=6),
    ])
    table = wide(long, ["pair", "task"], carry=("n_unique",))
    assert list(table.columns) == ["pair", "task", "accuracy", "accuracy_low", "accuracy_high", "accuracy_n", "bias",
                                   "bias_low", "bias_high", "bias_n", "n_unique"]
    assert table["pair"].tolist() == ["en_de", "zh_ja"]
    assert table["accuracy"].tolist() == [0.5, 1.0] and table["accuracy_n"].tolist() == [10, 6]
    assert table.loc[0, "bias_low"] == -0.5 and np.isnan(table.loc[1, "bias"])
    assert table["n_unique"].tolist() == [7, 6]


def test_with_chat_template_off_auto_on(tiny_long):
    from babelprobe.benchmarks.core.generate import local_generator, with_chat_template
    from tests.tiny import tiny_lm

    plain = local_generator(tiny_long)  # a model without a chat template
    chat_lm = tiny_lm("llama", max_positions=512)
    chat_lm.tokenizer.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
    chat = local_generator(chat_lm)
    assert with_chat_template(plain, "off") is plain and with_chat_template(plain, "auto") is plain
    assert not with_chat_template(chat, "off").chat_template and with_chat_template(chat, "auto").chat_template
    assert with_chat_template(chat, "on").chat_template
    with pytest.raises(BabelprobeError, match="has no chat template"):
        with_chat_template(plain, "on")

    class Endpoint:  # an OpenAI chat endpoint sends a user turn by itself
        name = "openai:m@http://127.0.0.1:9/v1"

    endpoint = Endpoint()
    assert with_chat_template(endpoint, "auto") is endpoint
    with pytest.raises(BabelprobeError, match="--chat-template on applies to local generators"):
        with_chat_template(endpoint, "on")


# ------------------------------------------------------------------------------ old spellings

def bench_settings(argv: list[str]):
    """The settings `babelprobe bench ...` builds from `argv` (parsing only)."""
    from babelprobe.cli import bench
    from babelprobe.cli.common import settings_from

    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", *argv, "--items", "x", "--out", "o"])
    module = benchmark(args.benchmark_name)
    return settings_from(args, module.Settings, getattr(module, "PROTOCOLS", {}))


@pytest.mark.parametrize("argv, field, value", [
    (["stingray", "--inference", "generation"], "answer", "generate"),
    (["stingray", "--answer", "generation"], "answer", "generate"),
    (["stingray", "--chat", "auto"], "chat_template", "auto"),
    (["stingray", "--chat-template"], "chat_template", "on"),
    (["eclektic", "--chat-template"], "chat_template", "on"),  # the earlier boolean flag
    (["eclektic", "--no-chat-template"], "chat_template", "off"),
    (["consistency", "--chat-template", "auto"], "chat_template", "auto"),
    (["pitfalls", "--chat-template", "on"], "chat_template", "on"),
])
def test_old_flags_and_values_are_hidden_aliases(argv, field, value):
    assert getattr(bench_settings(argv), field) == value


@pytest.mark.parametrize("name", ["eclektic", "consistency", "pitfalls"])
def test_a_boolean_chat_template_from_code_reads_as_on_or_off(name):
    settings = benchmark(name).Settings
    assert settings(chat_template=True).chat_template == "on" and settings(chat_template=False).chat_template == "off"
    with pytest.raises(BabelprobeError, match="--chat-template: unknown value 'sometimes'"):
        settings(chat_template="sometimes")


def test_hidden_aliases_stay_out_of_the_help(capsys):
    with pytest.raises(SystemExit):
        bp_main(["bench", "stingray", "--help"])
    shown = capsys.readouterr().out
    assert "--inference" not in shown and not re.search(r"--chat(?!-template)", shown)
    assert "--answer {likelihood,generate}" in shown  # the old value 'generation' is accepted, not shown
