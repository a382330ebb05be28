"""StingrayBench (Cahyawijaya et al., Findings of NAACL 2025): can a model tell which language's sense
of a false friend fits a sentence, and does it lean towards one language of the pair?

**Data.** `load_stingray(source)` reads the public records (hub `StingrayBench/StingrayBench`, configs
`en_de`, `id_ms`, `id_tl`, `zh_ja` with false friends and `<pair>_common` with true cognates) from
local .jsonl/.json/.csv/.parquet files named after their config, from the hub when online
(`hf:StingrayBench/StingrayBench`), or the bundled `stingray-sample` (our own sentences, en_de and
zh_ja). One row per word: the same sentence in L1 and L2 using the word; for a false friend exactly
one is appropriate (`semantic_appropriate_label` 0 → A = L1, 1 → B = L2), for a true cognate both
(2 → C); `usage_correctness_lang{1,2}_answer` says whether the word is used correctly in each.

**Tasks** (the paper's likelihood evaluation, prompts in data/prompts/stingray.json): semantic
appropriateness — "Which sentence is more semantically appropriate? … A.<L1> B.<L2> C.Both." with
the labels " A", " B", " C" scored as continuations of "\\nAnswer:"; usage correction — "Is the usage
of <word> in this sentence correct? …" with " Yes"/" No", once per language. The highest-scoring
label is the model's answer (`choices.option_scores`).

**Metrics** (per language pair, separately for false friends and true cognates, per task): accuracy
in L1 and in L2 (semantic: items whose appropriate sentence is in that language; usage: the sentences
in that language). The point (acc L1, acc L2) gives
    cognate bias          = (atan2(acc L2, acc L1) − π/4) / (π/4)   ∈ [−1, 1], −1 = all towards L1;
    cognate comprehension = √(acc L1² + acc L2²) / √2              ∈ [0, 1].
True cognates in the semantic task have one answer (C) for both languages, so only their accuracy
is reported. Intervals: Wilson for accuracies, percentile bootstrap (items resampled within each
language) for bias and comprehension.

**Rows** (`score_stingray`): one per question, with `pair_id` (the word's record), `language` (ISO
code of the language asked about; `l1-l2` for the semantic question on a true cognate, which is about
both), `subset` (false_friend / true_cognate), `method` ('likelihood'), `task`, `side` (L1/L2/both),
the gold and predicted labels, `correct` and the label scores.

**Figure.** The stingray plot: the (acc L1, acc L2) points over the bias field (angular contours
around the 45° line) and comprehension arcs (radial contours), one panel per task.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.analysis.summary import wilson
from babelprobe.benchmarks.choices import option_scores
from babelprobe.benchmarks.direct import REDUCTIONS
from babelprobe.errors import BabelprobeError
from babelprobe.items import DATA, READERS, iso_codes, read_records
from babelprobe.models import LoadedModel, load_model

HUB_ID = "StingrayBench/StingrayBench"
PAIRS = ("en_de", "id_ms", "id_tl", "zh_ja")
BUNDLED = {"stingray-sample": "stingray_sample"}
SUBSETS = {"": "false_friend", "_common": "true_cognate"}
TASKS = ("semantic", "usage")
PROMPT_KEYS = ("semantic", "usage_l1", "usage_l2")
REQUIRED = ("word", "lang1_sentence", "lang2_sentence", "usage_correctness_lang1_answer",
            "usage_correctness_lang2_answer")
OPTIONAL = ("lang_en_sentence", "language_flag", "meaning_l1", "meaning_l2")
SEMANTIC_LABELS = {"0": "A", "1": "B", "2": "C", "a": "A", "b": "B", "c": "C",
                   "l1": "A", "l2": "B", "both": "C"}
CONFIG_NAME = re.compile(r"^([a-z]{2})_([a-z]{2})(_common)?$")
BOOTSTRAP = 1000


# ------------------------------------------------------------------------------------------------ data

def load_stingray(source: str | Path = "stingray-sample", pairs: list[str] | None = None,
                  limit: int | None = None) -> pd.DataFrame:
    """StingrayBench records, one row per word: `record_id`, `pair` (en_de), `l1`, `l2` (ISO codes),
    `subset` (false_friend / true_cognate), `word_l1`, `word_l2`, both sentences, `semantic_answer`
    (A/B/C), `usage_l1`/`usage_l2` (Yes/No) and the optional public fields. `pairs` keeps some
    language pairs; `limit` keeps the first N words per pair × subset."""
    frames = [_normalise(frame, config) for config, frame in _read_configs(str(source))]
    records = pd.concat(frames, ignore_index=True)
    if pairs:
        wanted = [p.replace("-", "_") for p in pairs]
        unknown = sorted(set(wanted) - set(records["pair"]))
        if unknown:
            raise BabelprobeError(f"{source}: no language pair {', '.join(unknown)}; available: "
                                  f"{', '.join(sorted(set(records['pair'])))}")
        records = records[records["pair"].isin(wanted)]
    if limit is not None:
        records = records.groupby(["pair", "subset"], sort=False).head(limit)
    return records.reset_index(drop=True)


def _read_configs(source: str) -> list[tuple[str, pd.DataFrame]]:
    """(config name, raw records) for every config found in `source`."""
    if source in BUNDLED:
        return _read_local(Path(str(DATA / BUNDLED[source])))
    if source in (HUB_ID, f"hf:{HUB_ID}") or source.startswith("hf:"):
        return _read_hub(source.removeprefix("hf:"))
    path = Path(source).expanduser()
    if not path.exists():
        raise BabelprobeError(f"StingrayBench source {source!r} is neither a bundled set ({', '.join(BUNDLED)}), "
                              f"a file, a directory nor hf:{HUB_ID}")
    return _read_local(path)


def _read_local(path: Path) -> list[tuple[str, pd.DataFrame]]:
    files = sorted(p for p in path.iterdir() if p.suffix in READERS) if path.is_dir() else [path]
    if not files:
        raise BabelprobeError(f"directory {path} has no .jsonl, .json, .csv or .parquet files")
    configs = []
    for file in files:
        frame = read_records(file)
        if "config" in frame.columns:  # one file holding several configs
            configs += [(str(name), part.drop(columns="config")) for name, part in frame.groupby("config", sort=False)]
        elif _config_of(file.stem):
            configs.append((_config_of(file.stem), frame))
        else:
            raise BabelprobeError(f"{file}: cannot tell the StingrayBench config; name the file after it "
                                  f"(en_de.jsonl, en_de_common.jsonl, ...) or add a 'config' field")
    return configs


def _config_of(stem: str) -> str | None:
    """'en_de', 'zh_ja_common', also 'stingray-en_de_common' or 'en_de_common-test' -> the config name."""
    match = re.search(r"(?:^|[^a-z])([a-z]{2}_[a-z]{2}(?:_common)?)(?:$|[^a-z])", stem.lower())
    return match.group(1) if match else None


def _read_hub(name: str) -> list[tuple[str, pd.DataFrame]]:
    try:
        import datasets

        configs = []
        for pair in PAIRS:
            for suffix in SUBSETS:
                split = datasets.load_dataset(name, pair + suffix, split="test")
                frame = split.to_pandas()
                configs.append((pair + suffix, frame.assign(
                    _source=[f"hf:{name}[{pair + suffix}] row {i + 1}" for i in range(len(frame))])))
        return configs
    except Exception as err:  # offline, renamed dataset, missing config: all user-facing
        raise BabelprobeError(f"cannot load hub dataset {name!r} ({str(err).splitlines()[0]}); when offline, "
                              "download its files and pass their directory to --data") from err


def _normalise(frame: pd.DataFrame, config: str) -> pd.DataFrame:
    """Check one config's records and bring them to the row format of `load_stingray`."""
    match = CONFIG_NAME.match(config)
    where = frame["_source"].iloc[0].rsplit(":", 1)[0] if "_source" in frame.columns and len(frame) else config
    if not match:
        raise BabelprobeError(f"{where}: unknown StingrayBench config {config!r}; use <l1>_<l2> or "
                              f"<l1>_<l2>_common with ISO 639-1 codes (e.g. {', '.join(PAIRS)})")
    l1, l2, common = match.groups()
    for code in (l1, l2):
        if code not in iso_codes():
            raise BabelprobeError(f"{where}: config {config!r}: {code!r} is not an ISO 639-1 language code")
    subset = SUBSETS[common or ""]
    for field in REQUIRED:
        if field not in frame.columns:
            raise BabelprobeError(f"{where}: missing field {field!r}")
    rows = []
    for i, record in enumerate(frame.to_dict("records")):
        at = record.get("_source", f"{config} record {i + 1}")
        for field in REQUIRED:
            if _missing(record.get(field)):
                raise BabelprobeError(f"{at}: missing field {field!r}")
        word_l1, word_l2 = _words(str(record["word"]), subset)
        rows.append({
            "record_id": f"{config}-{i + 1:03d}", "pair": f"{l1}_{l2}", "l1": l1, "l2": l2, "subset": subset,
            "word": str(record["word"]), "word_l1": word_l1, "word_l2": word_l2,
            "lang1_sentence": str(record["lang1_sentence"]), "lang2_sentence": str(record["lang2_sentence"]),
            "semantic_answer": _semantic_answer(record, subset, at),
            "usage_l1": _yes_no(record["usage_correctness_lang1_answer"], "usage_correctness_lang1_answer", at),
            "usage_l2": _yes_no(record["usage_correctness_lang2_answer"], "usage_correctness_lang2_answer", at),
            **{field: None if _missing(record.get(field)) else str(record[field]) for field in OPTIONAL},
            "_source": at,
        })
    return pd.DataFrame(rows)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value).strip() == ""


