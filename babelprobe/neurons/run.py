"""`babelprobe neurons` (`bp.language_neurons`): find language-specific neurons by LAPE in one pass.

    stats = neuron_stats(lm, items)                   # counts per layer × neuron × language (mlp.NeuronCounter)
    lape = select_lape(stats)                         # LAPE, τ, the selection (lape.py)
    result = language_neurons("default", "xcomps-sample", "neu/")   # the command: files, figures

What is counted: every real token except BOS of the items' texts, per language (each text its own row,
as `extract` runs it), or of a corpus's training part (`babelprobe.corpus`: udhr, a folder of
<lang>.txt, a table, hf:; each language's lines tokenised, joined and cut into rows of `--window` tokens
with BOS first, as the released `activation.py` cuts its token stream into rows of the model's context;
`--protocol paper`: rows of the model's context, `--window 0`; the shorter last row is kept, where
activation.py drops it, so that a corpus shorter than the context is counted; `--tokens` caps it).

The run (OUT/): inputs checked before the model loads (settings, items or corpus, two languages or
more); then the model (its MLP neurons must be readable: `Parts.activation`, babelprobe/data/families.csv)
and the tokens each language has (at least `min_tokens`), before anything is written. Writes
`activation.h5`, `lape.csv`, `neurons.csv` (lape.py), `neurons.json` (the identity: model fingerprint, the texts, the window; the selection's
settings, τ and τ_bar) and `figures/` (lape_layers, lape_overlap: `analysis.neurons`). The same command
again reuses the counts; other LAPE settings only redo the selection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from babelprobe.errors import BabelprobeError
from babelprobe.inputs import check_inputs
from babelprobe.models import Encoding, LoadedModel, length_batches, pad_batch, pass_tokens
from babelprobe.neurons.lape import Lape, NeuronStats, select_lape
from babelprobe.neurons.mlp import NeuronCounter, activation_modules
from babelprobe.neurons.settings import Settings
from babelprobe.runs import check_kind, layout, open_run, read_manifest
from babelprobe.runtime import Runtime, runner
from babelprobe.settings import settings_record
from babelprobe.tables import check_out_dir, write_table

MANIFEST = layout("neurons").manifest
OUTPUTS = ("activation.h5", "lape.csv", "neurons.csv")


@dataclass
class NeuronsResult:
    stats: NeuronStats
    lape: Lape
    out: Path
    figures: dict = field(default_factory=dict)  # name -> [pdf, png]


# ------------------------------------------------------------------------------------------- counting

def texts_by_language(texts) -> dict[str, list[str]]:
    """{language: texts} from items (a table with `language` and `text`) or such a dict."""
    if isinstance(texts, pd.DataFrame):
        return {code: part["text"].tolist() for code, part in texts.groupby("language", sort=True)}
    return {str(code): list(values) for code, values in dict(texts).items()}


def encodings_of(lm: LoadedModel, texts: list[str], window: int | None = None,
                 tokens: int | None = None) -> list[Encoding]:
    """The rows to run: each text (BOS first), or with `window` the texts' token stream (at most `tokens`)
    cut into rows of `window` tokens, each with BOS first, the shorter last row kept (`corpus.pack_rows`)."""
    from babelprobe.corpus import pack_rows

    if window is None:
        return lm.encode(texts)
    rows = pack_rows(lm, list(texts), window, tokens=tokens, keep_last=True)
    return [Encoding(row, [(0, 0)] * len(row)) for row in rows]


def counted_tokens(lm: LoadedModel, encodings: list[Encoding]) -> int:
    """The tokens a count covers: every token but each row's BOS."""
    return sum(len(e.ids) - (lm.bos_policy == "bos") for e in encodings)


def neuron_stats(lm: LoadedModel, texts, *, window: int | None = None, batch_tokens: int = 4096,
                 padding: str = "right", progress: bool = False, encodings: dict | None = None) -> NeuronStats:
    """Per layer × neuron × language, the tokens on which the neuron's activation is > 0 (module
    docstring). `texts`: items (`language`, `text`) or {language: [texts]}; `window`: cut each
    language's joined tokens into rows (a corpus). Nothing per token is kept."""
    by_language = texts_by_language(texts)
    encodings = encodings or {code: encodings_of(lm, values, window) for code, values in by_language.items()}
    languages = sorted(encodings)
    modules = activation_modules(lm)
    stats = None
    with NeuronCounter(lm) as counter:
        for k, code in enumerate(tqdm(languages, desc="counting", unit="language", disable=not progress)):
            rows = encodings[code]
            # extraction's batches: cut where the padding saved pays for one more pass
            for batch in length_batches([len(e.ids) for e in rows], batch_tokens, pass_tokens(lm.device)):
                counter.run(pad_batch([rows[i] for i in batch], lm.pad_token_id, padding, lm.device))
            counts, n = counter.take()
            if stats is None:
                stats = np.zeros((len(modules), counts.shape[1], len(languages)), dtype=np.int64)
                n_tokens = np.zeros(len(languages), dtype=np.int64)
            stats[:, :, k], n_tokens[k] = counts, n
    return NeuronStats(stats, n_tokens, languages, info={"model": lm.name, "fingerprint": lm.fingerprint})


# ---------------------------------------------------------------------------------------------- input

# ------------------------------------------------------------------------------------------------ run

