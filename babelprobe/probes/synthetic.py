"""Synthetic activations with a planted, depth-dependent signal, for tests, demos and `perf/`.

`synthetic_activations(...)` returns store-shaped keys and activations for minimal pairs: the two
sentences of a pair share most of their representation (a pair component, as real minimal pairs do),
a few dimensions carry large activations with an offset (like the residual stream of real models), and
the acceptable/unacceptable direction grows with depth so that probes have a known best region.
Nothing here is used by the probing code itself.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def synthetic_activations(n_pairs: int = 60, n_layers: int = 18, d_model: int = 640,
                          languages=("en",), subsets=("taxonomic",), signal: float = 2.0,
                          peak_layer: int | None = None, shared_direction: bool = False, seed: int = 0,
                          dtype=np.float32):
    """Keys and activations [n_items, n_layers + 1, d_model] for minimal pairs.

    Parameters
    ----------
    n_pairs : pairs per language × subset (two items each: label 1 then label 0).
    n_layers : L; layers 0..L are produced (0 = embeddings).
    signal : separation of the two classes along the planted direction at the strongest layer, in
        units of the noise standard deviation.
    peak_layer : the layer where the signal is strongest (default 2L/3); it rises linearly from 0 at
        layer 0 to the peak and falls to half at layer L.
    shared_direction : one acceptability direction for all languages and subsets (probes transfer);
        by default each language × subset has its own (they do not).
    seed : everything is deterministic given it.

    Returns
    -------
    keys : DataFrame with item_id, pair_id, language, subset, label, concept (one concept per item,
        shared by a few items, for control tasks).
    X : array [n_items, n_layers + 1, d_model].
    """
    rng = np.random.default_rng(seed)
    peak_layer = round(2 * n_layers / 3) if peak_layer is None else peak_layer
    depth = np.arange(n_layers + 1, dtype=float)
    strength = np.where(depth <= peak_layer, depth / max(peak_layer, 1),
                        1 - 0.5 * (depth - peak_layer) / max(n_layers - peak_layer, 1)) * signal
    big = rng.choice(d_model, size=max(1, d_model // 100), replace=False)  # "massive activation" dims
    keys = []
    X = np.empty((len(languages) * len(subsets) * n_pairs * 2, n_layers + 1, d_model), dtype=dtype)  # filled in place
    common = rng.normal(size=d_model)
    for language in languages:
        for subset in subsets:
            direction = common.copy() if shared_direction else rng.normal(size=d_model)
            direction /= np.linalg.norm(direction)
            for p in range(n_pairs):
                pair_id = f"{language}-{subset}-{p:04d}"
                shared = rng.normal(size=(n_layers + 1, d_model)) * 2.0
                for label in (1, 0):
                    x = shared + rng.normal(size=(n_layers + 1, d_model))
                    x += (label - 0.5) * strength[:, None] * direction[None, :]
                    x[:, big] = x[:, big] * 20 + 50
                    X[len(keys)] = x
                    keys.append({"item_id": f"{pair_id}-{'good' if label else 'bad'}", "pair_id": pair_id,
                                 "language": language, "subset": subset, "label": label,
                                 "concept": f"{language}-concept-{rng.integers(max(2, n_pairs // 3))}"})
    keys = pd.DataFrame(keys)
    keys["label"] = keys["label"].astype(np.int8)
    return keys, X
