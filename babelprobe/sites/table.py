"""Where each decoder family keeps its sites, declared as data (babelprobe/data/families.csv), and the
structural rule for a family the table lacks.

One row per transformers `model_type` (anchors: TransformerLens's architecture adapters, nnsight's
module renaming). Paths are attribute paths (`model.layers`; `a|b`: the first that exists); `-` means the
family has none.

    embed         the token embedding (from the *ForCausalLM model)
    embed_scale   what the embedding is multiplied by before block 1: a config attribute
                  (`embedding_multiplier`), `sqrt(ATTR)`, either followed by `if FLAG` (a config flag)
    embed_norm    a norm applied to the embedding before block 1 (BLOOM)
    positions     rotary, alibi (inside attention), learned or sinusoidal (added to the embedding)
    blocks        the ModuleList of decoder blocks
    final_norm    the norm between the last block and the head
    head          the unembedding
    logit_scale   a config attribute multiplying the logits (Cohere), or `1/ATTR` dividing them (Granite)
    softcap       a config attribute c: logits -> c·tanh(logits/c) (Gemma-2/3)
    mlp           gated (act(gate)·up), fused-gated (gate and up in one projection: Phi-3), plain
                  (act(fc)), moe (routed experts: neuron e·I + j is unit j of expert e, `sites.moe`),
                  moe-shared (routed experts beside an always-on shared expert: its neurons are refused)
    activation    from a block: the module whose output is the neurons' activation [.., I] (moe: the experts)
    down          from a block: the projection that reads the activation (its input width is I)

Layer 0 is read where it enters block 1, so the embedding scale, added positions and embedding norm are
all in it (docs/design.md "Layers (numbering)"); the columns say what it holds.

The structural rule (a `model_type` not in the table): the blocks are the one ModuleList of
`num_hidden_layers` modules; the final norm the one norm module beside them; the head
`get_output_embeddings()`; the MLP activation the one activation module in each block's MLP. It is then
checked by one forward pass of four tokens: the final state (the head's input) must be the final norm of the last
block's output, and the head's logits of it the model's own logits, else the model is refused in one
line (its logits would be wrong) or the missing site is named where it is asked for.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from importlib import resources

import torch
from torch import nn

from babelprobe.errors import BabelprobeError
from babelprobe.sites.moe import check_layout
from babelprobe.sites.parts import Parts

NONE = "-"
MLP_KINDS = ("gated", "fused-gated", "plain", "moe", "moe-shared")
TABLE = "babelprobe/data/families.csv"


@dataclass(frozen=True)
class Family:
    """One row of the table (module docstring); `source` says whether it came from the table or the rule."""

    family: str
    embed: str
    embed_scale: str
    embed_norm: str
    positions: str
    blocks: str
    final_norm: str
    head: str
    logit_scale: str
    softcap: str
    mlp: str
    activation: str
    down: str
    source: str = "table"

    def embed_multiplier(self, config) -> float:
        """The number the token embedding is multiplied by before block 1 (1.0: none)."""
        rule = self.embed_scale
        if rule == NONE:
            return 1.0
        rule, _, flag = (part.strip() for part in rule.partition(" if "))
        if flag and not getattr(config, flag, False):
            return 1.0
        if rule.startswith("sqrt(") and rule.endswith(")"):
            return math.sqrt(float(getattr(config, rule[5:-1])))
        return float(getattr(config, rule))


COLUMNS = tuple(f.name for f in fields(Family) if f.name != "source")


@lru_cache(maxsize=1)
def families() -> dict[str, Family]:
    """{model_type: Family} of babelprobe/data/families.csv."""
    text = resources.files("babelprobe").joinpath("data/families.csv").read_text(encoding="utf-8")
    rows = list(csv.DictReader(line for line in text.splitlines() if line and not line.startswith("#")))
    out = {}
    for row in rows:
        if tuple(row) != COLUMNS:
            raise ValueError(f"{TABLE}: columns {tuple(row)} are not {COLUMNS}")
        family = Family(**{k: (v or "").strip() for k, v in row.items()})
        if family.mlp not in MLP_KINDS:
            raise ValueError(f"{TABLE}: {family.family} has mlp {family.mlp!r}, not one of {', '.join(MLP_KINDS)}")
        out[family.family] = family
    return out


def family_name(model: nn.Module) -> str:
    return str(getattr(model.config, "model_type", "") or type(model).__name__)


# ------------------------------------------------------------------------------------------- locating

class RowMismatch(BabelprobeError):
    """A family's row names a module this model does not have (another transformers version, remote code)."""


def locate(model: nn.Module, table: dict[str, Family] | None = None) -> Parts:
    """The `Parts` of a HF causal LM: by its family's row, else (no row, or a row that does not fit this
    model) by the structural rule (module docstring)."""
    table = families() if table is None else table
    name = family_name(model)
    if name in table:
        try:
            return _from_row(model, table[name])
        except RowMismatch:
            pass
    return _structural(model, name)