@runner(Settings, old=("model", "items", "out"), batch_tokens=8192)
def language_neurons(items=None, out: str | Path | None = None, settings: Settings | None = None,
                     runtime: Runtime | None = None, *, corpus=None, languages: list[str] | None = None,
                     min_tokens: int = 1000) -> NeuronsResult:
    """Count, select and write (module docstring). `items` (default xcomps-sample) or `corpus` (a
    `babelprobe.corpus` source: udhr, a folder of <lang>.txt, ...; `languages` keeps some). `settings` or the same values as keyword
    arguments (`top_rate=(0.01, 0.05)`, ...). `min_tokens`: each language needs at least this many
    counted tokens. `runtime`: the model and the running options (`runtime.Runtime`), or their keywords
    (`model=`, `load_options=`, `batch_tokens=`, `progress=`, `overwrite=`, `figures=`)."""
    from babelprobe.items import items_hash, load_items

    if out is None:
        raise BabelprobeError("neurons needs an output directory (--out)")
    if min_tokens < 1:
        raise BabelprobeError(f"--min-tokens must be at least 1, got {min_tokens}")
    out = check_out_dir(out)
    check_kind(out, "neurons", "neurons")
    if corpus is not None and items is not None:
        raise BabelprobeError("give --items or --corpus, not both")
    if corpus is None and settings.protocol == "paper":
        raise BabelprobeError("--protocol paper counts a text corpus in rows of the model's context, as Tang et al.'s "
                              "activation.py: give --corpus (e.g. udhr)")
    if corpus is None and settings.tokens is not None:
        raise BabelprobeError("--tokens caps a corpus's tokens: it goes with --corpus")
    check_inputs(items=(items, "items"), corpus=(corpus, "corpus"))
    if corpus is not None:
        from babelprobe.corpus import read_corpus

        text = read_corpus(corpus, languages)
        texts = text.train  # counted on the training part; the ppl readout reads the held-out part
        source = {"corpus": text.source, "texts": text.digest(), "window": settings.window, "tokens": settings.tokens}
    else:
        items = load_items(items if items is not None else "xcomps-sample", languages=languages)
        texts = texts_by_language(items)
        source = {"items": items_hash(items)}
    if len(texts) < 2:
        raise BabelprobeError(f"LAPE compares languages: the texts have only {', '.join(texts) or 'none'}; give two "
                              "or more (--languages)")
    if not runtime.overwrite:
        read_manifest(out / MANIFEST)  # a damaged manifest is refused before the model loads
    lm = runtime.lm
    activation_modules(lm)  # MLP neurons babelprobe cannot read are refused before any work
    window = (settings.window or lm.max_length - 1) if corpus is not None else None
    encodings = {code: encodings_of(lm, values, window, settings.tokens) for code, values in texts.items()}
    short = {code: n for code in sorted(encodings) if (n := counted_tokens(lm, encodings[code])) < min_tokens}
    if short:  # every short language named at once, so that one fix is enough
        (code, n), *others = short.items()
        also = f"; so do {', '.join(f'{c} ({m})' for c, m in others)}" if others else ""
        raise BabelprobeError(f"language {code} has {n} tokens to count, fewer than --min-tokens {min_tokens}{also}; "
                              f"give {'them' if others else 'it'} more text, or lower --min-tokens")
    identity = {"fingerprint": lm.fingerprint, **source}
    run = open_run(out, identity, record={"model": lm.name}, manifest=MANIFEST, overwrite=runtime.overwrite,
                   outputs=(*OUTPUTS, "figures"), what="a neurons run of another model or other texts")

    def count() -> NeuronStats:
        stats = neuron_stats(lm, texts, window=window, batch_tokens=runtime.batch_tokens, progress=runtime.progress,
                             encodings=encodings)
        stats.info.update(source)
        stats.write(out / "activation.h5")
        return stats

    stats = run.stage("count", identity, count, out / "activation.h5", NeuronStats.read)
    lape = select_lape(stats, settings.top_rate, settings.filter_rate, settings.bar_ratio)
    write_table(lape.table, out / "lape.csv")
    write_table(lape.counts, out / "neurons.csv")
    run.state["stages"]["select"] = settings_record(settings)
    run.state["selection"] = {"languages": lape.languages, "top_rates": list(lape.top_rates), "tau": lape.tau,
                              "bar": lape.bar, "n_layers": lape.n_layers, "n_neurons": lape.width,
                              "n_tokens": dict(zip(stats.languages, stats.n_tokens.tolist()))}
    run.save()
    result = NeuronsResult(stats=stats, lape=lape, out=out)
    if runtime.figures:
        from babelprobe.analysis.neurons import write_figures

        result.figures = write_figures(lape.table, lape.counts, out / "figures")
    return result


def read_run(path: str | Path, flag: str = "--neurons") -> tuple[Lape, dict]:
    """The selection of a finished neurons run and its manifest (a one-line error if it is not one)."""
    path = layout("neurons").check(path, flag)
    manifest = read_manifest(path / MANIFEST) or {}
    selection = manifest.get("selection")
    if not selection:
        raise BabelprobeError(f"{flag} {path}: {MANIFEST} records no selection; run `babelprobe neurons` into it again")
    lape = Lape.read(path, selection["languages"], selection["top_rates"], selection.get("tau"), selection.get("bar"))
    return lape, manifest
