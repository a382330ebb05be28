"""One scoring phase on the simulated device, its pipeline's steps timed: where a run's wall time goes beyond the
device's.

perf/workflow.py gives each phase's wall, host and device seconds. This runs one scorer alone (meta, or direct
scoring without a store) through `runs.score_resumably` on perf/simulated.py's stand-in, chunked and pipelined as
compare runs it, and times each chunk's three steps (`pipeline.pipelined`): its preparation (the producer
thread), its run (the thread that drives the device; the device's seconds in it) and its finishing (the finishing
thread), each with its thread's CPU seconds (the tokenizer's own threads count in the run's host total only); then
when the device began after the run's start and how long the run went on after the device's last pass (the last
chunk finished, the table written). To compare two versions of
babelprobe, run it in each tree (`git archive REV babelprobe perf`), alternating.

    OMP_NUM_THREADS=1 .venv/bin/python perf/stages.py --pairs 135 --tokenizer .gpu/tokenizer
    OMP_NUM_THREADS=1 .venv/bin/python perf/stages.py --scorer direct --pairs quarter --repeat 1 --tokenizer .gpu/tokenizer
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from workflow import (  # noqa: E402
    SHAPES,
    XCOMPS_LANGUAGES,
    build_model,
    meta_texts,
    pair_count,
    simulate_gpu_batching,
    synthetic_items,
    warm_up,
)

from babelprobe.runs import score_resumably  # noqa: E402


@dataclass
class Step:
    name: str  # prepare, run or finish
    chunk: int
    start: float  # seconds after the run's start
    end: float
    cpu: float  # the step's thread's CPU seconds
    device: float  # the simulated device's seconds charged during it


class Timeline:
    """The steps of one run, as `timed` scorers record them (on whichever thread runs the step)."""

    def __init__(self, clock):
        self.clock, self.steps, self.origin = clock, [], time.perf_counter()

    def timed(self, name: str, step):
        busy, cpu, start = self.clock.busy, time.thread_time(), time.perf_counter()
        out = step()
        chunk = sum(s.name == name for s in self.steps)  # each step runs the chunks in order
        self.steps.append(Step(name, chunk, start - self.origin, time.perf_counter() - self.origin,
                               time.thread_time() - cpu, self.clock.busy - busy))
        return out


def timed_scorer(scorer_class, timeline: Timeline, *args, **kwargs):
    """An instance of `scorer_class` whose three steps are recorded on `timeline`."""

    class Timed(scorer_class):
        def prepare(self, items):
            return timeline.timed("prepare", lambda: super(Timed, self).prepare(items))

        def run(self, prepared, progress: bool = False):
            return timeline.timed("run", lambda: super(Timed, self).run(prepared))

        def finish(self, ran):
            return timeline.timed("finish", lambda: super(Timed, self).finish(ran))

    return Timed(*args, **kwargs)


def scorer_for(name: str, lm, timeline: Timeline, batch_tokens: int):
    """Meta or direct scoring as `benchmarks.scoring._score_pairs` builds it (prefix trees, default settings)."""
    from babelprobe.benchmarks.direct import DirectScorer
    from babelprobe.benchmarks.meta import MetaScorer
    from babelprobe.benchmarks.scoring import DirectSettings, MetaSettings
    from babelprobe.settings import settings_record

    if name == "meta":
        return timed_scorer(MetaScorer, timeline, lm, share_prefix=True, batch_tokens=batch_tokens,
                            **MetaSettings().scorer_options(lm))
    return timed_scorer(DirectScorer, timeline, lm, batch_tokens=batch_tokens, share_prefix=True,
                        **settings_record(DirectSettings()))


def one_round(lm, items, name: str, batch_tokens: int, tmp: Path) -> dict:
    timeline = Timeline(lm.simulated)
    scorer = scorer_for(name, lm, timeline, batch_tokens)
    busy, cpu = lm.simulated.busy, os.times()
    score_resumably(scorer, items, tmp / f"{name}.csv", {"what": "perf/stages.py"}, progress=False, model=lm,
                    together="text")
    wall, after = time.perf_counter() - timeline.origin, os.times()
    host = (after.user - cpu.user) + (after.system - cpu.system)
    runs = [s for s in timeline.steps if s.name == "run"]
    return {"steps": timeline.steps, "wall": wall, "host": host, "device": lm.simulated.busy - busy,
            "device_starts": min(s.start for s in runs), "after_last_pass": wall - max(s.end for s in runs)}


def _span(step: Step | None) -> str:
    return f"{step.end - step.start:.3f} ({step.start:.3f} → {step.end:.3f})" if step else ""


def report(done: dict, pairs: int) -> str:
    chunks = sorted({s.chunk for s in done["steps"]})
    of = {(s.name, s.chunk): s for s in done["steps"]}
    lines = ["| chunk | prepare s (from → to) | run s (from → to) | of which device | finish s (from → to) | "
             "CPU s: prepare / run / finish |", "|---|---|---|---|---|---|"]
    for k in chunks:
        p, r, f = (of.get((name, k)) for name in ("prepare", "run", "finish"))
        lines.append(f"| {k} | {_span(p)} | {_span(r)} | {r.device:.4g} | {_span(f)} | "
                     f"{p.cpu:.3f} / {r.cpu:.3f} / {f.cpu:.3f} |")
    wall, host, device = done["wall"], done["host"], done["device"]
    lines.append(f"\nwall {wall:.3f} s, device {device:.4g} s, host {host:.3f} s of CPU ({1e3 * host / pairs:.3f} ms "
                 f"per pair, device {1e3 * device / pairs:.3f}), wall / max(host, device) {wall / max(host, device):.3f}; "
                 f"the device started {done['device_starts']:.3f} s after the run's start, and the run ended "
                 f"{done['after_last_pass']:.3f} s after its last pass")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scorer", choices=("meta", "direct"), default="meta")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--pairs", type=pair_count, default=135, help="pairs per cell (17 languages × 4 types): a "
                        "number, quarter or xcomps")
    parser.add_argument("--languages", default=",".join(XCOMPS_LANGUAGES))
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--tokenizer", help="the default model's tokenizer files (as perf/workflow.py's)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds (the same model and items)")
    parser.add_argument("--tmp", type=Path, default=None, help="where the tables are written (a temporary folder)")
    args = parser.parse_args(argv)
    if min(args.pairs, args.repeat, args.batch_tokens) < 1:
        parser.error(f"--pairs {args.pairs}, --repeat {args.repeat}, --batch-tokens {args.batch_tokens}: each at "
                     "least 1")
    if args.tmp and not args.tmp.is_dir():
        parser.error(f"--tmp {args.tmp}: no such directory")
    items = synthetic_items(args.pairs, tuple(args.languages.split(",")))
    texts, _ = meta_texts(items)
    lm = build_model(args.shape, "simulated", None, [*items["text"], *texts], args.tokenizer)
    warm_up(lm)
    simulate_gpu_batching()
    pairs = len(items) // 2
    print(f"{args.scorer} of {pairs} pairs on perf/simulated.py's {args.shape} stand-in, batch_tokens "
          f"{args.batch_tokens}")
    for k in range(args.repeat):
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            done = one_round(lm, items, args.scorer, args.batch_tokens, Path(tmp))
        print(f"\nround {k + 1}\n{report(done, pairs)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
