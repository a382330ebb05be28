"""Any lm-evaluation-harness multiple-choice task, scored as the harness scores it (`babelprobe bench lm-eval
--tasks TASK[,TASK...] [--include-path DIR]`, or `--items lm-eval:TASK[,TASK...][@DIR]`).

The harness's own task objects make the items (`babelprobe.lmeval`: one item per option of every document);
the scoring and the per-question rows are the bridges' (`bridges.core`: LL_i = Σ log p(delimiter + choice_i |
context) by babelprobe's log-prob core, acc, acc_norm, acc_bytes as `process_results` computes them). The four
hand-written bridges are presets of this path: their releases read into the same questions, scored and
summarised by the same code.

**Rows** (items.csv) are the bridges' with the harness's names: `task`, `task_version`, `doc_id`, `split`,
`harness_metrics` (the task's metric_list) and `harness_groups` (JSON: each group the task was reached through,
with its aggregate metrics and whether they weigh tasks by size). **Summary**: the bridges' per language ×
task (`subset` is the task) and per language over its tasks, and the harness's own results by the names its
results file uses: `acc,none`, `acc_norm,none`, `acc_bytes,none` per task (the metrics of its metric_list that
babelprobe computes; `stderr` is the harness's `acc_stderr,none`, the sample standard deviation over √n) and
per group (`language` = all, `subset` = the group: `aggregate_subtask_metrics` over its tasks, weighted by their
document counts where the group says `weight_by_size`, lm_eval/api/metrics.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from babelprobe.benchmarks.bridges.settings import Settings, answerer
from babelprobe.errors import BabelprobeError
from babelprobe.inputs import check_input
from babelprobe.runtime import Runtime, runner

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NAME", "TITLE", "Settings", "load", "run", "summarize", "format_summary", "answerer", "convert",
           "harness_rows", "task_table"]

NAME = "lm-eval"
TITLE = "lm-evaluation-harness: any multiple-choice task, scored as the harness scores it"
HARNESS_SUFFIX = ",none"  # the harness's filter name of a multiple-choice metric ("acc,none")


def load(source: str | Path = "lm-eval-sample", languages: list[str] | None = None,
         limit: int | None = None) -> pd.DataFrame:
    """The benchmark contract's loader: `source` is `lm-eval:TASK[,TASK...][@DIR]`, a bare `TASK[,...][@DIR]`
    or the bundled sample; `languages` keeps tasks by language; `limit` the first N documents per task."""
    from babelprobe import lmeval

    source = str(source)
    return lmeval.load(source if lmeval.is_source(source) else lmeval.PREFIX + source, languages=languages,
                       limit=limit)


def convert(source: str, out: str | Path | None = None, languages: list[str] | None = None,
            limit: int | None = None, language: str | None = None, overwrite: bool = False) -> pd.DataFrame:
    """Harness tasks as items (`babelprobe items from-lm-eval TASKS --out F`), written to `out` (.jsonl, .json,
    .csv, .parquet) when given. The output is checked before the harness is asked anything, and an existing
    file is kept unless `overwrite`; nothing is written when a task cannot be read."""
    from babelprobe.items import load_items, write_items
    from babelprobe.tables import check_output

    if out is not None:
        check_output(out, (".jsonl", ".json", ".csv", ".parquet"))
        if Path(out).exists() and not overwrite:
            raise BabelprobeError(f"{out} exists; pass --overwrite to replace it")
    check_input("source", source, "lm-eval")
    items = load_items(source, languages=languages, limit=limit, language=language)
    if out is not None:
        write_items(items, out)
    return items


@runner(Settings, old=("items", "model", "settings", "out", "progress"), renamed={"data": "items", "models": "model"})
def run(items: pd.DataFrame | str, out: Path | None = None, settings: Settings | None = None,
        runtime: Runtime | None = None) -> pd.DataFrame:
    """The bridges' run (every question, resumable in `out`), each row given its task's groups: `items` what
    `load` read (or a source it reads), `runtime` the model (a `Runtime` or the benchmarks' `Models`; its
    options as keywords) and `progress`. The benchmark contract's `run(data, models, settings, out, progress)`
    (how `run_benchmark` calls every benchmark) is the older form of the same call."""
    from babelprobe.benchmarks import bridges

    if isinstance(items, (str, Path)):
        check_input("items", items, "lm-eval")
        items = load(items)
    data = items
    rows = bridges.run(NAME, data, runtime, settings, out, runtime.progress)
    groups = data.attrs.get("harness", {}).get("groups", {})
    member = {task: {name: group["aggregate"] for name, group in groups.items() if task in group.get("tasks", ())}
              for task in rows["task"].unique()}
    rows["harness_groups"] = rows["task"].map(lambda task: json.dumps(member.get(task, {}), sort_keys=True))
    return rows


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """The bridges' summary, then the harness's own results (module docstring)."""
    import pandas as pd

    from babelprobe.benchmarks import bridges

    return pd.concat([bridges.summarize(rows), harness_rows(rows)], ignore_index=True)


def harness_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The harness's results by its names: per task its metric_list's metrics babelprobe computes, per group
    its aggregate (module docstring)."""
    import numpy as np
    import pandas as pd

    from babelprobe.benchmarks.base import metric_row
    from babelprobe.lmeval import SCORED_METRICS

    out, per_task = [], {}
    for task, group in rows.groupby("task", sort=True):
        listed = [m for m in str(group["harness_metrics"].iloc[0] or "").split(",") if m in SCORED_METRICS]
        values = {m: group[m].astype(float).to_numpy() for m in listed}
        per_task[task] = (len(group), {m: float(v.mean()) for m, v in values.items()})
        where = {"language": group["language"].iloc[0], "subset": task, "script": group["script"].iloc[0]}
        for metric, v in values.items():
            stderr = float(np.std(v, ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")
            out.append(metric_row(where, metric + HARNESS_SUFFIX, v.mean(), n=len(v), interval="harness: mean",
                                  stderr=stderr))
    aggregates: dict[str, dict] = {}
    for task, text in rows.drop_duplicates("task")[["task", "harness_groups"]].itertuples(index=False):
        for name, metrics in json.loads(text or "{}").items():
            aggregates.setdefault(name, {"metrics": metrics, "tasks": []})["tasks"].append(task)
    for name, group in sorted(aggregates.items()):
        for spec in group["metrics"]:
            metric, weighted = spec["metric"], spec["weight_by_size"]
            have = [t for t in group["tasks"] if metric in per_task[t][1]]
            if not have:
                continue
            sizes = np.array([per_task[t][0] if weighted else 1 for t in have], float)
            value = float(np.dot([per_task[t][1][metric] for t in have], sizes) / sizes.sum())
            how = "weighted by size" if weighted else "unweighted"
            out.append(metric_row({"language": "all", "subset": name, "script": ""}, metric + HARNESS_SUFFIX, value,
                                  n=sum(per_task[t][0] for t in have),
                                  interval=f"harness: group mean over {len(have)} tasks, {how}", stderr=float("nan")))
    frame = pd.DataFrame(out)
    if len(frame):
        frame["method"], frame["note"] = "likelihood", ""
    return frame


def task_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per language × task (the bridges' cells, the harness's rows left out), for printing and the
    figure: `base.wide`'s columns and `label` (task and language)."""
    from babelprobe.benchmarks.base import wide

    cells = summary[(summary["metric"] != "records_skipped") & ~summary["metric"].str.contains(",", regex=False)
                    & (summary["subset"] != "all")]
    table = wide(cells.sort_values(["subset", "language"], kind="stable"), ["language", "subset", "script"])
    return table.assign(n=table["acc_n"], label=table["subset"] + "\n(" + table["language"] + ")")


def format_summary(summary: pd.DataFrame) -> str:
    """Per task: language, n, acc, acc_norm, acc_bytes, correct; then the harness's names and group aggregates."""
    table = task_table(summary).rename(columns={"subset": "task"})
    columns = ["task", "language", "script", "n", "acc", "acc_norm", "acc_bytes", "correct", "norm_disagree"]
    parts = [table[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}")]
    harness = summary[summary["metric"].str.contains(",", regex=False)]
    if len(harness):
        lines = [f"  {r.subset} {r.metric} {r.value:.4f} (n={int(r.n)}; {r.interval.removeprefix('harness: ')})"
                 for r in harness.itertuples()]
        parts.append("as the harness reports them:\n" + "\n".join(lines))
    skipped = summary[(summary["metric"] == "records_skipped") & (summary["value"] > 0)]
    if len(skipped):
        parts.append("documents skipped (cannot be scored): " + ", ".join(
            f"{r.language} {int(r.value)} of {int(r.n)}" for r in skipped.itertuples()))
    return "\n".join(parts)
