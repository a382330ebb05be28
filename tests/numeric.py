"""Tolerances for float32 results, derived from the arithmetic instead of one machine's last digits.

Two evaluations of the same float32 computation differ when their kernels order a reduction differently:
another SIMD width (`ATEN_CPU_CAPABILITY=default`, `avx2`, `avx512`), another thread count, one text per
batch against eight, left against right padding. A sum of n terms carries a rounding error that grows like
√n·u on average and n·u at worst (u = 2⁻²⁴, Higham, *Accuracy and Stability of Numerical Algorithms*,
§4.2), relative to the sum of the magnitudes it adds up. A forward pass chains such reductions: each block
adds its own error to the residual stream, so errors add over the depth. The rule used here,

    rtol = depth · 4·√terms · ε32          (ε32 = 2u = 2⁻²³)

per chained reduction of `terms` terms (4·√n covers the tail of the rounding distribution without the
worst case's n, which no real kernel reaches), applied to the magnitude the reductions carried (`scale`:
the largest |value| compared, or a given one: a log-probability inherits the error of its logits, not of
its own small value). Results written rounded (a JSON score list kept to 6 decimals) can also flip by one
unit of the last written digit (`quantum`).

`make test-numeric` runs the numeric tests under each kernel family this CPU offers; `.ci/run` calls it.
"""

from __future__ import annotations

import math

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)


def float32_rtol(terms: int, depth: int = 1) -> float:
    """Relative tolerance of a float32 result that chains `depth` reductions of up to `terms` terms."""
    return depth * 4.0 * math.sqrt(max(int(terms), 1)) * EPS32


def model_rtol(lm) -> float:
    """`float32_rtol` of a forward pass through `lm` (a `LoadedModel`): its blocks plus the embedding and the
    head, each reducing over the widest of d_model and the MLP width."""
    config = lm.model.config
    width = max(lm.d_model, int(getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
                                or 4 * lm.d_model))
    return float32_rtol(width, lm.n_layers + 2)


def tolerance(expected, rtol: float, scale: float | None = None, quantum: float = 0.0) -> float:
    """The absolute bound: `quantum` + `rtol` · `scale` (default: the largest finite |expected|)."""
    values = np.abs(np.asarray(expected, dtype=float))
    values = values[np.isfinite(values)]
    if scale is None:
        scale = float(values.max()) if values.size else 0.0
    return quantum + rtol * scale


def assert_float32_close(actual, expected, rtol: float, scale: float | None = None, quantum: float = 0.0,
                         err_msg: str = "") -> None:
    """|actual − expected| ≤ `tolerance(expected, rtol, scale, quantum)` everywhere (NaN where both are)."""
    actual, expected = np.asarray(actual, dtype=float), np.asarray(expected, dtype=float)
    bound = tolerance(expected, rtol, scale, quantum)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=bound, equal_nan=True,
                               err_msg=f"{err_msg} (float32 bound {bound:.3g})")


def written_quantum(literals) -> float:
    """One unit of the last digit written in `literals` (strings as a table stores numbers): the most
    decimals any of them shows (0 for integers)."""
    decimals = 0
    for text in literals:
        text = str(text).strip().lower()
        if not text or text in ("nan", "inf", "-inf") or "e" in text:
            continue
        if "." in text:
            decimals = max(decimals, len(text.split(".", 1)[1]))
    return 10.0 ** -decimals if decimals else 0.0


# The numeric tests (marker `numeric`, added by tests/conftest.py): those that compare float results of a
# forward pass or a solver with a reference. `make test` reruns them under each other CPU kernel family.
# Module -> test-name patterns (fnmatch; parametrised ids ignored).
NUMERIC = {
    "test_benchmark_golden.py": ["*"],
    "test_direct.py": ["*"],
    "test_logprobs.py": ["*"],
    "test_meta_logprobs.py": ["*"],
    "test_probe_solvers.py": ["*"],
    "test_extract_default.py": ["*"],
    "test_patch.py": ["*equal*", "*agree*", "*self_patch*", "*source_distribution", "*sums_of_the_softmax"],
    "test_meta.py": ["*match*", "*agree"],
    "test_extract.py": ["test_store_equals_hf*", "test_out_of_memory*", "test_stops_after*",
                        "test_a_text_that_recurs*"],
    "test_extract_scaling.py": ["*equals*", "*stores_what_hf_stores"],
    "test_default_model.py": ["test_direct_scores_equal*"],
    "test_families.py": ["*equal*", "test_lens_*"],
    "test_generate.py": ["*equals*", "*matches*"],
    "test_consistency.py": ["*match_a_plain_forward_pass"],
    "test_stingray.py": ["*match_a_plain_forward_pass"],
    "test_pitfalls.py": ["*match_a_plain_forward_pass"],
    "test_interventions.py": ["test_intervened_forward_equals*", "test_leace_equalises*"],
    "test_latent.py": ["*match_a_softmax*"],
    "test_lmeval.py": ["*equal*harness*"],
    "test_bridges.py": ["*equal*harness", "*as_the_harness_does"],
    "test_neurons.py": ["*numpy_reference*", "*hand_edit*", "*released_identify"],
    "test_probe_sweep.py": ["*sklearn*", "*grid_search"],
    "test_sae.py": ["*equal*"],
}


def is_numeric(module: str, name: str) -> bool:
    """Whether test `name` (without its parameters) of `module` (a file name) is a numeric test."""
    from fnmatch import fnmatch

    return any(fnmatch(name, pattern) for pattern in NUMERIC.get(module, ()))
