"""Language activation probability entropy (LAPE; Tang et al. 2024, ACL, arXiv 2402.16438), implemented as
the released `identify.py` computes it (RUCAIBox/Language-Specific-Neurons), and the files a neurons run
keeps.

From the counts of `activation.h5` (`NeuronStats`): over_zero[l, i, k], the tokens of language k on which
neuron i of layer l has activation > 0, and n_k, the tokens of language k counted:

    p^k       = over_zero[l, i, k] / n_k                      the activation probability
    p̃^k       = p^k / Σ_k' p^k'   (0 where Σ_k' p^k' = 0)    normalised over languages
    LAPE      = − Σ_k p̃^k ln p̃^k    (0 · ln 0 = 0)
    τ         = the round(filter_rate · N)-th smallest of all N = L·I·K probabilities (`kthvalue`, 1-based)
    LAPE      = +∞ for a neuron with no p^k > τ (no language activates it often enough)
    selected  = the round(top_rate · L·I) neurons of lowest LAPE (ties: the lower layer, then index)
    belongs   = a selected neuron belongs to every language k with p^k > τ_bar, τ_bar the
                round(bar_ratio · N)-th smallest probability (`activation_bar_ratio`; the same 0.95 as τ in
                the released code, issue #4)

Defaults top_rate 0.01, filter_rate 0.95, bar_ratio 0.95 (`identify.py`; one stored version uses
top_rate 0.05 for Llama-2-70B). Probabilities are float64 here (the released code divides in float32).

Files (plain formats; no pickle):
  activation.h5  datasets `over_zero` int64 [L, I, K], `n_tokens` int64 [K], `languages` [K] (UTF-8, the
                 order of the last axis), `layers` int64 [L] (1..L: block i's MLP is layer i); attributes
                 `format` ("babelprobe.neurons"), `version` (1) and `info` (JSON: model, fingerprint, what was
                 counted);
  lape.csv       one row per neuron: layer, neuron, lape (inf: no p > τ), p_max, selected (at the first
                 top rate), languages (those with p > τ_bar, comma-separated), rank (1 = lowest LAPE; a
                 neuron is selected at rate r when rank ≤ round(r·L·I));
  neurons.csv    top_rate, language, layer, n_selected: the selected neurons that belong to each language.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.tables import atomic_path

FORMAT, VERSION = "babelprobe.neurons", 1


@dataclass
class NeuronStats:
    """Per layer × neuron × language, the tokens with activation > 0, and the tokens counted."""

    over_zero: np.ndarray  # int64 [L, I, K]
    n_tokens: np.ndarray  # int64 [K]
    languages: list[str]
    layers: list[int] = field(default_factory=list)  # 1..L
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        self.over_zero = np.asarray(self.over_zero, dtype=np.int64)
        self.n_tokens = np.asarray(self.n_tokens, dtype=np.int64)
        self.languages = [str(x) for x in self.languages]
        self.layers = [int(x) for x in self.layers] or list(range(1, self.over_zero.shape[0] + 1))
        k = len(self.languages)
        if self.over_zero.ndim != 3 or self.over_zero.shape[2] != k or self.n_tokens.shape != (k,):
            raise BabelprobeError(f"neuron counts of shape {self.over_zero.shape} and {self.n_tokens.shape} tokens do "
                                  f"not match {k} languages")
        if (self.n_tokens <= 0).any():
            raise BabelprobeError(f"no tokens were counted for {self.languages[int(np.argmin(self.n_tokens))]}")

    @property
    def p(self) -> np.ndarray:
        """float64 [L, I, K]: the activation probabilities p^k."""
        return self.over_zero / self.n_tokens.astype(np.float64)

    def write(self, path: str | Path) -> Path:
        import h5py

        path = Path(path)
        with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
            f.attrs["format"], f.attrs["version"] = FORMAT, VERSION
            f.attrs["info"] = json.dumps(self.info, ensure_ascii=False, default=str)
            f.create_dataset("over_zero", data=self.over_zero, compression="gzip")
            f.create_dataset("n_tokens", data=self.n_tokens)
            f.create_dataset("languages", data=np.array(self.languages, dtype=object), dtype=h5py.string_dtype())
            f.create_dataset("layers", data=np.asarray(self.layers, dtype=np.int64))
        return path

    @classmethod
    def read(cls, path: str | Path) -> NeuronStats:
        import h5py

        try:
            with h5py.File(path, "r") as f:
                if f.attrs.get("format") != FORMAT:
                    raise BabelprobeError(f"{path} is not a babelprobe neurons file (format {f.attrs.get('format')!r})")
                return cls(over_zero=f["over_zero"][()], n_tokens=f["n_tokens"][()],
                           languages=[x.decode() if isinstance(x, bytes) else str(x) for x in f["languages"][()]],
                           layers=f["layers"][()].tolist(), info=json.loads(f.attrs.get("info", "{}")))
        except OSError as err:
            raise BabelprobeError(f"cannot read {path}: {err}") from err


def lape_scores(p: np.ndarray) -> np.ndarray:
    """float64 [...]: LAPE of each neuron from its probabilities p [..., K] (before the τ filter)."""
    total = p.sum(axis=-1, keepdims=True)
    normed = np.divide(p, total, out=np.zeros_like(p, dtype=np.float64), where=total > 0)
    logs = np.log(normed, out=np.zeros_like(normed), where=normed > 0)  # 0 · ln 0 = 0
    return -(normed * logs).sum(axis=-1)


def kth_smallest(values: np.ndarray, rate: float) -> float:
    """The round(rate · N)-th smallest of the N values (1-based, torch's `kthvalue`)."""
    flat = np.asarray(values, dtype=np.float64).ravel()
    k = round(len(flat) * rate)
    if not 1 <= k <= len(flat):
        raise BabelprobeError(f"rate {rate} of {len(flat)} probabilities selects no value (round(rate · N) = {k})")
    return float(np.partition(flat, k - 1)[k - 1])


@dataclass
class Lape:
    """The LAPE selection (module docstring): `table` is lape.csv, `counts` neurons.csv."""

    table: pd.DataFrame
    counts: pd.DataFrame
    languages: list[str]
    top_rates: tuple[float, ...]
    tau: float = np.nan
    bar: float = np.nan
    n_layers: int = 0
    width: int = 0

    def n_selected(self, top_rate: float | None = None) -> int:
        return round((self.top_rates[0] if top_rate is None else top_rate) * self.n_layers * self.width)

    def selected(self, top_rate: float | None = None) -> pd.DataFrame:
        """The rows of the neurons selected at `top_rate` (default: the first rate)."""
        return self.table[self.table["rank"] <= self.n_selected(top_rate)]

    def neurons(self, language: str, top_rate: float | None = None) -> dict[int, np.ndarray]:
        """{layer: neuron indices} of `language`: the selected neurons that belong to it."""
        if language not in self.languages:
            raise BabelprobeError(f"language {language} is not among the neurons' languages "
                                  f"({', '.join(self.languages)})")
        rows = self.selected(top_rate)
        rows = rows[rows["languages"].str.split(",").apply(lambda codes: language in codes)]
        return {int(layer): part["neuron"].to_numpy() for layer, part in rows.groupby("layer")}

    def jaccard(self, top_rate: float | None = None) -> pd.DataFrame:
        """languages × languages: |A ∩ B| / |A ∪ B| of their selected neuron sets."""
        from babelprobe.analysis.neurons import jaccard_matrix

        rows = self.table.assign(selected=self.table["rank"] <= self.n_selected(top_rate))
        return jaccard_matrix(rows, self.languages)

    @classmethod
    def read(cls, directory: str | Path, languages: list[str], top_rates, tau=np.nan, bar=np.nan) -> Lape:
        """The selection a neurons run wrote (lape.csv, neurons.csv in `directory`)."""
        from babelprobe.tables import read_table

        directory = Path(directory)
        table = read_table(directory / "lape.csv")
        # an all-empty column is read as float NaN: as strings first (filling floats with "" will raise in pandas 4)
        table["languages"] = table["languages"].astype("string").fillna("").astype(str)
        return cls(table=table, counts=read_table(directory / "neurons.csv"), languages=list(languages),
                   top_rates=tuple(float(r) for r in top_rates), tau=tau, bar=bar,
                   n_layers=int(table["layer"].nunique()), width=int(table["neuron"].max()) + 1)


def select_lape(stats: NeuronStats, top_rate=0.01, filter_rate: float = 0.95, bar_ratio: float = 0.95) -> Lape:
    """The LAPE scores and selection of `stats` (module docstring). `top_rate`: a rate or a list of rates
    (neurons.csv counts each; lape.csv's `selected` is at the first)."""
    rates = tuple(float(r) for r in (top_rate if isinstance(top_rate, (list, tuple)) else [top_rate]))
    if not rates or not all(0 < r <= 1 for r in rates):
        raise BabelprobeError(f"--top-rate must lie in (0, 1], got {','.join(map(str, rates))}")
    if len(stats.languages) < 2:
        raise BabelprobeError(f"LAPE compares languages: got only {', '.join(stats.languages)}; give two or more")
    p = stats.p
    n_layers, width, _ = p.shape
    entropy = lape_scores(p)
    tau = kth_smallest(p, filter_rate)
    entropy[(p > tau).sum(axis=-1) == 0] = np.inf
    order = np.argsort(entropy.ravel(), kind="stable")
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(1, order.size + 1)
    bar = kth_smallest(p, bar_ratio)
    member = p > bar
    codes = np.array(stats.languages, dtype=object)
    layer_of, neuron_of = np.divmod(np.arange(n_layers * width), width)
    table = pd.DataFrame({
        "layer": np.asarray(stats.layers)[layer_of], "neuron": neuron_of, "lape": entropy.ravel(),
        "p_max": p.max(axis=-1).ravel(), "selected": rank <= round(rates[0] * n_layers * width),
        "languages": [",".join(codes[m]) for m in member.reshape(-1, len(codes))], "rank": rank})
    counts = []
    for rate in rates:
        chosen = (rank <= round(rate * n_layers * width)).reshape(n_layers, width)
        for k, code in enumerate(stats.languages):
            per_layer = (chosen & member[:, :, k]).sum(axis=1)
            counts += [{"top_rate": rate, "language": code, "layer": layer, "n_selected": int(n)}
                       for layer, n in zip(stats.layers, per_layer)]
    return Lape(table=table, counts=pd.DataFrame(counts), languages=list(stats.languages), top_rates=rates, tau=tau,
                bar=bar, n_layers=n_layers, width=width)
