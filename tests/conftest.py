"""Shared fixtures: tiny random models for unit tests, the real default model for `slow` tests."""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning: tests start subprocesses (kill, distributed, CLI), and
# spinning threads of one process then steal the 2 cores from the others.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from tests.tiny import tiny_lm

# At most 2 torch threads; under pytest-xdist (`make test` runs a worker per core) each worker its share of them
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads()) // _WORKERS))


def pytest_collection_modifyitems(config, items):
    """Mark the numeric tests declared in tests/numeric.py."""
    from tests.numeric import is_numeric

    for item in items:
        if is_numeric(item.path.name, item.originalname or item.name):
            item.add_marker(pytest.mark.numeric)


def pytest_report_header(config):
    """Which kernels ran the numbers (tests/numeric.py: `make test` reruns `-m numeric` under the others)."""
    return f"torch {torch.__version__}, CPU kernels: {torch.backends.cpu.get_cpu_capability()}, " \
           f"{torch.get_num_threads()} threads"


@pytest.fixture(scope="session")
def tiny():
    """A tiny random Llama-style model with a BPE tokenizer that puts BOS first."""
    return tiny_lm("llama")


@pytest.fixture(scope="session")
def default_lm():
    """The real Gemma-3-270M (converted once into the cache); tests using it are marked slow."""
    from babelprobe.models import load_model

    return load_model("default", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def tiny_long():
    """The tiny model with room for long prompts (byte-level tokenised Chinese/Japanese, MC questions)."""
    return tiny_lm("llama", max_positions=512)


@pytest.fixture(scope="session")
def tiny_long_dir(tmp_path_factory, tiny_long):
    path = tmp_path_factory.mktemp("tiny-long")
    tiny_long.model.save_pretrained(path)
    tiny_long.tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def one_thread():
    """For tests of tiny problems, where threads only add overhead (and stall on a busy machine):
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tiny):
    """The `tiny` model saved as a local model directory, for CLI tests (`--model DIR`)."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny.model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return path
