"""`HostReads`: the operators that would make a GPU's host wait for the device, found on any device (tests of the
passes of every family, tests/test_families.py, and of the probe solvers' iterations, tests/test_probe_solvers.py)."""

from __future__ import annotations

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostReads(TorchDispatchMode):
    """Records the operators that make a GPU's host wait for the device, with where babelprobe or transformers
    called them: a value turned into a Python number (`.item()`, `bool()`, `if tensor:`) and a result whose shape
    depends on values (boolean indexing, `nonzero`, `unique`, `masked_select`). On a CPU they are operators like any
    other, so a CPU run finds them; a copy to the host (`.cpu()`, `.numpy()`) is no operator there, and is not seen.
    The mode is the calling thread's: the thread that drives the device."""

    READS = {"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "_unique2", "unique_dim",
             "unique_consecutive"}

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        boolean = name in ("index", "index_put_", "index_put") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ())
        if name in self.READS or boolean or (name == "repeat_interleave" and "output_size" not in (kwargs or {})
                                             and isinstance(args[0], torch.Tensor) and len(args) < 3):
            frame = next(f for f in reversed(traceback.extract_stack()[:-1]) if "/torch/" not in f.filename)
            self.seen.append((f"{name} (boolean)" if boolean else name, f"{frame.filename}:{frame.lineno}"))
        return func(*args, **(kwargs or {}))