def _words(word: str, subset: str) -> tuple[str, str]:
    """True-cognate records give 'L1 word, L2 word'; a false friend is one word in both languages."""
    if subset == "true_cognate" and "," in word:
        first, second = (w.strip() for w in word.split(",", 1))
        return first, second
    return word.strip(), word.strip()


def _semantic_answer(record: dict, subset: str, at: str) -> str:
    for field in ("semantic_appropriate_label", "semantic_appropriate_answer"):
        value = record.get(field)
        if not _missing(value):
            key = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value).strip().lower()
            if key not in SEMANTIC_LABELS:
                raise BabelprobeError(f"{at}: {field} is {value!r}; expected 0/1/2 (A/B/C) or L1/L2/Both")
            answer = SEMANTIC_LABELS[key]
            if (answer == "C") != (subset == "true_cognate"):
                kind = "true cognate" if subset == "true_cognate" else "false friend"
                raise BabelprobeError(f"{at}: {field} is {value!r}, but a {kind} has "
                                      f"{'both sentences' if answer != 'C' else 'exactly one sentence'} appropriate")
            return answer
    if subset == "true_cognate":
        return "C"  # a true cognate fits both sentences by definition
    raise BabelprobeError(f"{at}: missing field 'semantic_appropriate_label'")


def _yes_no(value, field: str, at: str) -> str:
    text = str(value).strip().lower()
    if text not in ("yes", "no"):
        raise BabelprobeError(f"{at}: {field} is {value!r}; expected Yes or No")
    return text.capitalize()


