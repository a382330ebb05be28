"""Item schema, file formats, native COMPS/XCOMPS loading and validation errors."""

import json

import pandas as pd
import pytest

from babelprobe.errors import BabelprobeError
from babelprobe.items import language_table, load_items, strongest_distractor, to_pairs, write_items


def records(n_pairs=3, language="de"):
    rows = []
    for p in range(n_pairs):
        for label in (1, 0):
            rows.append({"item_id": f"p{p}-{label}", "pair_id": f"p{p}", "language": language,
                         "subset": "random", "label": label, "text": f"Satz {p} {label}.", "extra": p})
    return rows


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_round_trip_every_format_keeps_unknown_fields(tmp_path, suffix):
    items = load_items(pd.DataFrame(records()))
    path = tmp_path / f"items{suffix}"
    write_items(items, path)
    back = load_items(path)
    assert back["item_id"].tolist() == items["item_id"].tolist()
    assert back["label"].tolist() == [1, 0] * 3
    assert back["extra"].astype(int).tolist() == items["extra"].tolist()


def test_missing_field_names_field_and_line(tmp_path):
    rows = records()
    del rows[3]["subset"]
    path = write_jsonl(tmp_path / "items.jsonl", rows)
    with pytest.raises(BabelprobeError, match=r"items.jsonl:4: missing field 'subset'"):
        load_items(path)


def test_missing_text_is_an_error_not_the_text_nan(tmp_path):
    rows = records()
    del rows[2]["text"]
    with pytest.raises(BabelprobeError, match=r"items.jsonl:3: missing field 'text'"):
        load_items(write_jsonl(tmp_path / "items.jsonl", rows))


def test_malformed_json_line_is_named(tmp_path):
    path = tmp_path / "items.jsonl"
    lines = [json.dumps(r) for r in records()]
    lines[2] = lines[2][:-3]
    path.write_text("\n".join(lines))
    with pytest.raises(BabelprobeError, match=r"items.jsonl:3: malformed JSON"):
        load_items(path)


def test_whitespace_text_duplicate_id_unknown_language(tmp_path):
    rows = records()
    rows[1]["text"] = "   "
    with pytest.raises(BabelprobeError, match="p0-0 has an empty or whitespace-only text"):
        load_items(write_jsonl(tmp_path / "a.jsonl", rows))
    rows = records()
    rows[2]["item_id"] = rows[0]["item_id"]
    with pytest.raises(BabelprobeError, match=r"duplicate item_id 'p0-1' at .*a.jsonl:1 and .*a.jsonl:3"):
        load_items(write_jsonl(tmp_path / "a.jsonl", rows))
    rows = records(language="xx")
    with pytest.raises(BabelprobeError, match="unknown language code 'xx'"):
        load_items(write_jsonl(tmp_path / "a.jsonl", rows))


def test_bad_label_empty_file_non_utf8_and_missing_path(tmp_path):
    rows = records()
    rows[0]["label"] = "yes"
    with pytest.raises(BabelprobeError, match="label 'yes'"):
        load_items(write_jsonl(tmp_path / "a.jsonl", rows))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(BabelprobeError, match="empty"):
        load_items(tmp_path / "empty.jsonl")
    (tmp_path / "latin.csv").write_bytes("item_id,text\n1,Stra\xdfe\n".encode("latin-1"))
    with pytest.raises(BabelprobeError, match="not UTF-8"):
        load_items(tmp_path / "latin.csv")
    with pytest.raises(BabelprobeError, match="neither a bundled set"):
        load_items(tmp_path / "nope.jsonl")


def test_native_comps_records_become_pairs_with_language_from_file_name(tmp_path):
    rows = [{"id": 7, "property": "can bark", "acceptable_concept": "dog", "unacceptable_concept": "cat",
             "prefix_acceptable": "Ein Hund", "prefix_unacceptable": "Eine Katze",
             "property_phrase": "kann bellen.", "negative_sample_type": "taxonomic"}]
    items = load_items(write_jsonl(tmp_path / "comps_de.jsonl", rows))
    assert items["text"].tolist() == ["Ein Hund kann bellen.", "Eine Katze kann bellen."]
    assert set(items["language"]) == {"de"} and set(items["subset"]) == {"taxonomic"}
    assert items["prefix"].tolist() == ["Ein Hund", "Eine Katze"]
    assert items["continuation"].tolist() == ["kann bellen."] * 2
    pair = to_pairs(items).iloc[0]
    assert (pair["text_good"], pair["text_bad"]) == ("Ein Hund kann bellen.", "Eine Katze kann bellen.")
    assert pair["acceptable_concept"] == "dog"


def test_native_chinese_joins_without_space_and_full_sentence_variant(tmp_path):
    rows = [{"prefix_acceptable": "狗", "prefix_unacceptable": "猫", "property_phrase": "会汪汪叫。",
             "negative_sample_type": "random"}]
    items = load_items(write_jsonl(tmp_path / "comps_zh.jsonl", rows))
    assert items["text"].tolist() == ["狗会汪汪叫。", "猫会汪汪叫。"]
    full = [{"acceptable_sent": "A dog can bark.", "unacceptable_sent": "A cat can bark.", "language": "en"}]
    items = load_items(write_jsonl(tmp_path / "xcomps.jsonl", full))
    assert items.sort_values("label")["text"].tolist() == ["A cat can bark.", "A dog can bark."]


