"""`HostReads`: the operators that would make a GPU's host wait for the device, found on any device (tests of the
passes of every family, tests/test_families.py, and of the probe solvers' iterations, tests/test_probe_solvers.py),
and `batches_and_copies`, the copies to the host a pass makes per batch (tests/test_sae.py, tests/test_sae_train.py)."""

from __future__ import annotations

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostReads(TorchDispatchMode):
    """Records the operators that make a GPU's host wait for the device, with where babelprobe or transformers
    called them: a value turned into a Python number (`.item()`, `bool()`, `if tensor:`) and a result whose shape
    depends on values (boolean indexing, `nonzero`, `unique`, `masked_select`). On a CPU they are operators like any
    other, so a CPU run finds them. A copy from the device to the host that waits for it (`.cpu()`, `.tolist()`, a
    `copy_` into host memory; not one with `non_blocking`) is seen where a device holds the tensor: on a GPU
    (`BABELPROBE_TEST_DEVICE=cuda`), not in a CPU run, where it is no operator. The mode is the calling thread's: the
    thread that drives the device."""

    # under `torch.inference_mode` (every pass's) some composite operators reach the mode whole, not as the
    # operators they are made of: `item` (not `_local_scalar_dense`), `nonzero_numpy` (`nonzero(as_tuple=True)`),
    # `argwhere`, `allclose` and a one-argument `where`. `bincount` reads its maximum back on CUDA to size its result.
    READS = {"_local_scalar_dense", "item", "is_nonzero", "equal", "allclose", "nonzero", "nonzero_numpy", "argwhere",
             "masked_select", "_unique2", "unique_dim", "unique_consecutive", "bincount"}

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name, kwargs = func.overloadpacket.__name__, kwargs or {}
        boolean = name in ("index", "index_put_", "index_put") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ())
        copy = _copy_to_host(name, args, kwargs)
        unsized = (name == "repeat_interleave" and "output_size" not in kwargs and isinstance(args[0], torch.Tensor)
                   and len(args) < 3)
        condition_only = name == "where" and len(args) == 1 and not kwargs
        if name in self.READS or boolean or copy or unsized or condition_only:
            frame = next(f for f in reversed(traceback.extract_stack()[:-1]) if "/torch/" not in f.filename)
            what = f"{name} (boolean)" if boolean else f"{name} (to the host)" if copy else name
            self.seen.append((what, f"{frame.filename}:{frame.lineno}"))
        return func(*args, **kwargs)


def _copy_to_host(name: str, args, kwargs) -> bool:
    """Whether `_to_copy` or `copy_` copies a tensor held by a device into host memory, waiting for it."""
    if name == "_to_copy":
        source, target, queued = args[0], kwargs.get("device"), kwargs.get("non_blocking", False)
    elif name == "copy_":
        source, target = args[1], args[0].device
        queued = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    else:
        return False
    return (isinstance(source, torch.Tensor) and source.device.type != "cpu" and target is not None
            and torch.device(target).type == "cpu" and not queued)


def batches_and_copies(monkeypatch, module) -> tuple[list, list]:
    """(the batches `module.length_batches` cut, the shapes of every `Tensor.cpu` copy), filled as the test runs:
    how often a pass copies to the host, per batch."""
    batches, copies, cpu, cut = [], [], torch.Tensor.cpu, module.length_batches
    monkeypatch.setattr(module, "length_batches", lambda *a, **k: batches.extend(cut(*a, **k)) or batches)
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: copies.append(tuple(self.shape)) or cpu(self, *a, **k))
    return batches, copies