# --------------------------------------------------------------------------------------------- prompts

def load_prompts(path: str | Path | None = None) -> dict:
    """The prompt set: {task: {"template": str, "options": [...]}} for semantic, usage_l1, usage_l2.
    Usage options are [yes, no] in that order; semantic options are [A, B, C]."""
    path = Path(path) if path else Path(str(DATA / "prompts" / "stingray.json"))
    try:
        prompts = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BabelprobeError(f"{path}: cannot read the StingrayBench prompt set ({err})") from err
    for key, n_options in zip(PROMPT_KEYS, (3, 2, 2), strict=True):
        task = prompts.get(key)
        if not isinstance(task, dict) or "template" not in task or len(task.get("options", [])) != n_options:
            raise BabelprobeError(f"{path}: '{key}' needs a 'template' and {n_options} 'options'")
    return prompts


def build_requests(records: pd.DataFrame, prompts: dict | None = None,
                   tasks: tuple[str, ...] = TASKS) -> pd.DataFrame:
    """One row per record × question: the prompt, its answer options, the gold option and which
    language (side) the question is about."""
    prompts = prompts or load_prompts()
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise BabelprobeError(f"unknown StingrayBench task {', '.join(unknown)}; use {', '.join(TASKS)}")
    rows = []
    for record in records.to_dict("records"):
        fields = {k: record[k] for k in ("word", "word_l1", "word_l2", "lang1_sentence", "lang2_sentence")}
        if "semantic" in tasks:
            answer = record["semantic_answer"]
            side = {"A": "L1", "B": "L2", "C": "both"}[answer]
            rows.append(_request(record, "semantic", side, prompts["semantic"], fields, "ABC".index(answer)))
        if "usage" in tasks:
            for side in ("L1", "L2"):
                gold = 0 if record[f"usage_{side.lower()}"] == "Yes" else 1
                rows.append(_request(record, "usage", side, prompts[f"usage_{side.lower()}"], fields, gold))
    return pd.DataFrame(rows)


