"""The research notebooks: committed without outputs, and each runs top to bottom on the default model
(slow: each loads Gemma-3-270M and runs the real pipeline on a small slice).

The kernel is this interpreter (the project's .venv after `make setup`): a kernelspec named python3
pointing at sys.executable is put first on JUPYTER_PATH, so a user-wide python3 kernel cannot stand in.
"""

import json
import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_layer_sweep.ipynb",
                                           "03_compare_methods.ipynb", "04_language_neurons.ipynb", "05_patching.ipynb",
                                           "06_sae_features.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code, "a notebook without code"
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None, \
            f"{path.name}: clear its outputs before committing"
    assert nb.metadata.kernelspec.name == "python3"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")


@pytest.fixture
def venv_kernel(tmp_path, monkeypatch):
    """A kernelspec 'python3' that runs this interpreter, first on the kernel search path; temporary
    files of the notebook (its OUT directory) go under tmp_path."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "babelprobe .venv", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("TQDM_DISABLE", "1")
    return "python3"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, venv_kernel, tmp_path):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name=venv_kernel, timeout=600,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    outputs = [o for cell in code for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [sum("image/png" in o.get("data", {}) for o in cell.outputs) for cell in code]
    assert max(images) <= 1, "a figure is shown twice (returned and auto-displayed)"
    assert sum(images) >= (0 if path.stem == "01_quickstart" else 2)
    # it wrote only into its temporary directory, never beside the notebook
    assert sorted(p.name for p in path.parent.iterdir()) == [p.name for p in NOTEBOOKS]
