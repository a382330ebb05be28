"""Read and write a model's states at named sites inside its forward pass: the one hook mechanism of
extraction, patching, interventions, language neurons and the SAE pass.

A site is a place in the forward pass (docs/design.md "Layers (numbering)", "Model sites"):

    residual(0)   the hidden states entering block 1 (the embedding output, with any scale, position
                  embedding or embedding norm the model adds): a forward pre-hook on block 1
    residual(i)   the output of block i (1..L), before the final norm: a forward hook on block i
    mlp(i)        block i's MLP activation [.., I] (the neurons): a forward hook on the module that
                  computes it (`Parts.activation`); a mixture of experts' [tokens, E·I] (`sites.moe`),
                  read only

`Hooks(lm)` puts functions on sites while the context is open:

    with Hooks(lm) as hooks:
        hooks.read(residual(3), fn)            # fn(state) is called with the state; its return is ignored
        hooks.write(residual(3), fn)           # the state is replaced by fn(state)
        hooks.read(mlp(6), fn, stop=True)      # after fn, the forward pass ends here (`StopForward`)
        hooks.run(batch)                       # the body's forward pass, ended early or not

Functions on one site run in the order they were added, each seeing what the one before wrote (a
write added before a read is read edited). The hooks are removed on exit, so the model is left as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from babelprobe.errors import BabelprobeError
from babelprobe.sites.moe import experts_input, routed_activation

KINDS = ("residual", "mlp")


class StopForward(Exception):
    """Raised from the hook of the last site a pass needs, to end the forward pass there."""


@dataclass(frozen=True)
class Site:
    """A place in the forward pass: `kind` (residual or mlp) at `layer` (module docstring)."""

    kind: str
    layer: int

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown site kind {self.kind!r}; use one of {', '.join(KINDS)}")


def residual(layer: int) -> Site:
    return Site("residual", int(layer))


def mlp(layer: int) -> Site:
    return Site("mlp", int(layer))


def hidden_of(output):
    """The hidden-state tensor of a module's output: a bare tensor (transformers 5) or a tuple's first item."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return output[0]
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    raise TypeError(f"cannot find the hidden states in a block output of type {type(output).__name__}")


def first_input(args, kwargs):
    """The hidden states entering a block (first positional argument or `hidden_states=`)."""
    return args[0] if args else kwargs["hidden_states"]


def with_hidden(output, hidden: torch.Tensor):
    """A module's output with its hidden states replaced (the same shape of output: a tensor or a tuple)."""
    if isinstance(output, torch.Tensor):
        return hidden
    if isinstance(output, tuple):
        return (hidden, *output[1:])
    if isinstance(output, list):
        return [hidden, *output[1:]]
    raise TypeError(f"cannot replace the hidden states in a block output of type {type(output).__name__}")


class Hooks:
    """Functions on sites while the context is open (module docstring). `lm`: a `LoadedModel` or its `Parts`."""

    def __init__(self, lm):
        self.parts = getattr(lm, "parts", lm)
        self.handles: list = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def read(self, site: Site, fn, stop: bool = False) -> Hooks:
        """Call fn(state) at `site`; with `stop`, end the forward pass after it."""
        return self._attach(site, fn, write=False, stop=stop)

    def write(self, site: Site, fn) -> Hooks:
        """Replace the state at `site` by fn(state) (same shape and dtype)."""
        return self._attach(site, fn, write=True, stop=False)

    def run(self, batch: dict, **options) -> object | None:
        """The body's forward pass on a padded batch (no KV cache unless `options` give one); None when a
        hook ended it early."""
        try:
            return self.parts.body(**batch, **{"use_cache": False, **options})
        except StopForward:
            return None

    def _attach(self, site: Site, fn, write: bool, stop: bool) -> Hooks:
        module, entering = self.parts.site_module(site)
        if site.kind == "mlp" and self.parts.routed:
            return self._attach_routed(module, fn, write, stop)
        if entering:
            def pre_hook(module, args, kwargs):
                new = fn(first_input(args, kwargs))
                if stop:
                    raise StopForward
                if not write:
                    return None
                return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})
            self.handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
        else:
            def hook(module, args, output):
                new = fn(hidden_of(output))
                if stop:
                    raise StopForward
                return with_hidden(output, new) if write else None
            self.handles.append(module.register_forward_hook(hook))
        return self

    def _attach_routed(self, experts, fn, write: bool, stop: bool) -> Hooks:
        """A mixture of experts' neurons: read [tokens, E·I] from the experts' input (`sites.moe`); they are
        switched off through the down projection (`sites.moe.switched_off`), not written here."""
        if write:
            raise BabelprobeError("the neurons of a mixture of experts are switched off with sites.moe.switched_off, "
                                  "not written at their site")

        def pre_hook(module, args, kwargs):
            fn(routed_activation(module, *experts_input(args, kwargs)))
            if stop:
                raise StopForward
        self.handles.append(experts.register_forward_pre_hook(pre_hook, with_kwargs=True))
        return self
