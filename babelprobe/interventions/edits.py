"""Edits of the residual stream inside the forward pass: the mechanics of `babelprobe intervene`.

An edit maps hidden states [..., d] to edited ones (computed in float32, cast back to the model's dtype):

    Steer(v)                   h + v                        steering: v = α·σ·ŵ
    Project(u, value, alpha)   h − α·(h·u − value)·u        α = 1 sets the component along the unit vector u to
                                                            `value` (0: u projected out); α = 0 leaves h as it
                                                            is; α = 2 reflects the component about `value`
    Erase(eraser, alpha)       h − α·(h − eraser(h))        LEACE (`concept_erasure.LeaceEraser`); α = 1 is the
                                                            eraser itself
    Patch(rows, cols, values)  h[rows, cols] = values       activation patching: given states written at given
                                                            positions of the batch (`babelprobe patch`)

`Intervention(lm, {layer: edit})` writes the edits at the residual sites (`babelprobe.sites.Hooks`, the
mechanism the hf extraction backend reads states with, docs/design.md "Layers (numbering)"): layer 0
edits the hidden states entering block 1, layer i the output of block i. While it is open, every forward pass of the
model sees the edited states: the direct and meta scorers, and the extraction hooks registered after it
(which therefore read the edited state at the edited layer). The hooks are removed on exit.

Positions: every token of every row (default, padding included: it is masked anyway), or only the
states named by `intervention.where = (rows, cols)`, set by the caller before each batch (each text's
last token, for the probe readout).
"""

from __future__ import annotations

import numpy as np
import torch

from babelprobe.errors import BabelprobeError
from babelprobe.models import LoadedModel
from babelprobe.sites import Hooks, residual


class Edit:
    """Base: keeps its tensors in float32 and copies them once to each device a layer runs on."""

    def __init__(self, **tensors):
        self.tensors = {name: torch.as_tensor(np.asarray(value, dtype=np.float32)) for name, value in tensors.items()}
        self._placed: dict = {}

    def on(self, name: str, device: torch.device) -> torch.Tensor:
        key = (name, str(device))
        if key not in self._placed:
            self._placed[key] = self.tensors[name].to(device)
        return self._placed[key]

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Steer(Edit):
    """h + vector."""

    def __init__(self, vector):
        super().__init__(vector=vector)

    def __call__(self, h):
        return h + self.on("vector", h.device)


class Project(Edit):
    """h − alpha·(h·u − value)·u for a unit vector u: the component along u moved to `value`."""

    def __init__(self, unit, value: float = 0.0, alpha: float = 1.0):
        unit = np.asarray(unit, dtype=np.float64)
        norm = np.linalg.norm(unit)
        if not np.isfinite(norm) or norm == 0:
            raise BabelprobeError("cannot project along a zero or non-finite direction")
        super().__init__(unit=unit / norm)
        self.value, self.alpha = float(value), float(alpha)

    def __call__(self, h):
        u = self.on("unit", h.device)
        return h - (self.alpha * ((h @ u) - self.value))[..., None] * u


class Erase(Edit):
    """h − alpha·(h − eraser(h)) with a fitted `concept_erasure.LeaceEraser` (its own code applies it)."""

    def __init__(self, eraser, alpha: float = 1.0):
        bias = eraser.bias if eraser.bias is not None else torch.zeros(eraser.proj_left.shape[0])
        super().__init__(left=eraser.proj_left.double().numpy(), right=eraser.proj_right.double().numpy(),
                         bias=bias.double().numpy())
        self.affine = eraser.bias is not None
        self.alpha = float(alpha)
        self._erasers: dict = {}

    def eraser(self, device: torch.device):
        from concept_erasure import LeaceEraser

        if str(device) not in self._erasers:
            self._erasers[str(device)] = LeaceEraser(self.on("left", device), self.on("right", device),
                                                     self.on("bias", device) if self.affine else None)
        return self._erasers[str(device)]

    def __call__(self, h):
        erased = self.eraser(h.device)(h)
        return erased if self.alpha == 1.0 else h - self.alpha * (h - erased)


class Patch(Edit):
    """Activation patching: h[rows[i], cols[i]] = values[i], every other state left as it is.

    The edit names its own positions in the batch (rows, and columns in the sequence), so it is used with
    `Intervention.where` left None (it then receives the whole [batch, seq, d] hidden states). The values
    are kept in float32; states read from the same model in its own dtype go back into it unchanged."""

    def __init__(self, rows, cols, values):
        super().__init__()
        self.tensors = {"rows": torch.as_tensor(rows, dtype=torch.long).reshape(-1),
                        "cols": torch.as_tensor(cols, dtype=torch.long).reshape(-1),
                        "values": torch.as_tensor(values, dtype=torch.float32)}
        n = len(self.tensors["rows"])
        if len(self.tensors["cols"]) != n or self.tensors["values"].shape[0] != n:
            raise ValueError(f"Patch: {n} rows, {len(self.tensors['cols'])} columns and "
                             f"{self.tensors['values'].shape[0]} values")

    def __call__(self, h):
        out = h.clone()
        out[self.on("rows", h.device), self.on("cols", h.device)] = self.on("values", h.device)
        return out


def fit_leace(X: np.ndarray, labels: np.ndarray):
    """A `LeaceEraser` fitted on activations X [n, d] and 0/1 labels (the reference implementation's
    defaults: affine, covariance-trace constraint, shrinkage), in float64."""
    try:
        from concept_erasure import LeaceEraser
    except ImportError as err:
        raise BabelprobeError("--method leace needs the concept-erasure package (pip install concept-erasure)") from err
    x = torch.as_tensor(np.asarray(X, dtype=np.float64))
    z = torch.as_tensor(np.asarray(labels, dtype=np.float64))
    return LeaceEraser.fit(x, z)


class Intervention:
    """Hooks that apply `edits` ({layer: Edit}) while the context is open (module docstring)."""

    def __init__(self, lm: LoadedModel, edits: dict[int, Edit]):
        self.lm, self.edits = lm, dict(edits)
        bad = [layer for layer in self.edits if not 0 <= layer <= lm.n_layers]
        if bad:
            raise BabelprobeError(f"cannot edit layer {bad[0]}: layers are 0..{lm.n_layers} (0 = embeddings)")
        self.where: tuple[torch.Tensor, torch.Tensor] | None = None
        self.hooks = Hooks(lm)

    def __enter__(self):
        self.hooks = Hooks(self.lm)
        for layer, edit in sorted(self.edits.items()):
            self.hooks.write(residual(layer), self._editor(edit))
        return self

    def __exit__(self, *exc):
        self.hooks.close()

    def edited(self, edit: Edit, hidden: torch.Tensor) -> torch.Tensor:
        """`hidden` [batch, seq, d] with the edit applied at every position or at `where`."""
        h = hidden.to(torch.float32)
        if self.where is None:
            return edit(h).to(hidden.dtype)
        rows, cols = (t.to(hidden.device) for t in self.where)
        out = h.clone()
        out[rows, cols] = edit(h[rows, cols])
        return out.to(hidden.dtype)

    def _editor(self, edit: Edit):
        return lambda hidden: self.edited(edit, hidden)