def test_native_comps_without_language_is_an_error(tmp_path):
    rows = [{"prefix_acceptable": "A dog", "prefix_unacceptable": "A cat", "property_phrase": "can bark."}]
    with pytest.raises(BabelprobeError, match="cannot tell the language"):
        load_items(write_jsonl(tmp_path / "pairs.jsonl", rows))


def test_to_pairs_needs_one_good_and_one_bad():
    rows = records()
    rows[1]["label"] = 1
    with pytest.raises(BabelprobeError, match="pair 'p0' needs exactly one item with label 1"):
        to_pairs(load_items(pd.DataFrame(rows)))


def test_a_question_with_several_distractors_pairs_its_gold_with_the_strongest():
    rows = [{"item_id": f"q{i}", "pair_id": "q", "language": "en", "subset": "mc", "label": int(i == 1),
             "text": f"option {i}"} for i in range(4)]
    items = load_items(pd.DataFrame(rows))
    with pytest.raises(BabelprobeError, match="has 1 and 3.*multiple-choice question"):
        to_pairs(items)
    scores = pd.Series({"q0": -2.0, "q1": -1.0, "q2": -0.5, "q3": -0.5})  # a tie: the first one counts
    pair = to_pairs(items, strongest_distractor(items, scores)).iloc[0]
    assert (pair["item_id_good"], pair["item_id_bad"], pair["n_options"]) == ("q1", "q2", 4)
    assert strongest_distractor(items)["q"] == "q0"  # without scores: the first distractor
    minimal = load_items(pd.DataFrame(records()))
    assert to_pairs(minimal, strongest_distractor(minimal)).equals(to_pairs(minimal))  # a pair's only one


def test_selection_and_limit():
    rows = records(4, "de") + [dict(r, item_id="fr" + r["item_id"], pair_id="fr" + r["pair_id"], language="fr")
                               for r in records(4)]
    items = load_items(pd.DataFrame(rows), languages=["fr"], limit=2)
    assert items["pair_id"].unique().tolist() == ["frp0", "frp1"]
    with pytest.raises(BabelprobeError, match="language es not in the items"):
        load_items(pd.DataFrame(rows), languages=["es"])


def test_bundled_xcomps_sample_is_complete_and_parallel():
    items = load_items("xcomps-sample")
    table = language_table()
    languages = set(items["language"])
    assert len(languages) >= 9 and "en" in languages
    typology = table.loc[sorted(languages), "typology"]
    assert {"analytic", "inflectional", "agglutinative"} <= set(typology)
    assert (typology[typology.index != "en"] == "inflectional").sum() >= 3
    assert (typology == "agglutinative").sum() >= 2
    assert set(items["subset"]) == {"taxonomic", "overlap", "co-occurrence", "random"}
    stems = items.groupby("language")["stem"].apply(frozenset)
    assert stems.nunique() == 1 and len(stems.iloc[0]) >= 60 * 4  # same properties × subsets everywhere
    pairs = to_pairs(items)
    assert (pairs["text_good"] != pairs["text_bad"]).all()
    for row in items.sample(50, random_state=0).itertuples():  # text = prefix + separator + continuation
        assert row.text == row.prefix + table.at[row.language, "separator"] + row.continuation


def test_language_table_has_xcomps_languages_and_english():
    table = language_table()
    xcomps = set(table.index[table["in_xcomps"] == "yes"])
    assert xcomps == {"ar", "ca", "de", "el", "es", "fa", "fr", "he", "hu", "ja", "ko", "nl", "ru", "tr", "uk",
                      "vi", "zh"}
    assert "en" in table.index and set(table["typology"]) == {"analytic", "inflectional", "agglutinative"}


def test_result_files_get_ordinary_permissions(tmp_path):
    import os
    import stat

    from babelprobe.tables import write_table

    old = os.umask(0o022)
    try:
        path = write_table(pd.DataFrame({"a": [1]}), tmp_path / "t.csv")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_items_list_shows_every_bundled_set_of_every_benchmark(capsys):
    from babelprobe.bundled import BUNDLED
    from babelprobe.cli import main

    assert main(["items", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = {line.split()[0]: line for line in lines[1:]}
    assert set(listed) == set(BUNDLED)
    for name, bundled in BUNDLED.items():
        used_by = {"xcomps": "score/extract/compare", "corpus": "--corpus",
                   "patching": "patch --protocol translation --concepts"}.get(bundled.benchmark,
                                                                           f"bench {bundled.benchmark}")
        assert used_by in listed[name]
    assert {bundled.benchmark for bundled in BUNDLED.values()} >= {
        "xcomps", "stingray", "eclektic", "consistency", "pitfalls"}
