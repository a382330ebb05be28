"""Minimal pairs in the layouts their authors release them (docs/datasets.md "Minimal pairs").

Every fixture is a few records written for babelprobe in one released layout, built from the public
descriptions (the COMPS repository's README and data README, the XCOMPS hub export as the
lm-evaluation-harness XCOMPS tasks read it, the XCOMPS repository's data/comps_<lang>.json as its
readers use it); each test names the layout it mimics. Each layout must load with `babelprobe items
show FILE` and run a `--limit 5` scoring on the tiny test model: direct, and meta where its fields allow.
"""

import json

import pandas as pd
import pytest

from babelprobe.cli import main
from babelprobe.errors import BabelprobeError
from babelprobe.items import load_items, to_pairs
from babelprobe.tables import read_table, write_table

# (property, acceptable concept + its prefix, unacceptable concept + its prefix, negative type); English.
EN = [("can bark", "dog", "a dog", "cat", "a cat", "taxonomic"),
      ("can climb trees", "cat", "a cat", "dog", "a dog", "taxonomic"),
      ("can fly", "eagle", "an eagle", "dog", "a dog", "taxonomic"),
      ("has four legs", "chair", "a chair", "eagle", "an eagle", "taxonomic"),
      ("can bark", "dog", "a dog", "eagle", "an eagle", "taxonomic"),
      ("can fly", "eagle", "an eagle", "cat", "a cat", "taxonomic"),
      ("can climb trees", "cat", "a cat", "chair", "a chair", "random"),
      ("can fly", "eagle", "an eagle", "chair", "a chair", "random")]
# The same in German and Chinese, as whole sentences (XCOMPS): property, good, bad, good sentence, bad sentence.
DE = [("kann bellen", "Hund", "Katze", "Ein Hund kann bellen.", "Eine Katze kann bellen."),
      ("kann klettern", "Katze", "Hund", "Eine Katze kann klettern.", "Ein Hund kann klettern."),
      ("hat vier Beine", "Stuhl", "Hund", "Ein Stuhl hat vier Beine.", "Ein Hund hat vier Beine.")]
ZH = [("会汪汪叫", "狗", "猫", "狗会汪汪叫。", "猫会汪汪叫。"),
      ("会爬树", "猫", "狗", "猫会爬树。", "狗会爬树。")]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def comps_records(wugs=False):
    """COMPS as released (github.com/kanishkamisra/comps, data/comps/comps_base.jsonl and comps_wugs.jsonl):
    one JSON object per line with id, property, acceptable_concept, unacceptable_concept,
    prefix_acceptable, prefix_unacceptable, property_phrase, negative_sample_type, similarity; the wugs
    files add base_id, nonsense_words (a list) and distraction_type, and put the concept in a context
    sentence before the nonce word."""
    rows = []
    for i, (prop, good, good_np, bad, bad_np, kind) in enumerate(EN):
        row = {"id": 100 + i, "property": prop, "acceptable_concept": good, "unacceptable_concept": bad,
               "prefix_acceptable": good_np, "prefix_unacceptable": bad_np, "property_phrase": prop + ".",
               "negative_sample_type": kind, "similarity": 0.5}
        if wugs:
            row.update(base_id=i, nonsense_words=["wug", "fep"], distraction_type="undistracted",
                       prefix_acceptable=f"A wug is {good_np}. Therefore, a wug",
                       prefix_unacceptable=f"A wug is {bad_np}. Therefore, a wug")
        rows.append(row)
    return rows


def xcomps_records(table, concepts=False):
    """XCOMPS records: the two sentences (acceptable_sent, unacceptable_sent) and negative_sample_type;
    with `concepts`, also COMPS's property/acceptable_concept/unacceptable_concept in the same language
    (an assumption: which of these the release carries is not documented; see docs/datasets.md)."""
    rows = []
    for prop, good, bad, good_sent, bad_sent in table:
        row = {"acceptable_sent": good_sent, "unacceptable_sent": bad_sent, "negative_sample_type": "taxonomic"}
        if concepts:
            row.update(property=prop, acceptable_concept=good, unacceptable_concept=bad)
        rows.append(row)
    return rows


def cli(*argv):
    return main([str(a) for a in argv])


def show(path, capsys, *extra):
    assert cli("items", "show", path, "--rows", "4", *extra) == 0
    return capsys.readouterr()


def score(method, model, items, out, *extra):
    assert cli("score", method, "--model", model, "--items", items, "--limit", 5, "--out", out, "--no-progress",
               *extra) == 0
    return pd.read_csv(out)


