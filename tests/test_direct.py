"""Direct scoring on tiny models: per-pair rows, reductions and the CLI."""

import numpy as np
import pandas as pd
import pytest

from babelprobe.benchmarks.direct import score_direct
from babelprobe.cli import main
from babelprobe.items import load_items
from tests.test_logprobs import reference_token_logprobs

PAIRS = [("en", "A dog", "A chair", "can bark."), ("de", "Ein Hund", "Ein Stuhl", "kann bellen."),
         ("zh", "狗", "椅子", "会汪汪叫。"), ("ru", "Собака", "Кошка", "умеет лаять.")]


def pair_items():
    rows = []
    for lang, good, bad, phrase in PAIRS:
        sep = "" if lang == "zh" else " "
        for label, prefix in ((1, good), (0, bad)):
            rows.append({"item_id": f"{lang}-{label}", "pair_id": f"p-{lang}", "language": lang,
                         "subset": "taxonomic", "label": label, "prefix": prefix, "continuation": phrase,
                         "text": prefix + sep + phrase})
    return load_items(pd.DataFrame(rows))


def test_one_row_per_pair_with_design_columns(tiny):
    out = score_direct(tiny, pair_items(), progress=False)
    assert len(out) == len(PAIRS)
    for col in ("pair_id", "language", "subset", "method", "text_good", "text_bad", "score_good",
                "score_bad", "correct", "bos_policy"):
        assert col in out.columns
    for row in out.itertuples():
        assert row.score_good == pytest.approx(reference_token_logprobs(tiny, row.text_good).sum(), abs=1e-4)
        assert row.correct == (row.score_good > row.score_bad)
    assert set(out["method"]) == {"direct"} and set(out["bos_policy"]) == {"bos"}


def test_reductions_are_derived_from_the_same_token_logprobs(tiny):
    items = pair_items()
    total = score_direct(tiny, items, progress=False)
    for reduction in ("mean", "per_char", "per_byte"):
        out = score_direct(tiny, items, reduction=reduction, progress=False)
        for t, r in zip(total.itertuples(), out.itertuples()):
            if reduction == "mean":
                expected = t.score_good / t.n_tokens_good
            elif reduction == "per_char":
                expected = t.score_good / len(t.text_good)
            else:
                expected = t.score_good / len(t.text_good.encode("utf-8"))
            assert r.score_good == pytest.approx(expected)


def test_conditional_scores_only_the_continuation(tiny):
    out = score_direct(tiny, pair_items(), conditional=True, progress=False)
    row = out[out["language"] == "de"].iloc[0]
    full = reference_token_logprobs(tiny, "Ein Hund kann bellen.")
    n_cont = row["n_tokens_good"]
    assert row["score_good"] == pytest.approx(full[-n_cont:].sum(), abs=1e-5)
    assert set(out["scope"]) == {"continuation"}


def test_cli_writes_rows_and_prints_accuracy(tiny_dir, tmp_path, capsys):
    items_path = tmp_path / "items.jsonl"
    pair_items().to_json(items_path, orient="records", lines=True, force_ascii=False)
    out = tmp_path / "direct.csv"
    code = main(["score", "direct", "--model", str(tiny_dir), "--items", str(items_path), "--out", str(out),
                 "--no-progress"])
    assert code == 0
    table = pd.read_csv(out)
    assert len(table) == len(PAIRS) and np.isfinite(table["score_good"]).all()
    assert "direct accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--model", "no/such/thing/here"], "unknown model spec"),
    (["--items", "missing.jsonl"], "neither a bundled set"),
    (["--reduction", "sum", "--languages", "xx"], "language xx not in the items"),
])
def test_cli_user_mistakes_are_one_line_errors(tiny_dir, tmp_path, capsys, argv, message):
    items_path = tmp_path / "items.jsonl"
    pair_items().to_json(items_path, orient="records", lines=True, force_ascii=False)
    base = {"--model": str(tiny_dir), "--items": str(items_path)}
    for flag, value in zip(argv[::2], argv[1::2]):
        base[flag] = value
    args = ["score", "direct", "--out", str(tmp_path / "o.csv"), "--no-progress"]
    for flag, value in base.items():
        args += [flag, value]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("babelprobe: error:") and message in err and "\n" not in err
    assert not (tmp_path / "o.csv").exists()
