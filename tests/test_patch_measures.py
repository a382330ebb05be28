"""The minimal-pair patching summary (`analysis.patching.pairs_summary`) on hand-made rows: only pairs the
model decides correctly by the gap, the median and its interval beside the mean, the gain in nats, and an
empty control said in one line and kept out of the figure's legend."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from babelprobe.analysis.patching import empty_controls, pairs_summary, plot_recovery


def rows_of(pairs, controls=("source", "target", "other")) -> pd.DataFrame:
    """pairs: (pair_id, language, s_good, s_bad, {control: s_patched}) at one layer."""
    out = []
    for pair_id, language, good, bad, patched in pairs:
        for control in controls:
            value = patched.get(control, np.nan)
            out.append({"pair_id": pair_id, "language": language, "source": "en" if control != "target" else language,
                        "layer": 3, "control": control, "s_good": good, "s_bad": bad, "s_patched": value,
                        "recovery": (value - bad) / (good - bad)})
    return pd.DataFrame(out)


def test_pairs_the_model_gets_wrong_are_left_out_and_the_median_and_gain_are_reported():
    rows = rows_of([
        ("p1", "de", -10.0, -12.0, {"source": -11.0, "target": -10.0}),   # correct by 2: recovery 0.5
        ("p2", "de", -10.0, -13.0, {"source": -10.0, "target": -10.0}),   # correct by 3: recovery 1.0
        ("p3", "de", -9.0, -9.2, {"source": -8.0, "target": -9.0}),       # correct by 0.2 < gap: left out
        ("p4", "de", -12.0, -10.0, {"source": -22.0, "target": -12.0}),   # wrong by 2: recovery +6, left out
    ], controls=("source", "target"))
    summary = pairs_summary(rows, min_gap=0.5, n_boot=200, seed=0)
    cell = summary[(summary["control"] == "source") & (summary["language"] == "de")].iloc[0]
    assert cell["n"] == 2 and cell["n_left_out"] == 2
    assert cell["mean"] == pytest.approx(0.75) and cell["median"] == pytest.approx(0.75)
    assert cell["gain_mean"] == pytest.approx((1.0 + 3.0) / 2) and cell["gain_median"] == pytest.approx(2.0)
    assert 0.5 <= cell["median_low"] <= cell["median"] <= cell["median_high"] <= 1.0
    # an absolute gap would have kept p4, whose patch made the sentence 10 nats less likely, as recovery +6
    assert summary["mean"].max() <= 1.0


def test_an_empty_control_is_one_line_and_not_in_the_legend():
    rows = rows_of([("p1", "de", -10.0, -12.0, {"source": -11.0, "target": -10.0})])  # no other concept: NaN
    summary = pairs_summary(rows, min_gap=0.5, n_boot=50, seed=0)
    assert not (summary["control"] == "other").any()
    notes = empty_controls(rows, summary)
    assert len(notes) == 1 and "'other'" in notes[0] and "\n" not in notes[0]
    fig = plot_recovery(summary)
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert labels and not any("another concept" in label for label in labels)


def test_the_paper_preset_runs_the_papers_configurations_with_the_english_set(tiny_long, tmp_path):
    import babelprobe as bp
    from babelprobe.patching.settings import TranslationSettings

    result = bp.patch_translation(tiny_long, out=tmp_path / "p", preset="paper", n_pairs=2, shots=1, layers="2-3",
                                  n_boot=20, figures=False, progress=False)
    rows = result.rows
    assert set(rows["config"]) == {"de-it → fr-zh", "de-it,nl-fi,zh-es,es-ru,ru-ko → fr-zh",
                                   "de-hi,nl-hi,zh-hi,es-hi,ru-hi → fr-et"}
    # exp2 measures the English set (both concepts' English words) and keeps it disjoint from the others
    assert rows.loc[rows["exp"] == "exp2", "p_latent"].notna().all()
    pairs = result.pairs[result.pairs["exp"] == "exp2"]
    for row in pairs.itertuples():
        sets = [set(str(getattr(row, f"tokens_{m}")).split()) for m in ("src_concept_tgt_lang", "tgt_concept_tgt_lang",
                                                                         "latent")]
        assert all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1:])
    with pytest.raises(bp.BabelprobeError, match="--source does not go with --preset paper"):
        TranslationSettings(preset="paper", source="de-it")