def fails(capsys, *argv):
    assert cli(*argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("babelprobe: error:")]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------------------------------------ COMPS

def test_comps_base_as_released_is_english_and_scores_direct_conditional_and_meta(tmp_path, tiny_dir, capsys):
    """Layout: COMPS, data/comps/comps_base.jsonl of github.com/kanishkamisra/comps, under its own name."""
    path = write_jsonl(tmp_path / "comps_base.jsonl", comps_records())
    printed = show(path, capsys).out
    assert "16 items, 8 pairs, valid" in printed and "en" in printed

    items = load_items(path)
    assert set(items["language"]) == {"en"}
    assert items["text"].tolist()[:2] == ["a dog can bark.", "a cat can bark."]
    assert items["prefix"].tolist()[:2] == ["a dog", "a cat"] and items["continuation"].iloc[0] == "can bark."
    assert "prefix_acceptable" not in items.columns  # the texts are made from it; not repeated in every row

    direct = score("direct", tiny_dir, path, tmp_path / "direct.csv")
    assert len(direct) == 5 + 2  # --limit 5 per language × subset: 5 taxonomic, both random
    assert direct["id"].tolist() == [100, 101, 102, 103, 104, 106, 107]  # the release's ids reach the results
    conditional = score("direct", tiny_dir, path, tmp_path / "cond.csv", "--conditional")
    assert (conditional["scope"] == "continuation").all()
    assert (conditional["n_tokens_good"] < direct["n_tokens_good"]).all()
    meta = score("meta", tiny_dir, path, tmp_path / "meta.csv")
    assert meta["text_good"].tolist()[:2] == ["dog", "cat"] and meta["text_bad"].tolist()[:2] == ["cat", "dog"]
    assert '"can bark", "dog" or "cat"' in meta["prompt_gf"].iloc[0]  # property and concepts of the record


def test_comps_wugs_as_released_keeps_its_list_field_as_json(tmp_path, tiny_dir, capsys):
    """Layout: COMPS-WUGS, data/comps/comps_wugs.jsonl (and the comps_wugs_dist-* files) of kanishkamisra/comps."""
    for name in ("comps_wugs.jsonl", "comps_wugs_dist-before.jsonl"):
        path = write_jsonl(tmp_path / name, comps_records(wugs=True))
        assert set(load_items(path)["language"]) == {"en"}
    printed = show(path, capsys).out
    assert "A wug is a dog. Therefore, a wug can bark." in printed

    out = tmp_path / "wugs.csv"
    score("direct", tiny_dir, path, out)
    raw = pd.read_csv(out, dtype=str)
    assert set(raw["nonsense_words"]) == {'["wug", "fep"]'}  # JSON, not numpy's ['wug' 'fep']
    assert read_table(out)["nonsense_words"].iloc[0] == ["wug", "fep"]
    assert set(raw["distraction_type"]) == {"undistracted"}


def test_renamed_comps_file_needs_language_and_the_override_is_checked(tmp_path, capsys):
    """Layout: COMPS comps_base.jsonl saved under another name (no language field, no code in the name)."""
    path = write_jsonl(tmp_path / "my_pairs.jsonl", comps_records())
    line = fails(capsys, "items", "show", path)
    assert "my_pairs.jsonl: cannot tell the language" in line and "--language" in line
    assert "16 items" in show(path, capsys, "--language", "en").out
    assert set(load_items(path, language="en")["language"]) == {"en"}

    tagged = write_jsonl(tmp_path / "tagged.jsonl", [dict(r, language="en") for r in comps_records()])
    line = fails(capsys, "items", "show", tagged, "--language", "de")
    assert "--language de given, but its 'language' field says en" in line
    assert set(load_items(tagged, language="en")["language"]) == {"en"}


# ----------------------------------------------------------------------------------------------- XCOMPS

@pytest.fixture
def xcomps_hub(monkeypatch):
    """Layout: the XCOMPS hub export `fpadovani/xcomps-dataset` (as the lm-evaluation-harness XCOMPS tasks
    load it): one split per language named comps_<lang>, columns acceptable_sent and unacceptable_sent."""
    import datasets

    splits = {"comps_de": [{"acceptable_sent": g, "unacceptable_sent": b} for *_, g, b in DE],
              "comps_zh": [{"acceptable_sent": g, "unacceptable_sent": b} for *_, g, b in ZH]}

    def load_dataset(name, config=None, split=None):
        assert name == "fpadovani/xcomps-dataset" and config is None
        data = datasets.DatasetDict({key: datasets.Dataset.from_list(rows) for key, rows in splits.items()})
        return data[split] if split else data

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return "hf:fpadovani/xcomps-dataset"