def _request(record: dict, task: str, side: str, prompt: dict, fields: dict, gold: int) -> dict:
    language = {"L1": record["l1"], "L2": record["l2"], "both": f"{record['l1']}-{record['l2']}"}[side]
    return {"item_id": f"{record['record_id']}-{task}" + ("" if task == "semantic" else f"-{side.lower()}"),
            "pair_id": record["record_id"], "language": language, "subset": record["subset"],
            "pair": record["pair"], "task": task, "side": side, "word": record["word"],
            "prompt": prompt["template"].format(**fields), "options": list(prompt["options"]), "gold": gold}


# --------------------------------------------------------------------------------------------- scoring

def score_stingray(model: LoadedModel | str, records: pd.DataFrame | str = "stingray-sample",
                   tasks: tuple[str, ...] = TASKS, reduction: str = "sum", prompts: dict | None = None,
                   batch_tokens: int = 4096, progress: bool = True) -> pd.DataFrame:
    """Ask every question of `records` by likelihood; one row per question with the option scores, the
    chosen and gold labels and `correct` (DESIGN.md results conventions, method 'likelihood')."""
    if reduction not in REDUCTIONS:
        raise BabelprobeError(f"unknown reduction {reduction!r}; use one of {', '.join(REDUCTIONS)}")
    records = load_stingray(records) if isinstance(records, (str, Path)) else records
    lm = load_model(model) if isinstance(model, str) else model
    requests = build_requests(records, prompts, tasks)
    scores = option_scores(lm, requests["prompt"].tolist(), requests["options"].tolist(), reduction=reduction,
                           share_prefix=True, batch_tokens=batch_tokens, progress=progress)
    chosen = [int(np.argmax(s)) for s in scores]
    rows = requests.drop(columns=["options"])
    rows.insert(4, "method", "likelihood")
    rows["gold"] = [o[g].strip() for o, g in zip(requests["options"], requests["gold"], strict=True)]
    rows["predicted"] = [o[c].strip() for o, c in zip(requests["options"], chosen, strict=True)]
    rows["correct"] = rows["gold"] == rows["predicted"]
    rows["scores"] = [json.dumps([round(float(x), 6) for x in s]) for s in scores]
    rows["options"] = [json.dumps([o.strip() for o in opts], ensure_ascii=False) for opts in requests["options"]]
    rows["reduction"] = reduction
    rows["model"] = lm.name
    rows["fingerprint"] = lm.fingerprint
    return rows


# --------------------------------------------------------------------------------------------- metrics

def cognate_bias(acc_l1, acc_l2):
    """Signed angle of (acc L1, acc L2) from the 45° line, scaled from [−π/4, π/4] to [−1, 1]:
    −1 = right only in L1 (biased towards L1), +1 = only in L2, 0 = balanced; NaN at (0, 0)."""
    a1, a2 = np.asarray(acc_l1, float), np.asarray(acc_l2, float)
    with np.errstate(invalid="ignore"):
        bias = (np.arctan2(a2, a1) - np.pi / 4) / (np.pi / 4)
    return np.where((a1 == 0) & (a2 == 0), np.nan, bias)


def cognate_comprehension(acc_l1, acc_l2):
    """Length of the (acc L1, acc L2) point divided by √2: 1 = right in both languages, 0 = in neither."""
    return np.hypot(np.asarray(acc_l1, float), np.asarray(acc_l2, float)) / np.sqrt(2)