def _get(root: nn.Module, path: str, family: str):
    """The module at an attribute path; `a|b` names the first of two that exists (a module renamed between
    transformers versions)."""
    for choice in path.split("|"):
        node = root
        for part in choice.split("."):
            node = getattr(node, part, None)
            if node is None:
                break
        if node is not None:
            return node
    raise RowMismatch(f"{type(root).__name__} has no {path}, where {TABLE} says {family} keeps it")


def _config_number(config, rule: str) -> tuple[str, float] | None:
    """("multiply" | "divide", value) of a logit-scale rule, None when the family has none (or the config's
    value is None)."""
    if rule == NONE:
        return None
    op, attr = ("divide", rule[2:]) if rule.startswith("1/") else ("multiply", rule)
    value = getattr(config, attr, None)
    return None if value is None else (op, float(value))


def _from_row(model: nn.Module, row: Family) -> Parts:
    config, name = model.config, row.family
    blocks = _get(model, row.blocks, name)
    if not isinstance(blocks, nn.ModuleList):
        raise RowMismatch(f"{TABLE}: {name}'s blocks {row.blocks} is a {type(blocks).__name__}, not a ModuleList")
    scale = _config_number(config, row.logit_scale)
    softcap = getattr(config, row.softcap, None) if row.softcap != NONE else None
    parts = Parts(body=model.base_model, embed=_get(model, row.embed, name), layers=blocks,
                  final_norm=None if row.final_norm == NONE else _get(model, row.final_norm, name),
                  head=_get(model, row.head, name), softcap=softcap,
                  logit_scale=scale[1] if scale and scale[0] == "multiply" else None,
                  logit_divisor=scale[1] if scale and scale[0] == "divide" else None, family=row)
    if row.mlp == "moe-shared":
        parts.missing["mlp"] = _moe_refusal(name, _get(blocks[0], row.activation.rpartition(".")[0] or row.activation,
                                                       name))
    elif row.mlp == "moe":
        experts = [_get(block, row.activation, name) for block in blocks]
        try:
            per_expert = check_layout(experts[0], name)
            parts.width = experts[0].gate_up_proj.shape[0] * per_expert
        except BabelprobeError as err:  # only the neurons need the layout: refused where they are asked for
            parts.missing["mlp"] = str(err)
        else:
            parts.activations, parts.routed = experts, True
            _check_distinct(parts, name)
    else:
        parts.activations = [_get(block, row.activation, name) for block in blocks]
        parts.width = in_width(_get(blocks[0], row.down, name))
        _check_distinct(parts, name)
    return parts


def _moe_refusal(name: str, moe: nn.Module) -> str:
    return (f"the MLPs of {name} are mixtures of experts ({type(moe).__name__}) with a shared expert or a layout "
            f"{TABLE} does not declare: babelprobe reads the neurons of dense MLPs and of routed experts alone "
            "(Mixtral, Qwen3-MoE, OLMoE)")


def _check_distinct(parts: Parts, name: str) -> None:
    if len({id(m) for m in parts.activations}) < len(parts.activations):
        parts.activations = None
        parts.missing["mlp"] = (f"the MLPs of {name} share one activation module; a hook on it cannot tell the "
                                "layers apart")


def in_width(module: nn.Module) -> int:
    """The input width of a projection: nn.Linear's in_features, transformers' Conv1D's nx (its weight is
    [in, out]), else the last dimension of its weight."""
    if isinstance(module, nn.Linear):
        return int(module.in_features)
    if getattr(module, "nx", None):
        return int(module.nx)
    return int(module.weight.shape[-1])


# -------------------------------------------------------------------------------------- the structural rule

# config attributes that change a family's logits after its head: the structural rule cannot know how a family
# applies them (a soft-cap is invisible on a check's small logits), so a family that sets one needs a row
LOGIT_ATTRIBUTES = ("logit_scale", "logits_scaling", "final_logit_softcapping", "output_multiplier_scale",
                    "lm_head_multiplier", "logit_softcapping")
ACTIVATION_MODULES = ("transformers.activations", "torch.nn.modules.activation")
MLP_NAMES = ("mlp", "feed_forward", "ffn")


def _structural(model: nn.Module, name: str) -> Parts:
    body = model.base_model
    scales = [a for a in LOGIT_ATTRIBUTES if getattr(model.config, a, None) is not None]
    if scales:
        raise BabelprobeError(f"cannot tell how {name} computes its logits: it is not in {TABLE}, and its config "
                              f"sets {', '.join(scales)}, which the structural rule does not apply; add a row for it")
    blocks, path = _find_blocks(model, name)
    parent = model.get_submodule(path.rpartition(".")[0]) if "." in path else model
    norms = [(n, m) for n, m in parent.named_children() if m is not blocks and "Norm" in type(m).__name__]
    row = Family(family=name, embed=_path_of(model, model.get_input_embeddings()), embed_scale="?", embed_norm="?",
                 positions="?", blocks=path, final_norm=f"{path.rpartition('.')[0]}.{norms[0][0]}".lstrip(".")
                 if len(norms) == 1 else NONE, head=_path_of(model, model.get_output_embeddings()),
                 logit_scale=NONE, softcap=NONE, mlp="plain", activation=NONE, down=NONE, source="structural")
    parts = Parts(body=body, embed=model.get_input_embeddings(), layers=blocks,
                  final_norm=norms[0][1] if len(norms) == 1 else None, head=model.get_output_embeddings(),
                  softcap=None, family=row)
    if len(norms) > 1:
        parts.missing["final_norm"] = (f"{name} is not in {TABLE}, and the structural rule found several norms beside "
                                       f"its blocks ({', '.join(n for n, _ in norms)}); add a row for it")
    activation = _find_activation(blocks, name, parts)
    if activation is not None:
        parts.activations = [block.get_submodule(activation) for block in blocks]
        parts.family = replace(row, activation=activation)
        _check_distinct(parts, name)
    if next(model.parameters()).device.type != "meta":
        _verify(model, parts, name)
    return parts