def test_xcomps_hub_layout_takes_the_language_from_each_split(xcomps_hub, tmp_path, tiny_dir, capsys):
    printed = show(xcomps_hub, capsys).out
    assert "10 items, 5 pairs, valid" in printed
    items = load_items(xcomps_hub)
    assert items.groupby("language")["pair_id"].nunique().to_dict() == {"de": 3, "zh": 2}
    assert items.loc[items["language"] == "zh", "text"].tolist()[:2] == ["狗会汪汪叫。", "猫会汪汪叫。"]
    assert set(items["subset"]) == {"all"}  # the export has no negative_sample_type
    assert set(load_items(xcomps_hub + "::comps_zh")["language"]) == {"zh"}  # hf:ORG/NAME:config:split

    direct = score("direct", tiny_dir, xcomps_hub, tmp_path / "direct.csv")
    assert direct.groupby("language").size().to_dict() == {"de": 3, "zh": 2}

    # Neither the meta prompt nor --conditional can be built from two sentences alone: say what is missing.
    line = fails(capsys, "score", "meta", "--model", tiny_dir, "--items", xcomps_hub, "--out", tmp_path / "m.csv",
                 "--no-progress")
    assert "missing: property, acceptable_concept, unacceptable_concept" in line and "score direct" in line
    line = fails(capsys, "score", "direct", "--conditional", "--model", tiny_dir, "--items", xcomps_hub,
                 "--out", tmp_path / "c.csv", "--no-progress")
    assert "'property_phrase' (or 'property') field" in line and "drop --conditional" in line


def test_xcomps_hub_files_downloaded_as_parquet(tmp_path, capsys):
    """Layout: a parquet file of the XCOMPS hub export as the hub stores it (comps_de-00000-of-00001.parquet)."""
    path = tmp_path / "comps_de-00000-of-00001.parquet"
    pd.DataFrame([{"acceptable_sent": g, "unacceptable_sent": b} for *_, g, b in DE]).to_parquet(path)
    assert "6 items, 3 pairs" in show(path, capsys).out
    assert set(load_items(path)["language"]) == {"de"}


def test_xcomps_repository_json_keyed_by_id(tmp_path, tiny_dir, capsys):
    """Layout: github.com/LinyangHe/XCOMPS data/comps_<lang>.json, a JSON object of records keyed by id."""
    records = {str(10 + i): row for i, row in enumerate(xcomps_records(DE))}
    path = tmp_path / "comps_de.json"
    path.write_text(json.dumps(records, ensure_ascii=False, indent=1), encoding="utf-8")
    printed = show(path, capsys).out
    assert "6 items, 3 pairs, valid" in printed
    items = load_items(path)
    assert set(items["language"]) == {"de"} and set(items["subset"]) == {"taxonomic"}
    assert items["id"].unique().tolist() == ["10", "11", "12"]  # the keys are the records' ids
    direct = score("direct", tiny_dir, path, tmp_path / "direct.csv")
    assert direct["id"].tolist() == [10, 11, 12]


def test_xcomps_with_concept_and_property_fields_runs_meta_and_conditional(tmp_path, tiny_dir, capsys):
    """Layout: XCOMPS records (data/comps_<lang>.json) that also carry COMPS's property and concept fields
    in their language (assumed; the release's documentation does not list them)."""
    path = tmp_path / "comps_de.json"
    path.write_text(json.dumps({str(i): r for i, r in enumerate(xcomps_records(DE, concepts=True))},
                               ensure_ascii=False), encoding="utf-8")
    items = load_items(path)
    assert items["prefix"].tolist()[:2] == ["Ein Hund", "Eine Katze"]
    assert items["continuation"].tolist()[:2] == ["kann bellen.", "kann bellen."]
    zh = tmp_path / "comps_zh.json"
    zh.write_text(json.dumps({str(i): r for i, r in enumerate(xcomps_records(ZH, concepts=True))},
                             ensure_ascii=False), encoding="utf-8")
    assert to_pairs(load_items(zh))[["prefix_good", "continuation_good"]].iloc[0].tolist() == ["狗", "会汪汪叫。"]

    meta = score("meta", tiny_dir, path, tmp_path / "meta.csv")
    assert meta["text_good"].tolist() == ["Hund", "Katze", "Stuhl"]
    assert set(meta["prompt_language"]) == {"de"}  # asked in the items' language, with the record's words
    assert '"kann bellen", "Hund"' in meta["prompt_gf"].iloc[0]
    conditional = score("direct", tiny_dir, path, tmp_path / "cond.csv", "--conditional")

    # The same pairs in COMPS's own layout (explicit prefixes and phrase) must score the same.
    comps = write_jsonl(tmp_path / "comps_de.jsonl", [
        {"prefix_acceptable": g.removesuffix(f" {p}."), "prefix_unacceptable": b.removesuffix(f" {p}."),
         "property_phrase": p + ".", "negative_sample_type": "taxonomic"} for p, _, _, g, b in DE])
    reference = score("direct", tiny_dir, comps, tmp_path / "ref.csv", "--conditional")
    for column in ("score_good", "score_bad", "n_tokens_good", "n_tokens_bad"):
        assert conditional[column].tolist() == reference[column].tolist()


