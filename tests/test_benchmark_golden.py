"""Every bundled benchmark sample end to end against golden files (tests/data/golden/<case>/): the tables
a run writes, items.csv and summary.csv, were frozen from the code as it was before the seed benchmarks
were split into modules (the commit "golden files of the bundled benchmark samples before the split"), so
a change of layout that moves any number fails here. Numbers (also inside JSON score lists) are compared
within float32 rounding of the model's forward pass (`tests/numeric.py`: `model_rtol` of the model, relative
to the column's largest value, plus one unit of the last digit the golden file shows), so another CPU's
kernels pass while a moved number fails; the model's `fingerprint` must be the one of the model run (a
hash of its weights, which a tiny random model draws differently under another kernel family); everything
else exactly; the columns of items.csv in their order, those of summary.csv by name (the shared
`metric_row` puts them in the contract's order, which the split changed for three benchmarks).

Regenerate only when a number is meant to change, in a commit that says why:
    BABELPROBE_WRITE_GOLDEN=1 pytest tests/test_benchmark_golden.py [-m slow]
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import babelprobe as bp
from babelprobe.benchmarks.base import benchmark_settings
from tests.numeric import assert_float32_close, model_rtol, written_quantum

GOLDEN = Path(__file__).parent / "data" / "golden"
TABLES = ("items.csv", "summary.csv")
WRITE = os.environ.get("BABELPROBE_WRITE_GOLDEN") == "1"

# case: (benchmark, bundled sample, settings, languages, limit). Deterministic settings only: likelihood
# answers or greedy generation; short generations keep the CPU time small.
TINY = {
    "stingray-tiny": ("stingray", "stingray-sample", {}, None, None),
    "stingray-generation-tiny": ("stingray", "stingray-sample", {"answer": "generate", "max_new_tokens": 3},
                                 None, 2),
    "eclektic-tiny": ("eclektic", "eclektic-sample", {"generator": "local", "max_new_tokens": 6}, None, None),
    "consistency-tiny": ("consistency", "consistency-sample", {"max_new_tokens": 8}, ["de", "zh"], 3),
    "pitfalls-tiny": ("pitfalls", "pitfalls-sample", {}, None, None),
}
DEFAULT = {
    "stingray-default": ("stingray", "stingray-sample", {}, None, 2),
    "eclektic-default": ("eclektic", "eclektic-sample", {"generator": "local", "max_new_tokens": 8}, ["en", "de"], 1),
    "consistency-default": ("consistency", "consistency-sample", {"max_new_tokens": 16, "baseline": "none"},
                            ["de"], 2),
    "pitfalls-default": ("pitfalls", "pitfalls-sample", {}, None, 1),
}


def settings_of(name: str, values: dict):
    return benchmark_settings(name, **values)


def run_case(case: tuple, lm, out: Path) -> Path:
    name, source, values, languages, limit = case
    bp.run_benchmark(name, lm, source, out, settings_of(name, values), languages=languages, limit=limit,
                     progress=False, figures=False)
    return out


def check_case(case_name: str, out: Path, lm) -> None:
    folder = GOLDEN / case_name
    if WRITE:
        folder.mkdir(parents=True, exist_ok=True)
        for table in TABLES:
            shutil.copyfile(out / table, folder / table)
        return
    for table in TABLES:
        new, golden = pd.read_csv(out / table), pd.read_csv(folder / table)
        if "fingerprint" in golden.columns:
            assert set(new["fingerprint"].dropna()) <= {lm.fingerprint}, f"{case_name}/{table}: fingerprint"
            new, golden = new.drop(columns="fingerprint"), golden.drop(columns="fingerprint")
        literals = pd.read_csv(folder / table, dtype=str, keep_default_na=False)
        assert_same_table(new, golden, literals, model_rtol(lm), f"{case_name}/{table}", ordered=table == "items.csv")


def assert_same_table(new: pd.DataFrame, golden: pd.DataFrame, literals: pd.DataFrame, rtol: float, where: str,
                      ordered: bool = True) -> None:
    """`new` equals `golden`: numbers within `rtol` of the column's largest value plus the golden file's last
    written digit (`literals`: the golden table as strings), the rest exactly."""
    if ordered:
        assert list(new.columns) == list(golden.columns), where
    assert sorted(new.columns) == sorted(golden.columns), where
    assert len(new) == len(golden), where
    for column in golden.columns:
        a, b = new[column], golden[column]
        what = f"{where}: column {column!r}"
        if pd.api.types.is_numeric_dtype(b) and not pd.api.types.is_bool_dtype(b):
            assert pd.api.types.is_numeric_dtype(a), what
            assert_float32_close(a.to_numpy(float), b.to_numpy(float), rtol,
                                 quantum=written_quantum(literals[column]), err_msg=what)
        elif numbers_in_json(b) is not None:
            left, right = numbers_in_json(a), numbers_in_json(b)
            assert left is not None and [len(x) for x in left] == [len(x) for x in right], what
            written = [m for text in literals[column] for m in NUMBER.findall(text)]
            assert_float32_close(np.concatenate(left or [[]]), np.concatenate(right or [[]]), rtol,
                                 quantum=written_quantum(written), err_msg=what)
        else:
            assert a.fillna("<NA>").astype(str).tolist() == b.fillna("<NA>").astype(str).tolist(), what


NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def numbers_in_json(column: pd.Series) -> list[list[float]] | None:
    """The numbers of a column of JSON lists or objects of numbers (label scores), else None."""
    values = column.dropna()
    if values.empty or not values.map(lambda v: isinstance(v, str) and v[:1] in "[{").all():
        return None
    out = []
    for text in column.fillna("[]"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None
        numbers = list(value.values()) if isinstance(value, dict) else value
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers):
            return None
        out.append([float(x) for x in numbers])
    return out


@pytest.mark.parametrize("case_name", list(TINY))
def test_bundled_sample_on_a_tiny_model_matches_its_golden_tables(case_name, tiny_long, tmp_path):
    check_case(case_name, run_case(TINY[case_name], tiny_long, tmp_path / case_name), tiny_long)


@pytest.mark.slow
@pytest.mark.parametrize("case_name", list(DEFAULT))
def test_bundled_sample_on_the_default_model_matches_its_golden_tables(case_name, default_lm, tmp_path):
    check_case(case_name, run_case(DEFAULT[case_name], default_lm, tmp_path / case_name), default_lm)
