"""`babelprobe bench pitfalls-affinity` (Cross-Lingual Pitfalls §3.3, Fig. 7): a hand 3 × 3 case through the
whole pipeline (found pairs -> expanded into the other languages -> answered the released way -> A[x, y]
-> D[x, y] -> heat map), D checked against the formula written out here; and its bad inputs."""

from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest

from babelprobe.benchmarks import pitfalls as pf
from babelprobe.benchmarks.base import Models
from babelprobe.cli import main
from tests.test_pitfalls_search import _between_markers

NAMES = {"zh": "Chinese", "ja": "Japanese", "fr": "French"}
# A[x, y] by hand: accuracy on language x (rows) of the pairs from seed language y (columns), in tenths
RIGHT = {"zh": {"zh": 2, "ja": 3, "fr": 7}, "ja": {"zh": 4, "ja": 1, "fr": 8}, "fr": {"zh": 9, "ja": 6, "fr": 3}}
N = 10


def _record(y: str, i: int) -> dict:
    return {"oriquestion": f"Question {y} {i}?", "question": f"Question {y} {i}?", "choices": ["right", "wrong"],
            "answer": "right", "transori": f"Q-{y}-{i}", "transquestion": f"Q-{y}-{i}", "transchoices": ["r", "w"],
            "transanswer": "r", "category": "c", "source": "hand", "prequestion": "", "sufquestion": "",
            "transpre": "", "transsuf": "", "value": 1.0, "rate_ori": 1.0, "rate_trans": 0.0}


class Scripted:
    """Translator, answerer and extractor at once. Translating (the release's template of language x):
    the JSON reply with the text and choices kept. Answering (the release's simulation prompt in x):
    right on question i of seed language y when i < RIGHT[x][y]. Extracting: the choice it named."""

    name = "scripted"

    def __init__(self):
        release = pf.load_release()
        self.languages = {release.at[("simulate", x), "template"].split("\n")[0]: x for x in NAMES}

    def generate(self, prompts, max_new_tokens=64, stop=None, temperature=0.0, seed=0):
        out = []
        for p in prompts:
            fields = _between_markers(p)
            if "[The Start of the Model's Answer]" in p:
                out.append('{"final_answer": "' + re.search(r"It is (.*)\n", p).group(1) + '"}')
            elif p.split("\n")[0] in self.languages:
                x = self.languages[p.split("\n")[0]]
                y, i = re.search(r"Q-(\w\w)-(\d+)", p).groups()
                choices = eval(p.rstrip("\n").rsplit("\n", 1)[1])  # noqa: S307 (a printed Python list)
                out.append(f"It is {choices[0] if int(i) < RIGHT[x][y] else choices[1]}\n")
            elif len(fields) == 1:  # plain translation of added context: kept as it is
                out.append(fields[0])
            else:
                text, choices, answer = fields[0], eval(fields[1]), fields[2]  # noqa: S307
                out.append(json.dumps({"text": text, "choices": choices, "answer": answer}))
        return out


@pytest.fixture
def found(tmp_path):
    data = tmp_path / "found"
    data.mkdir()
    for y, name in NAMES.items():
        (data / f"{name}.json").write_text(json.dumps([_record(y, i) for i in range(N)]), encoding="utf-8")
    return data