def test_property_that_does_not_end_the_sentences_gives_no_prefix(tmp_path):
    """Layout: XCOMPS records with a property field, in a language where the concept is not first."""
    rows = [{"acceptable_sent": "Bellen kann ein Hund.", "unacceptable_sent": "Bellen kann eine Katze.",
             "property": "kann bellen"}]
    items = load_items(write_jsonl(tmp_path / "comps_de.jsonl", rows))
    assert items["text"].tolist() == ["Bellen kann ein Hund.", "Bellen kann eine Katze."]
    assert "prefix" not in items.columns  # no made-up split; --conditional then says what is missing


# -------------------------------------------------------------------------------------- broken records

def test_broken_released_records_are_counted_reported_and_skipped(tmp_path, tiny_dir, capsys):
    """Layout: XCOMPS data/comps_<lang>.json with three records that cannot be scored."""
    rows = xcomps_records(DE) + [
        {"acceptable_sent": "Ein Hund kann bellen.", "unacceptable_sent": None, "negative_sample_type": "random"},
        {"acceptable_sent": " ", "unacceptable_sent": "Eine Katze kann bellen.", "negative_sample_type": "random"},
        {"acceptable_sent": "Ein Hund kann bellen.", "unacceptable_sent": "Ein Hund kann bellen.",
         "negative_sample_type": "random"}]
    path = tmp_path / "comps_de.json"
    path.write_text(json.dumps({str(i): r for i, r in enumerate(rows)}, ensure_ascii=False), encoding="utf-8")

    captured = show(path, capsys)
    assert "6 items, 3 pairs, valid; 3 released records skipped" in captured.out
    assert "skipped 3 of 6 records that cannot be scored" in captured.err
    for reason in ("1 with empty 'unacceptable_sent' (first: ", "record '3'", "1 with empty 'acceptable_sent'",
                   "1 with identical sentences (first: "):
        assert reason in captured.err
    items = load_items(path)
    assert items.attrs["skipped"][0]["reasons"] == {"empty 'unacceptable_sent'": 1, "empty 'acceptable_sent'": 1,
                                                    "identical sentences": 1}
    assert score("direct", tiny_dir, path, tmp_path / "direct.csv")["id"].tolist() == [0, 1, 2]
    assert "skipped 3 of 6" in capsys.readouterr().err  # on the terminal of the scoring run too

    comps = comps_records()  # Layout: COMPS comps_base.jsonl with two records that cannot be scored
    comps[1]["prefix_unacceptable"] = comps[1]["prefix_acceptable"]
    del comps[2]["property_phrase"]
    items = load_items(write_jsonl(tmp_path / "comps_base.jsonl", comps))
    assert items.attrs["skipped"][0]["reasons"] == {"identical sentences": 1, "empty 'property_phrase'": 1}
    assert items["id"].nunique() == len(comps) - 2
    assert "comps_base.jsonl:2" in capsys.readouterr().err  # the first record skipped for that reason

    only_broken = tmp_path / "comps_fr.json"
    only_broken.write_text(json.dumps({"0": rows[-1]}), encoding="utf-8")
    assert "none of its 1 records can be scored: 1 with identical sentences" in fails(capsys, "items", "show",
                                                                                       only_broken)


def test_items_in_the_schema_keep_their_strict_errors(tmp_path):
    """Not a release: a user's own items (the schema) still stop at the first problem, naming the line."""
    rows = [{"item_id": f"p-{lab}", "pair_id": "p", "language": "en", "subset": "s", "label": lab,
             "text": "A dog can bark." if lab else " "} for lab in (1, 0)]
    with pytest.raises(BabelprobeError, match=r"own.jsonl:2: item p-0 has an empty or whitespace-only text"):
        load_items(write_jsonl(tmp_path / "own.jsonl", rows))
    rows[1]["text"] = "A cat can bark."
    no_language = [{k: v for k, v in r.items() if k != "language"} for r in rows]
    path = write_jsonl(tmp_path / "own.jsonl", no_language)
    with pytest.raises(BabelprobeError, match="missing field 'language'"):
        load_items(path)
    assert set(load_items(path, language="de")["language"]) == {"de"}