def _path_of(root: nn.Module, module: nn.Module | None) -> str:
    return next((n for n, m in root.named_modules() if m is module), NONE) if module is not None else NONE


def _find_blocks(model: nn.Module, name: str) -> tuple[nn.ModuleList, str]:
    n_layers = getattr(model.config, "num_hidden_layers", None)
    found = [(path, m) for path, m in model.named_modules() if isinstance(m, nn.ModuleList)
             and (len(m) == n_layers if n_layers else path.count(".") <= 1)]
    if len(found) != 1:
        raise BabelprobeError(f"cannot find the decoder blocks of {type(model).__name__}: {name} is not in {TABLE}, "
                              f"and the structural rule found {len(found)} lists of "
                              f"{n_layers if n_layers else 'blocks'} modules where it needs one; add a row for it")
    return found[0][1], found[0][0]


def _is_activation(module: nn.Module) -> bool:
    return type(module).__module__ in ACTIVATION_MODULES or "Gelu" in type(module).__name__


def _find_activation(blocks: nn.ModuleList, name: str, parts: Parts) -> str | None:
    """The path, from a block, of its MLP's one activation module (None, with the reason in `parts.missing`)."""
    block = blocks[0]
    prefix = next((n for n in MLP_NAMES if isinstance(getattr(block, n, None), nn.Module)), "")
    container = block.get_submodule(prefix) if prefix else block
    if hasattr(container, "experts") or "Moe" in type(container).__name__ or "MoE" in type(container).__name__:
        parts.missing["mlp"] = _moe_refusal(name, container)
        return None
    found = [n for n, m in container.named_children() if _is_activation(m)]
    if len(found) != 1:
        parts.missing["mlp"] = (f"{name} is not in {TABLE}, and the structural rule found {len(found)} activation "
                                f"modules in {type(container).__name__} where it needs one; add a row for it")
        return None
    return f"{prefix}.{found[0]}" if prefix else found[0]


def _verify(model: nn.Module, parts: Parts, name: str) -> None:
    """One forward pass of four tokens (module docstring): the final state (the head's input) against the final
    norm of the last block's output, and the logits of it against the model's own; measures the MLP width."""
    seen = {}  # the head's input is the final state the model's own forward uses (OPT's runs its decoder, not its body)
    handles = [parts.layers[-1].register_forward_hook(lambda m, a, out: seen.__setitem__("last", _first(out))),
               parts.head.register_forward_pre_hook(lambda m, args: seen.__setitem__("final", args[0]))]
    if parts.activations:
        handles.append(parts.activations[0].register_forward_hook(lambda m, a, out: seen.__setitem__("act", out)))
    vocab = parts.head.weight.shape[0]
    ids = (torch.arange(4) % vocab)[None].to(parts.embed.weight.device)
    try:
        with torch.inference_mode():
            real = model(input_ids=ids).logits.float()
    finally:
        for handle in handles:
            handle.remove()
    if "act" in seen:
        parts.width = int(seen["act"].shape[-1])
    with torch.inference_mode():
        normed = parts.final_norm(seen["last"]) if parts.final_norm is not None else seen["last"]
        mine = parts.logits(seen["final"]).float()
    if "final_norm" not in parts.missing and not _close(normed, seen["final"]):
        what = "no final norm" if parts.final_norm is None else f"final norm {parts.family.final_norm}"
        parts.missing["final_norm"] = (f"{name} is not in {TABLE}, and its blocks' output through the structural "
                                       f"rule's {what} is not the model's final state; add a row for it")
    if not _close(mine, real):
        raise BabelprobeError(f"cannot tell how {name} computes its logits: it is not in {TABLE}, and its head "
                              "applied to its final states is not the model's own logits; add a row for it")


def _first(output):
    return output if isinstance(output, torch.Tensor) else output[0]


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same operations on the same inputs: equal but for a kernel's last bits (8 eps of the dtype, relative
    to the largest value); a missing scale or norm moves them by far more."""
    if a.shape != b.shape:
        return False
    eps = torch.finfo(a.dtype).eps if a.dtype.is_floating_point else 0.0
    a, b = a.float(), b.float()
    return bool((a - b).abs().max() <= 8 * eps * b.abs().max().clamp_min(1e-30))
