"""Model sites: where a decoder family keeps its embedding, blocks, final norm, head, logit scale, soft-cap
and MLP activation, declared as data (babelprobe/data/families.csv, `table`), resolved for one model
(`parts.Parts`), and one way to read or write them inside the forward pass (`hooks.Hooks` at a layer's
`residual` state or its `mlp` activation). docs/design.md "Model sites".
"""

from babelprobe.sites.hooks import (
    Hooks,
    Site,
    StopForward,
    first_input,
    hidden_of,
    mlp,
    residual,
    with_hidden,
)
from babelprobe.sites.parts import Parts
from babelprobe.sites.table import Family, families, locate

__all__ = ["Family", "Hooks", "Parts", "Site", "StopForward", "families", "first_input", "hidden_of", "locate",
           "mlp", "residual", "with_hidden"]