def test_hand_3x3_case_through_the_pipeline(found, tmp_path, tiny_long_dir, monkeypatch, capsys):
    scripted = Scripted()
    monkeypatch.setattr(Models, "generator", lambda self, spec: scripted)
    out = tmp_path / "aff"
    # --protocol paper extracts with an LLM: without --extractor, one line, exit 2, nothing written
    argv = ["bench", "pitfalls-affinity", "--model", str(tiny_long_dir), "--items", str(found), "--protocol",
            "paper", "--out", str(out), "--no-progress"]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert "--extractor" in error and len(error.splitlines()) == 1 and not out.exists()
    assert main([*argv, "--extractor", "self"]) == 0
    assert "D[x, y]" in capsys.readouterr().out
    pairs = pd.read_csv(out / "pairs.csv")
    assert len(pairs) == 3 * 3 * N and pd.read_csv(out / "pairs-dropped.csv").empty  # each into all three
    accuracy = pd.read_csv(out / "accuracy.csv").set_index("language")
    for x in NAMES:
        for y in NAMES:
            assert accuracy.at[x, y] == pytest.approx(RIGHT[x][y] / N)
    mean = {x: sum(RIGHT[x].values()) / (3 * N) for x in NAMES}  # Ā_x
    d = pd.read_csv(out / "affinity.csv").set_index("language")
    for x in NAMES:
        for y in NAMES:  # §3.3 with c = −1 (App. B.1)
            expected = (RIGHT[x][y] / N - mean[x]) / mean[x] * math.exp(-abs(mean[y] - mean[x]))
            assert d.at[x, y] == pytest.approx(expected)
    assert (out / "pitfalls_fig7.png").stat().st_size > 0 and (out / "pitfalls_fig7.pdf").exists()
    rows = pd.read_csv(out / "items.csv")
    assert set(rows["method"]) == {"simulate-extract"} and set(rows["version"]) == {"perturbed"}
    report = tmp_path / "report"
    assert main(["report", "--results", str(out), "--out", str(report)]) == 0
    assert (report / "pitfalls_fig7.png").exists() and (report / "report.md").exists()


def test_run_affinity_canonical_and_old_form_are_one_run(found, tmp_path, tiny_long_dir, monkeypatch):
    """`run_affinity(items, out, settings, runtime)` and the older `run_affinity(model, source, out, ...,
    protocol=...)`: the same answers and matrices (the scripted answerer of the test above)."""
    from babelprobe.analysis.benchmarks import run_affinity
    from babelprobe.benchmarks.pitfalls.settings import AffinitySettings
    from babelprobe.runtime import Runtime
    from babelprobe.settings import settings_for

    scripted = Scripted()
    monkeypatch.setattr(Models, "generator", lambda self, spec: scripted)
    old = run_affinity(str(tiny_long_dir), found, tmp_path / "old", protocol="paper", extractor="self", progress=False)
    new = run_affinity(found, tmp_path / "new", settings_for(AffinitySettings, "paper", extractor="self"),
                       Runtime(model=str(tiny_long_dir), progress=False, figures=False))
    assert new.accuracy.equals(old.accuracy) and new.affinity.equals(old.affinity)
    assert old.figures and not new.figures  # figures: a runtime option


def test_expanding_the_bundled_sample_keeps_every_language():
    """The loader's report rides along in `attrs`; expanding several seed languages must not trip on it."""
    from babelprobe.benchmarks.pitfalls.search import expand_pairs

    questions = pf.load_pitfalls("pitfalls-sample", limit=1)
    assert "load_report" in questions.attrs
    names = list(dict.fromkeys(questions["language_name"]))
    pairs, dropped = expand_pairs(questions, names, Scripted())
    assert dropped.empty and len(pairs) == len(names) ** 2
    assert sorted(set(zip(pairs["seed_language"], pairs["language"]))) == sorted(
        (pf_code(y), pf_code(x)) for y in names for x in names)

    class Unusable:  # every translation fails: only the seed languages' own pairs are left to concatenate
        name = "unusable"

        def generate(self, prompts, **kw):
            return ["no JSON here"] * len(prompts)

    pairs, dropped = expand_pairs(questions, names, Unusable())
    assert len(pairs) == len(names) and len(dropped) == len(names) * (len(names) - 1)


def pf_code(name: str) -> str:
    from babelprobe.languages import language_code

    return language_code(name)


def test_no_usable_translation_says_why(found, tmp_path, tiny_long_dir, monkeypatch, capsys):
    """A translator that never replies in the release's JSON leaves A and D on their diagonals: the run
    finishes, counts the unusable translations and says what to change."""

    class Unusable:
        name = "unusable"

        def generate(self, prompts, **kw):
            return ["no JSON here"] * len(prompts)

    monkeypatch.setattr(Models, "generator", lambda self, spec: Unusable())
    out = tmp_path / "aff"
    assert main(["bench", "pitfalls-affinity", "--model", str(tiny_long_dir), "--items", str(found), "--limit", "2",
                 "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "6 pairs (0 expanded, 12 translations unusable: pairs-dropped.csv)" in captured.out  # 3 seed langs × 2 × 2
    assert "no pair could be expanded" in captured.err and "--translator" in captured.err
    assert len(pd.read_csv(out / "pairs-dropped.csv")) == 12
