"""The runs behind `babelprobe patch`: check the inputs, open the run directory, patch, write the tables and
figures, return the result (`bp.patch_translation`, `bp.patch_pairs`; the command only parses and prints).

    result = bp.patch_translation("default", "xcomps-sample", out="patch/", n_pairs=50)   # TranslationResult
    result = bp.patch_pairs("default", "xcomps-sample", "en", out="patch/")              # PairsResult

Both protocols write into one directory (OUT/patch.json: the model's fingerprint, and per protocol, a
stage, the settings that change its rows; under "summaries", --n-boot and --min-gap, which change only the
summaries: a run that changes only them reuses the rows; a protocol run again with other settings replaces
its own tables, said on stderr, and leaves the other protocol's):

    translation.csv            config, exp, variant, pair_idx, src_concept, tgt_concept, layer,
                               p_src_concept_tgt_lang, p_tgt_concept_tgt_lang, p_src_concept_src_lang,
                               p_tgt_concept_src_lang, p_latent, base_src, base_tgt
    translation_pairs.csv      per pair: the concepts, prompts and token sets
    translation_summary.csv    config × exp × variant × layer × measure: mean, ci_low, ci_high, n
    translation_switches.csv   the layers where the output language and where the concept moved
    pairs.csv                  pair_id, parallel_id, language, source, subset, layer, control, s_good, s_bad,
                               s_patched, recovery (+ s_unpatched, other_parallel_id); joins compare/items.csv
    summary.csv                control, source, language, layer, mean, ci_low, ci_high, n, median, median_low,
                               median_high (recovery over the pairs decided correctly by ≥ --min-gap), gain_mean,
                               gain_median (s_patched − s_bad, nats), n_left_out
    onsets.csv                 per language: the layers with median recovery ≥ 0.5, and the probe's peak (--compare)
    figures/                   patch_translation, patch_recovery, patch_vs_probe (PDF + PNG)

Everything that can be checked without the model (settings, inputs, languages, concept counts) is checked
before the model loads; the pair selection (which needs the tokenizer) before OUT is created. The same
command again reuses the finished rows; an interrupted run resumes in chunks of pairs
(`runs.score_resumably`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from babelprobe.errors import BabelprobeError
from babelprobe.inputs import check_inputs
from babelprobe.patching.settings import PairsSettings, TranslationSettings
from babelprobe.runs import LAYOUTS, check_kind, open_run, score_resumably
from babelprobe.runtime import Runtime, runner
from babelprobe.settings import settings_record
from babelprobe.tables import check_out_dir, read_table, write_table

MANIFEST = LAYOUTS["patch"].manifest
TRANSLATION_OUTPUTS = ("translation.csv", "translation_pairs.csv", "translation_summary.csv", "translation_switches.csv")
PAIRS_OUTPUTS = ("pairs.csv", "summary.csv", "onsets.csv")
OUTPUTS = (*TRANSLATION_OUTPUTS, *PAIRS_OUTPUTS, "figures")
FIGURES = {"translation": ("patch_translation",), "pairs": ("patch_recovery", "patch_vs_probe")}
CHUNK = 25  # pairs per resumable chunk
# Settings that change only the summaries, which are computed from the rows on every run: they are kept out
# of a protocol's stage record (patch.json "stages"), so that changing them reuses the rows.
SUMMARY_ONLY = ("n_boot", "min_gap")


@dataclass
class TranslationResult:
    rows: pd.DataFrame      # translation.csv
    pairs: pd.DataFrame     # translation_pairs.csv: concepts, prompts, token sets
    summary: pd.DataFrame   # translation_summary.csv
    switches: pd.DataFrame  # translation_switches.csv
    info: dict = field(default_factory=dict)     # per configuration: candidates looked at, prompts unusable
    figures: dict = field(default_factory=dict)  # name -> [pdf, png]


@dataclass
class PairsResult:
    rows: pd.DataFrame     # pairs.csv
    summary: pd.DataFrame  # summary.csv
    onsets: pd.DataFrame   # onsets.csv
    check: float           # max |unpatched copy − direct's score| of the bad items (should be ~1e-6)
    figures: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)  # one line per empty control (analysis.patching.empty_controls)


def patch_layers(spec: str, n_layers: int) -> list[int]:
    """The patched layers: block outputs 1..L (`all`), or those `spec` selects (extract/layers.py's grammar)."""
    from babelprobe.extract.layers import parse_layers

    if str(spec).strip().lower() == "all":
        return list(range(1, n_layers + 1))
    layers = parse_layers(spec, n_layers)
    if 0 in layers:
        raise BabelprobeError(f"--layers {spec!r}: layer 0 (the embeddings) is not a block output; patching writes "
                              f"block outputs 1..{n_layers}")
    return layers


def _check_out(out) -> Path:
    """OUT as a directory to write into, and not another command's run (`runs.check_kind`)."""
    if out is None:
        raise BabelprobeError("patching needs an output directory (--out)")
    out = check_out_dir(out)
    check_kind(out, "patch")
    return out


def _check_compare_items(compare, pairs: pd.DataFrame) -> None:
    """The compare directory was run on these items: every target pair is one of its pairs (its items.csv),
    so that its probe peaks are those of the pairs patched."""
    theirs = set(read_table(Path(compare) / "items.csv")["pair_id"].astype(str))
    missing = [p for p in pairs["pair_id"].astype(str) if p not in theirs]
    if missing:
        raise BabelprobeError(f"--compare {compare} was run on other items: {len(missing)} of the {len(pairs)} pairs "
                              f"patched are not among its pairs (e.g. {missing[0]}); give the compare directory of "
                              "these items, or leave --compare out")


def _open(out, lm, overwrite: bool):
    return open_run(out, {"fingerprint": lm.fingerprint}, record={"model": lm.name}, manifest=MANIFEST,
                    overwrite=overwrite, outputs=OUTPUTS, what="a patching run of another model")


def _rows_record(run, protocol: str, settings, output: Path, **extra) -> dict:
    """The settings that change this protocol's rows (its stage record; SUMMARY_ONLY left out and recorded
    under "summaries"). Says on stderr when the finished rows in OUT were made with other settings: they are
    about to be replaced (the other protocol's stay)."""
    record = {k: v for k, v in settings_record(settings).items() if k not in SUMMARY_ONLY}
    record = json.loads(json.dumps({**record, **extra}, default=str))
    run.state.setdefault("summaries", {})[protocol] = {k: v for k, v in settings_record(settings).items()
                                                       if k in SUMMARY_ONLY}
    old = run.state["stages"].get(protocol)
    if old is not None:  # a record written before SUMMARY_ONLY was left out compares without it
        old = run.state["stages"][protocol] = {k: v for k, v in old.items() if k not in SUMMARY_ONLY}
    if old is not None and old != record and output.exists():
        changed = [k for k in record if old.get(k) != record[k]]
        print(f"{run.path}: replacing the {protocol} results made with other settings ({', '.join(changed)}); the "
              f"other protocol's results stay", file=sys.stderr)
    return record


# ------------------------------------------------------------------------------------------ translation

@runner(TranslationSettings, old=("model", "concepts"))
def patch_translation(concepts="xcomps-sample", out: str | Path | None = None,
                      settings: TranslationSettings | None = None, runtime: Runtime | None = None, *,
                      padding_side: str = "left") -> TranslationResult:
    """The translation protocol (patching/translation.py: the paper's exp1 and exp2), written to `out`.

    `concepts`: "xcomps-sample", a file of `concept_id, language, word` rows or a DataFrame. `runtime`: the
    model (a spec is loaded once the inputs are checked, its layers against `--layers` first) and the
    running options (or `model=`, `load_options=`, `batch_tokens=`, ... as keywords). `settings` or the
    same values as keywords (`n_pairs=50`, `exps="exp1"`, ...)."""
    from babelprobe.analysis import patching as analysis
    from babelprobe.patching import translation

    if settings.preset == "paper" and isinstance(concepts, str) and concepts == "xcomps-sample":
        concepts = "dumas-concepts"  # the paper's languages (it, nl, fi, hi, et are not in xcomps-sample)
    out = _check_out(out)
    check_inputs(concepts=(concepts, "concepts"))
    where = str(concepts) if isinstance(concepts, (str, Path)) else "the concepts"
    words = translation.check_concepts(translation.load_concepts(concepts), settings, where)
    layers = patch_layers(settings.layers, runtime.info.n_layers)  # from the model's config: before it loads
    lm = runtime.lm
    prompts = translation.Prompts(words, settings.shots, settings.seed)
    plans = [translation.plan_pairs(lm, prompts, config, settings.n_pairs, settings.seed)
             for config in translation.configs(settings)]
    run = _open(out, lm, runtime.overwrite)
    record = _rows_record(run, "translation", settings, out / "translation.csv",
                          concepts=translation.concepts_digest(words), layers_run=layers)
    units = pd.concat([plan.pairs[["pair_idx"]].assign(plan=k, unit=[f"{k}:{i}" for i in plan.pairs["pair_idx"]])
                       for k, plan in enumerate(plans)], ignore_index=True)

    def chunk_rows(chunk: pd.DataFrame) -> pd.DataFrame:
        frames = []
        for k, part in chunk.groupby("plan", sort=True):
            plan = plans[int(k)]
            chosen = plan.pairs[plan.pairs["pair_idx"].isin(part["pair_idx"])].reset_index(drop=True)
            frames.append(translation.run_plan(lm, translation.Plan(plan.config, chosen, 0, 0), layers,
                                               runtime.batch_tokens, padding_side))
        return pd.concat(frames, ignore_index=True)

    def produce() -> pd.DataFrame:
        rows = score_resumably(chunk_rows, units, out / "translation.csv",
                               {"what": "patch translation", "fingerprint": lm.fingerprint, **record},
                               chunk_pairs=CHUNK, progress=runtime.progress, desc="patch translation", unit="unit",
                               model=lm)
        write_table(translation.pair_table(plans, lm), out / "translation_pairs.csv")
        return rows

    rows = run.stage("translation", record, produce, out / "translation.csv", read_table)
    result = TranslationResult(rows=rows, pairs=read_table(out / "translation_pairs.csv"),
                               summary=analysis.translation_summary(rows, settings.n_boot, settings.seed),
                               switches=pd.DataFrame(),
                               info={plan.config.name: {"exp": plan.config.exp, "candidates": plan.candidates,
                                                        "unusable_prompts": plan.unusable} for plan in plans})
    result.switches = analysis.translation_switches(result.summary)
    write_table(result.summary, out / "translation_summary.csv")
    write_table(result.switches, out / "translation_switches.csv")
    if runtime.figures:
        result.figures = analysis.translation_figures(result.summary, out / "figures")
    run.state["translation"] = result.info
    run.save()
    return result


# ------------------------------------------------------------------------------------------------ pairs

@runner(PairsSettings, old=("model", "items", "sources"))
def patch_pairs(items="xcomps-sample", out: str | Path | None = None, settings: PairsSettings | None = None,
                runtime: Runtime | None = None, *, compare: str | Path | None = None, languages=None,
                padding_side: str = "left") -> PairsResult:
    """The minimal-pair protocol (patching/pairs.py), written to `out`. `items`: a bundled set name, an
    item file or a DataFrame, with parallel_id, prefix and continuation (the sources' items included).
    `settings.sources`: the source languages ("en", "en,de"; `sources=` as a keyword). `languages`: the
    target languages (default: every language of the items). `compare`: a compare directory of these
    items whose probe peaks `onsets.csv` and the patch_vs_probe figure set the recovery against.
    `runtime`: the model and the running options, as `patch_translation`'s."""
    from babelprobe.analysis import patching as analysis
    from babelprobe.items import items_hash, load_items
    from babelprobe.patching.pairs import check_items, pair_rows

    out = _check_out(out)
    check_inputs(items=(items, "items"), compare=(compare, "compare"))
    items = load_items(items) if isinstance(items, (str, Path)) else items
    pairs = check_items(items, settings.sources)
    if languages:
        pairs = pairs[pairs["language"].isin(list(languages))].reset_index(drop=True)
    if compare is not None:
        _check_compare_items(compare, pairs)
    layers = patch_layers(settings.layers, runtime.info.n_layers)  # from the model's config: before it loads
    lm = runtime.lm
    run = _open(out, lm, runtime.overwrite)
    record = _rows_record(run, "pairs", settings, out / "pairs.csv", items_hash=items_hash(items), layers_run=layers)
    targets = items[items["pair_id"].isin(pairs["pair_id"]) & items["label"].isin([0, 1])]

    def chunk_rows(chunk: pd.DataFrame) -> pd.DataFrame:
        chosen = pairs[pairs["pair_id"].isin(chunk["pair_id"])]
        return pair_rows(lm, items, chosen, settings.sources, layers, settings.controls, settings.seed,
                         runtime.batch_tokens, padding_side)

    def produce() -> pd.DataFrame:
        return score_resumably(chunk_rows, targets, out / "pairs.csv",
                               {"what": "patch pairs", "fingerprint": lm.fingerprint, **record},
                               chunk_pairs=CHUNK, progress=runtime.progress, desc="patch pairs", model=lm)

    rows = run.stage("pairs", record, produce, out / "pairs.csv", read_table)
    summary = analysis.pairs_summary(rows, settings.min_gap, settings.n_boot, settings.seed)
    peaks = analysis.probe_peaks(compare, settings.n_boot, settings.seed) if compare is not None else None
    result = PairsResult(rows=rows, summary=summary, onsets=analysis.recovery_onsets(summary, peaks),
                         check=float((rows["s_unpatched"] - rows["s_bad"]).abs().max()) if len(rows) else float("nan"),
                         notes=analysis.empty_controls(rows, summary))
    write_table(result.summary, out / "summary.csv")
    write_table(result.onsets, out / "onsets.csv")
    if runtime.figures:
        result.figures = analysis.pairs_figures(result.summary, result.onsets, out / "figures")
    run.state["compare"] = str(Path(compare).resolve()) if compare is not None else None
    run.state["pairs_check"] = {"max_abs_unpatched_minus_direct": result.check,
                                "what": "the bad item's score from the patch runs' own unpatched copy against "
                                "score_direct(conditional=True)"}
    run.save()
    return result