# ----------------------------------------------------------------------------------- file formats

def test_tsv_items_are_read_without_quoting_and_bad_lines_are_named(tmp_path, capsys):
    header = "item_id\tpair_id\tlanguage\tsubset\tlabel\ttext\n"
    good = tmp_path / "items.tsv"
    good.write_text(header + 'a\tp\ten\tall\t1\tA "dog" can bark.\nb\tp\ten\tall\t0\tA cat can bark.\n',
                    encoding="utf-8")
    assert load_items(good)["text"].tolist() == ['A "dog" can bark.', "A cat can bark."]
    assert "2 items, 1 pairs" in show(good, capsys).out
    (tmp_path / "more.jsonl").write_text(json.dumps({"item_id": "c", "pair_id": "q", "language": "en", "subset": "all",
                                                     "label": 1, "text": "An eagle can fly."}) + "\n")
    assert len(load_items(tmp_path)) == 3  # a directory reads its .tsv files too

    bad = tmp_path / "bad.tsv"
    bad.write_text(header + "a\tp\ten\tall\t1\tA dog\tcan bark.\n", encoding="utf-8")
    assert "bad.tsv:2: 7 fields where the header has 6" in fails(capsys, "items", "show", bad)
    short = tmp_path / "short.tsv"  # fields missing at the end of a row are missing values, named by the schema
    short.write_text(header + "a\tp\ten\tall\t1\n", encoding="utf-8")
    assert "short.tsv:2: missing field 'text'" in fails(capsys, "items", "show", short)
    csv = tmp_path / "bad.csv"  # one field too many must not become pandas' silent index column
    csv.write_text("item_id,pair_id,language,subset,label,text\nx,a,p,en,all,1,A dog can bark.\n", encoding="utf-8")
    assert "bad.csv:2: 7 fields where the header has 6" in fails(capsys, "items", "show", csv)

    released = tmp_path / "comps_base.tsv"  # a released layout in TSV
    pd.DataFrame(comps_records()).to_csv(released, sep="\t", index=False)
    assert load_items(released)["text"].iloc[0] == "a dog can bark."


def test_json_lines_saved_as_json_and_pandas_column_json(tmp_path):
    rows = xcomps_records(DE)
    lines = write_jsonl(tmp_path / "comps_de.json", rows)  # hub exports: JSON Lines under a .json name
    assert len(load_items(lines)) == 6
    columns = tmp_path / "comps_zh.json"
    pd.DataFrame(xcomps_records(ZH)).to_json(columns)  # pandas' default: {field: {row: value}}
    assert load_items(columns)["text"].tolist() == ["狗会汪汪叫。", "猫会汪汪叫。", "猫会爬树。", "狗会爬树。"]


def test_list_fields_are_json_in_csv_and_read_back_as_lists(tmp_path):
    import numpy as np

    frame = pd.DataFrame({"pair_id": ["a", "b", "c"], "words": [np.array(["wug", "fep"]), ["dax"], None],
                          "note": ["[not json", "x", "y"], "counts": [(1, np.int64(2)), [], [3]]})
    path = write_table(frame, tmp_path / "t.csv")
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert raw["words"].tolist() == ['["wug", "fep"]', '["dax"]', ""]
    assert raw["counts"].tolist() == ["[1, 2]", "[]", "[3]"]
    back = read_table(path)
    assert back["words"].tolist()[:2] == [["wug", "fep"], ["dax"]] and pd.isna(back["words"].iloc[2])
    assert back["counts"].tolist() == [[1, 2], [], [3]] and back["note"].tolist() == ["[not json", "x", "y"]

    legacy = tmp_path / "legacy.csv"  # results written before: numpy's repr stays text, nothing misread
    legacy.write_text("pair_id,words\na,['wug' 'fep']\n", encoding="utf-8")
    assert read_table(legacy)["words"].tolist() == ["['wug' 'fep']"]

    items = load_items(write_jsonl(tmp_path / "comps_wugs.jsonl", comps_records(wugs=True)))
    write_table(items, tmp_path / "items.csv")
    assert load_items(tmp_path / "items.csv")["nonsense_words"].iloc[0] == ["wug", "fep"]