def stingray_summary(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """One row per language pair × subset × task: accuracy overall and in each language (Wilson 95%),
    cognate bias and comprehension (bootstrap 95%)."""
    out = []
    for (pair, subset, task), group in rows.groupby(["pair", "subset", "task"], sort=True):
        row = {"pair": pair, "subset": subset, "task": task, **_accuracy(group["correct"], "")}
        sides = [group.loc[group["side"] == s, "correct"].to_numpy(bool) for s in ("L1", "L2")]
        for name, values in zip(("l1", "l2"), sides, strict=True):
            row.update(_accuracy(values, f"_{name}"))
        row["bias"] = float(cognate_bias(row["accuracy_l1"], row["accuracy_l2"]))
        row["comprehension"] = float(cognate_comprehension(row["accuracy_l1"], row["accuracy_l2"]))
        row.update(_bootstrap(*sides, seed=seed))
        out.append(row)
    return pd.DataFrame(out)


def _accuracy(correct, suffix: str) -> dict:
    correct = np.asarray(correct, bool)
    n, k = len(correct), int(correct.sum())
    low, high = wilson(k, n) if n else (np.nan, np.nan)
    return {f"n{suffix}": n, f"accuracy{suffix}": k / n if n else np.nan,
            f"ci_low{suffix}": float(low), f"ci_high{suffix}": float(high)}


def _bootstrap(l1: np.ndarray, l2: np.ndarray, seed: int) -> dict:
    """Percentile intervals of bias and comprehension, resampling items within each language."""
    keys = ("bias_ci_low", "bias_ci_high", "comprehension_ci_low", "comprehension_ci_high")
    if len(l1) == 0 or len(l2) == 0:
        return dict.fromkeys(keys, np.nan)
    rng = np.random.default_rng(seed)
    a1 = rng.choice(l1, size=(BOOTSTRAP, len(l1))).mean(axis=1)
    a2 = rng.choice(l2, size=(BOOTSTRAP, len(l2))).mean(axis=1)
    bias, comprehension = cognate_bias(a1, a2), cognate_comprehension(a1, a2)
    bias = bias[~np.isnan(bias)]  # resamples at (0, 0) have no direction
    bias_ci = np.percentile(bias, [2.5, 97.5]) if len(bias) else (np.nan, np.nan)
    return dict(zip(keys, (*bias_ci, *np.percentile(comprehension, [2.5, 97.5])), strict=True))


def format_summary(summary: pd.DataFrame) -> str:
    columns = ["pair", "subset", "task", "n", "accuracy", "accuracy_l1", "accuracy_l2", "bias", "comprehension"]
    return summary[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="—")


# ---------------------------------------------------------------------------------------------- figure

def plot_stingray(summary: pd.DataFrame, path: str | Path, title: str | None = None) -> list[Path]:
    """The stingray plot: one panel per task with each pair × subset at (acc L1, acc L2) over the
    cognate-bias field and comprehension arcs. Writes path.pdf and path.png."""
    from babelprobe.analysis.style import PALETTE, figure, save

    tasks = [t for t in TASKS if t in set(summary["task"])]
    fig, axes = figure("two", height=3.6, ncols=len(tasks), squeeze=False)
    pairs = sorted(set(summary["pair"]))
    colours = dict(zip(pairs, PALETTE, strict=False))
    markers = {"false_friend": "o", "true_cognate": "s"}
    field = None
    for ax, task in zip(axes[0], tasks, strict=True):
        field = _stingray_background(ax)
        points = summary[(summary["task"] == task) & summary["bias"].notna()]
        for row in points.to_dict("records"):
            ax.errorbar(row["accuracy_l1"], row["accuracy_l2"], fmt=markers[row["subset"]], ms=6,
                        color=colours[row["pair"]], mec="black", mew=0.6, zorder=4,
                        xerr=_error_bar(row, "l1"), yerr=_error_bar(row, "l2"),
                        elinewidth=0.6, capsize=0, alpha=0.95)
        ax.set_title({"semantic": "semantic appropriateness", "usage": "usage correction"}[task])
        ax.set_xlabel("accuracy in L1")
        ax.set_ylabel("accuracy in L2")
    handles = [_legend_handle(marker="o", color=colours[p], label=p.replace("_", "–")) for p in pairs]
    handles += [_legend_handle(marker=m, color="white", label=s.replace("_", " ")) for s, m in markers.items()]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
    bar = fig.colorbar(field, ax=axes[0].tolist(), shrink=0.85, ticks=[-1, -0.5, 0, 0.5, 1])
    bar.set_label("cognate bias (− towards L1, + towards L2)")
    if title:
        fig.suptitle(title)
    return save(fig, path)


def _error_bar(row: dict, side: str) -> list[list[float]]:
    """[[below], [above]] the accuracy in one language: its Wilson interval (clipped at rounding noise)."""
    acc = row[f"accuracy_{side}"]
    return [[max(0.0, acc - row[f"ci_low_{side}"])], [max(0.0, row[f"ci_high_{side}"] - acc)]]


def _stingray_background(ax):
    """Bias as a colour field (constant along rays from the origin), the 45° line and bias rays, and
    comprehension arcs (quarter circles of radius c·√2)."""
    from babelprobe.analysis.style import DIVERGING

    grid = np.linspace(0, 1, 201)
    x, y = np.meshgrid(grid, grid)
    field = ax.contourf(x, y, cognate_bias(x, y), levels=np.linspace(-1, 1, 17), cmap=DIVERGING, alpha=0.45,
                        zorder=0)
    angles = np.linspace(0, np.pi / 2, 100)
    for c in (0.25, 0.5, 0.75):  # comprehension 1 is only the corner (1, 1)
        r = c * np.sqrt(2)
        keep = (r * np.cos(angles) <= 1.0001) & (r * np.sin(angles) <= 1.0001)
        ax.plot(r * np.cos(angles[keep]), r * np.sin(angles[keep]), color="0.35", lw=0.6, ls="--", zorder=1)
        # label near the L1 axis, away from the diagonal where balanced models sit
        label_angle = max(np.radians(10), np.arccos(min(1.0, 1 / r)) + np.radians(5))
        ax.text(r * np.cos(label_angle), r * np.sin(label_angle), f"{c:.2f}", fontsize=6, color="0.25",
                ha="center", va="center", zorder=2, bbox={"fc": "white", "ec": "none", "pad": 0.5, "alpha": 0.7})
    for b in (-0.5, 0.5):
        theta = np.pi / 4 * (1 + b)
        ax.plot([0, min(1, 1 / np.tan(theta))], [0, min(1, np.tan(theta))], color="0.5", lw=0.5, zorder=1)
    ax.plot([0, 1], [0, 1], color="0.2", lw=0.8, zorder=1)
    ax.set_xlim(-0.04, 1.04)
    ax.set_ylim(-0.04, 1.04)
    ax.set_aspect("equal")
    ax.grid(False)
    return field


def _legend_handle(marker: str, color: str, label: str):
    from matplotlib.lines import Line2D

    return Line2D([], [], marker=marker, ls="", color=color, mec="black", mew=0.6, ms=6, label=label)


# ------------------------------------------------------------------------------------------------- CLI

def add_arguments(parser) -> None:
    from babelprobe.cli.common import comma_list

    group = parser.add_argument_group("StingrayBench")
    group.add_argument("--tasks", type=comma_list, default=list(TASKS), metavar="LIST",
                       help="semantic, usage (default both)")
    group.add_argument("--reduction", choices=REDUCTIONS, default="sum",
                       help="how an answer label's token log-probs are combined (default sum)")
    group.add_argument("--prompts", metavar="FILE",
                       help="prompt set JSON (default: the paper's, data/prompts/stingray.json)")
    group.add_argument("--batch-tokens", type=int, default=4096, metavar="N", help="token budget per batch")
    group.add_argument("--overwrite", action="store_true", help="replace a run of another model in --out")


def run_cli(args) -> int:
    from babelprobe.analysis.style import save  # noqa: F401  (fail early if matplotlib is missing)
    from babelprobe.benchmarks.rundir import open_run_dir, write_results, written
    from babelprobe.cli.common import model_from

    records = load_stingray(args.data, pairs=args.langs, limit=args.limit)
    prompts = load_prompts(args.prompts)
    lm = model_from(args)
    manifest = {"benchmark": "stingray", "model": lm.name, "fingerprint": lm.fingerprint, "data": str(args.data),
                "tasks": args.tasks, "reduction": args.reduction, "prompts": args.prompts or "paper"}
    out, _ = open_run_dir(args.out, manifest, overwrite=args.overwrite)
    rows = score_stingray(lm, records, tasks=tuple(args.tasks), reduction=args.reduction, prompts=prompts,
                          batch_tokens=args.batch_tokens, progress=not args.no_progress)
    summary = stingray_summary(rows)
    write_results(out, rows, summary)
    figures = plot_stingray(summary, out / "stingray", title=f"StingrayBench — {lm.name}")
    print(f"StingrayBench ({args.data}), {lm.name}, likelihood ({args.reduction}):")
    print(format_summary(summary))
    print(written(out, rows, figures))
    return 0
