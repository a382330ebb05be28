"""`babelprobe report`: every figure as PDF + PNG and report.md from a compare directory, the probe-only
case (figures without inputs skipped with a note), and one-line errors for directories that are not
results."""

import shutil

import pandas as pd
import pytest
from PIL import Image

from babelprobe.analysis.report import FIGURES, draw, load_results, write_report
from babelprobe.cli import main
from babelprobe.errors import BabelprobeError
from tests.test_figures import make_results

TWO_MODEL = {"xcomps_fig9", "xcomps_fig13"}  # need a second compare directory (--other)


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    return make_results(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def report_dir(results_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    assert main(["report", "--results", str(results_dir), "--out", str(out), "--n-boot", "100"]) == 0
    return out


def test_every_figure_is_written_as_pdf_and_300_dpi_png(report_dir):
    for name in set(FIGURES) - TWO_MODEL:
        pdf, png = report_dir / f"{name}.pdf", report_dir / f"{name}.png"
        assert pdf.read_bytes()[:4] == b"%PDF", name
        with Image.open(png) as image:
            assert image.info["dpi"][0] == pytest.approx(300, abs=1), name
    assert not list(report_dir.glob(".*.tmp"))  # nothing half-written left behind


def test_report_md_has_the_tables_with_the_numbers_of_the_results(report_dir, results_dir):
    text = (report_dir / "report.md").read_text(encoding="utf-8")
    for heading in ("## Methods per language", "## Peak layers", "## Correlations between methods",
                    "## XCOMPS as published", "## Cross-lingual transfer", "## Figures"):
        assert heading in text
    for name in set(FIGURES) - TWO_MODEL:
        assert f"]({name}.png)" in text
    items = pd.read_csv(results_dir / "items.csv")
    de = items[items["language"] == "de"]
    row = next(line for line in text.splitlines() if line.startswith("| de "))
    assert f"{de['direct_correct'].mean():.2f} [" in row.split("|")[2]  # direct accuracy of de, second column
    peaks = pd.read_csv(report_dir / "language_peaks.csv")
    table = pd.read_csv(results_dir / "neuro.csv")
    mean_curve = table[table["language"] == "ja"].groupby("layer")["f1_mean"].mean()
    assert peaks.set_index("language").loc["ja", "peak_layer"] == mean_curve.idxmax()
    skipped = text.split("Skipped:")[1]
    assert {line.split(":")[0].strip("- ") for line in skipped.strip().splitlines()} == TWO_MODEL
    assert "--other" in skipped


def test_a_probe_only_directory_skips_the_method_figures_with_a_note(results_dir, tmp_path):
    probe_dir = tmp_path / "sweep"
    probe_dir.mkdir()
    for path in (results_dir / "transfer").glob("neuro.*"):
        shutil.copy(path, probe_dir / path.name)
    report = write_report(probe_dir, probe_dir / "figures", n_boot=50)
    assert set(report.skipped) == {"method_bars", "method_correlations", "xcomps_fig2", "xcomps_fig4",
                                   "xcomps_fig10_12"} | TWO_MODEL
    assert set(report.figures) == set(FIGURES) - set(report.skipped)
    text = (probe_dir / "figures" / "report.md").read_text(encoding="utf-8")
    assert "- method_bars: no items.csv" in text and "## Methods per language" not in text


def test_the_transfer_table_is_optional(results_dir, tmp_path):
    plain = tmp_path / "plain"
    shutil.copytree(results_dir, plain, ignore=shutil.ignore_patterns("acts", "transfer"))
    results = load_results(plain)
    assert results.transfer is None
    assert "--transfer" in draw("transfer", results, {})
    given = load_results(plain, transfer=results_dir / "transfer" / "neuro.transfer.csv")
    assert given.transfer_peaks is not None  # its own sweep's peaks, from beside it
    assert draw("transfer", given, {}).axes[0].get_images()


def run_cli(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.err


def test_not_a_results_directory_is_a_one_line_error(tmp_path, capsys):
    code, err = run_cli(["report", "--results", str(tmp_path / "nope"), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "no such directory" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "empty").mkdir()
    code, err = run_cli(["report", "--results", str(tmp_path / "empty"), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "is not a results directory" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_a_table_without_a_needed_column_names_file_and_column(results_dir, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(results_dir, broken, ignore=shutil.ignore_patterns("acts"))
    summary = pd.read_csv(broken / "summary.csv").drop(columns="value")
    summary.to_csv(broken / "summary.csv", index=False)
    code, err = run_cli(["report", "--results", str(broken), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "summary.csv has no column 'value'" in err
    assert not (tmp_path / "o" / "report.md").exists()


def test_a_probe_table_without_its_side_tables_is_an_error(results_dir, tmp_path):
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    shutil.copy(results_dir / "neuro.csv", lonely / "neuro.csv")
    with pytest.raises(BabelprobeError, match="side table neuro.folds.csv is not"):
        load_results(lonely)


def test_two_transfer_tables_must_be_chosen_between(results_dir, tmp_path):
    two = tmp_path / "two"
    shutil.copytree(results_dir, two, ignore=shutil.ignore_patterns("acts"))
    shutil.copytree(two / "transfer", two / "transfer-again")
    with pytest.raises(BabelprobeError, match="several transfer tables"):
        load_results(two)
    assert load_results(two, transfer=two / "transfer" / "neuro.transfer.csv").transfer is not None
