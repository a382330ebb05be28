"""The settings of `babelprobe lens` (`LensSettings`) and `babelprobe align` (`AlignSettings`): what changes
their numbers, recorded in lens.json / align.json; the CLI makes one flag per field.

This module imports nothing heavy: the CLI builds its flags from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from babelprobe.errors import BabelprobeError
from babelprobe.settings import as_tuple, at_least, one_of, option

ORDERS = ("gf", "bf")  # = lens.ORDERS: acceptable ("good") concept listed first, unacceptable ("bad") first
POOLS = ("last", "mean")


@dataclass(frozen=True)
class LensSettings:
    """What changes the numbers of a logit-lens run."""

    target: str | None = option(None, metavar="FIELD",
                                help="with --acts: the item field holding the expected answer (none: entropy and "
                                "top-k tokens only)")
    pivot: str | None = option("en", help="language of the counterpart answer ('none': no pivot)")
    orders: tuple[str, ...] = option(ORDERS, metavar="LIST",
                                     help="meta option orders to ask: gf (acceptable concept first), bf")
    prompts: str = option("xcomps", metavar="NAME|FILE", help="meta prompt set")
    top_k: int = option(10, metavar="K", help="top tokens whose script is counted")
    n_boot: int = option(1000, metavar="N", help="bootstrap replicates")
    seed: int = option(0, help="bootstrap seed")

    def __post_init__(self):
        pivot = None if self.pivot is None or str(self.pivot).lower() == "none" else str(self.pivot)
        object.__setattr__(self, "pivot", pivot)
        object.__setattr__(self, "orders", as_tuple(self.orders))
        object.__setattr__(self, "prompts", str(self.prompts))
        bad = [o for o in self.orders if o not in ORDERS]
        if bad or not self.orders:
            raise BabelprobeError(f"--orders: unknown order {bad[0] if bad else ''!r}; use gf (acceptable concept "
                                  "first), bf or both")
        at_least(self, "top_k", 1)
        at_least(self, "n_boot", 0)


@dataclass(frozen=True)
class AlignSettings:
    """What changes the numbers of an alignment run."""

    pivot: str = option("en", help="language every other is retrieved against")
    pool: str = option("last", choices=POOLS, help="pooling to read")
    centre: bool = option(True, help="mean-centre each language's states at every layer (--no-centre: do not)")
    layers: str = option("all", metavar="SPEC", help="layers to align: all, or e.g. 0,6,12-18")

    def __post_init__(self):
        if isinstance(self.layers, (list, tuple)):
            object.__setattr__(self, "layers", ",".join(map(str, self.layers)))
        object.__setattr__(self, "layers", str(self.layers))
        one_of(self, "pool", POOLS)
