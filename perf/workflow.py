"""The whole XCOMPS workflow, timed per phase: `compare` (meta, direct, extraction, probes) end to end on
XCOMPS-sized synthetic items and a randomly initialised model, each phase against a naive baseline and
against its floor (the same model work, bare), both measured in the same run.

    .venv/bin/python perf/workflow.py --shape tiny --pairs 4 --device cpu          # a smoke run (the test)
    .venv/bin/python perf/workflow.py --shape llama-3.1-8b --pairs 135 --device cuda  # the headline goal

Items: the 17 XCOMPS languages × 4 negative types × `--pairs` minimal pairs. Each synthetic pair copies
the texts and concept fields of a random pair of the bundled `xcomps-sample` in the same language (or,
for the seven XCOMPS languages the sample lacks, of any language), so sentence and prompt lengths are
drawn like the sample's. Speed does not depend on weight values, so the model is built from a config
(`--shape`) with random weights; its vocabulary is the default tokenizer's (262k), which makes the
output layer of the Llama shapes about twice as large as Llama's own 128k one (direct and meta are
therefore measured on a harder case; `--tokenizer DIR` takes another tokenizer, or the default one's
files copied to a machine without the gguf package). `--shape tiny` (the smoke run) has a 2,000-token BPE trained on
the run's texts instead, so that it takes seconds. `--shape default` uses the real Gemma-3-270M.

Each phase is reported against two references measured in the same run:

  baseline  the naive way a user would do it (the texts through a plain HF forward):
              direct   a forward with full logits over the item texts
              meta     a forward with full logits over every prompt + answer, both orders
              extract  a forward of the model body over the item texts (no output layer)
              probe    the scikit-learn loop on the same store (`--no-sklearn`: skip)
  floor     the least work the phase must do, through the same code path: the model calls babelprobe
            made in that phase, recorded during its run and replayed bare (same inputs, same batches,
            nothing captured, written, scored or tabulated):
              extract  the body forward of the same batches (no hooks, no pooling, no writing)
              direct   the body forward of the same batches (distinct texts) + the vocabulary projection
                       and log-normaliser of only the rows that predict a scored token
              meta     the same over the prefix tree: every shared prefix token run once (zero-filled
                       KV caches of the recorded shapes stand in for the real ones)
              probe    the solver's fits (`fit_predict` of every group, same problems, same parallelism)
            so floor/babelprobe ≤ 1 by construction and 1 − floor/babelprobe is the share of the phase
            that babelprobe spends outside the model (tokenising, batching, KV bookkeeping, hooks,
            writing; for probes: folds, metrics, bootstrap intervals, tables).

A warm-up forward runs before anything is timed, so no phase pays the first call's set-up. With
`--repeat R` the whole comparison, the floors and the baselines take turns R times (perf/timing.py:
alternating order, a fresh run directory each time); the ratios are the medians of the within-round
ratios. For each phase: wall seconds, tokens/s, both references and their ratios to babelprobe, the
process's CPU seconds and floor/babelprobe in CPU seconds (on a shared CPU the wall-clock ratio of runs
minutes apart moves with other users' load; run with OMP_NUM_THREADS=1 there so CPU time is work), peak
accelerator memory and, on CUDA with NVML, the GPU-busy fraction. The table is printed and written as
JSON and Markdown (`--json`, `--markdown`) so that a run on a lent GPU can go into the README with the
hardware named. Timings on a shared machine are noisy: compare ratios, rerun on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import rounds  # noqa: E402  (perf/timing.py)

from babelprobe import comparison  # noqa: E402
from babelprobe.benchmarks.meta import meta_requests, prompt_texts  # noqa: E402
from babelprobe.items import load_items  # noqa: E402
from babelprobe.models import length_batches, load_model, pad_batch, wrap_model  # noqa: E402
from babelprobe.runs import RunDir  # noqa: E402

XCOMPS_LANGUAGES = ("ar", "ca", "de", "el", "es", "fa", "fr", "he", "hu", "ja", "ko", "nl", "ru", "tr", "uk", "vi", "zh")
SUBSETS = ("taxonomic", "overlap", "co-occurrence", "random")
SHAPES = {  # Llama-style bodies; vocabulary = the default tokenizer's
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, rope_theta=500000.0),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, rope_theta=500000.0),
}


# ------------------------------------------------------------------------------------------------ inputs

def synthetic_items(pairs: int, languages: tuple[str, ...], seed: int = 0) -> pd.DataFrame:
    """`pairs` minimal pairs per language × subset, each a copy of a random sample pair (see docstring)."""
    sample = load_items("xcomps-sample")
    rng = np.random.default_rng(seed)
    by_language = {lang: part for lang, part in sample.groupby("language")}
    rows = []
    for lang in languages:
        pool = by_language.get(lang, sample)
        pair_ids = pool["pair_id"].unique()
        for subset in SUBSETS:
            for k in range(pairs):
                source = pool[pool["pair_id"] == rng.choice(pair_ids)]
                pair_id = f"{lang}-{subset}-{k:05d}"
                for row in source.to_dict("records"):
                    side = "good" if row["label"] == 1 else "bad"
                    rows.append({**row, "item_id": f"{pair_id}-{side}", "pair_id": pair_id, "language": lang,
                                 "subset": subset})
    return pd.DataFrame(rows)


def build_model(shape: str, device: str, dtype: str | None, texts: list[str], tokenizer_dir: str | None = None):
    """The model of `shape` on `device`; on the simulated device (perf/simulated.py) a stand-in of that
    shape, whose `Device` clock is `lm.simulated` (None on a real device)."""
    if shape == "default" and device != "simulated":
        lm = load_model("default", device=device, dtype=dtype)
        lm.simulated = None
        return lm
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    from babelprobe.models import parse_dtype

    tokenizer = small_tokenizer(texts) if shape == "tiny" else default_tokenizer(tokenizer_dir)
    if shape == "default":
        from babelprobe.models import _converted_default

        config = AutoConfig.from_pretrained(_converted_default())
    else:
        config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=8192, bos_token_id=2,
                             eos_token_id=1, pad_token_id=0, tie_word_embeddings=False, **SHAPES[shape])
    if device == "simulated":
        from simulated import simulated_model

        lm, clock = simulated_model(shape, config, tokenizer, parse_dtype(dtype) or torch.bfloat16)
        lm.simulated = clock
        return lm
    torch_dtype = parse_dtype(dtype) or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    # a fixed fingerprint: hashing billions of random weights would take minutes and mean nothing
    lm = wrap_model(model.eval(), tokenizer, name=f"random {shape}", fingerprint=f"random-{shape}")
    lm.simulated = None
    return lm


def default_tokenizer(directory: str | None = None):
    """The default model's tokenizer, or the one saved in `directory` (`--tokenizer`: a machine without the
    gguf package, e.g. a lent GPU, gets the converted model's tokenizer files copied there)."""
    from transformers import AutoTokenizer

    from babelprobe.models import _converted_default

    return AutoTokenizer.from_pretrained(directory or _converted_default())


def small_tokenizer(texts: list[str]):
    """A byte-level BPE of 2,000 tokens trained on the run's own texts: the smoke run's output layer is
    then small, so `--shape tiny` checks the whole workflow in seconds rather than timing a 262k head."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   bos_token="<bos>")


# ---------------------------------------------------------------------------------------------- measuring

class Meter:
    """Wall time, peak accelerator memory and GPU-busy share of one phase."""

    def __init__(self, device: torch.device, clock=None):
        self.cuda = device.type == "cuda"
        self.busy: list[float] = []
        self.clock = clock  # the simulated device's (perf/simulated.py), or None
        self.device_seconds = float("nan")

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._sampling = True
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        self.device_start = self.clock.busy if self.clock is not None else 0.0
        self.start, self.cpu_start = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.start
        self.cpu_seconds = time.process_time() - self.cpu_start  # this process, all its threads
        if self.clock is not None:
            self.device_seconds = self.clock.busy - self.device_start
        self.peak_gib = torch.cuda.max_memory_allocated() / 2 ** 30 if self.cuda else float("nan")
        if self.cuda:
            self._sampling = False
            self._thread.join()
        return False

    def _sample(self):
        while self._sampling:
            try:
                self.busy.append(torch.cuda.utilization() / 100)  # needs NVML (pynvml)
            except Exception:  # no NVML: the share stays unknown
                return
            time.sleep(0.05)

    @property
    def gpu_busy(self) -> float:
        return float(np.mean(self.busy)) if self.busy else float("nan")


def bare_forward(lm, texts: list[str], batch_tokens: int, head: bool, device: torch.device) -> tuple[float, int]:
    """Seconds and tokens of a baseline: the texts through the model in length-sorted batches under the
    token budget, with (`head`: HF's own forward, every position's logits) or without the output layer."""
    encodings = lm.encode(texts, truncate=True)
    batches = length_batches([len(e.ids) for e in encodings], batch_tokens)
    with torch.inference_mode(), Meter(device) as meter:
        for batch in batches:
            inputs = pad_batch([encodings[i] for i in batch], lm.pad_token_id, "right", lm.device)
            if head:
                lm.model(**inputs, use_cache=False, logits_to_keep=0)  # 0 = every position's logits
            else:
                lm.parts.body(**inputs, use_cache=False)
    return meter.seconds, sum(len(e.ids) for e in encodings)


def meta_texts(items: pd.DataFrame) -> list[str]:
    """Every prompt + answer the meta scorer scores (both orders, both answers), as plain texts."""
    pairs, languages, prompts = meta_requests(items)
    texts, _, _ = prompt_texts(pairs, prompts, languages, close_quote=True,
                               render=lambda template, prop, w1, w2: template.plain(prop, w1, w2))
    return texts


# ------------------------------------------------------------------------------------------- the floor

class ModelCalls:
    """Records the model calls babelprobe makes in each phase, to replay them bare (the floor).

    While `phase` is set, every forward of the model body (`lm.parts.body`) is recorded with its inputs
    (token ids, mask, positions: copies) and the shapes of the KV cache it was given, and every
    vocabulary projection (`lm.parts.logits`) with its number of rows. The originals run unchanged."""

    def __init__(self, lm):
        self.lm, self.phase = lm, None
        self.calls: dict[str, list] = {}

    def __enter__(self):
        body, parts = self.lm.parts.body, self.lm.parts
        self.forward, self.logits = body.forward, parts.logits

        def forward(*args, **kwargs):
            if self.phase is not None:
                cache = kwargs.get("cache", kwargs.get("past_key_values"))
                shapes = None if cache is None else [(layer.keys.shape, layer.values.shape, layer.keys.dtype)
                                                     for layer in cache.layers
                                                     if getattr(layer, "keys", None) is not None]
                inputs = {k: v.detach().clone() for k, v in kwargs.items() if torch.is_tensor(v)}
                flags = {k: v for k, v in kwargs.items() if not torch.is_tensor(v)
                         and k not in ("cache", "past_key_values")}
                self.calls.setdefault(self.phase, []).append(("body", inputs, flags, shapes))
            return self.forward(*args, **kwargs)

        def logits(hidden):
            if self.phase is not None:
                self.calls.setdefault(self.phase, []).append(("logits", hidden.shape, hidden.dtype))
            return self.logits(hidden)

        body.forward, parts.logits = forward, logits
        return self

    def __exit__(self, *exc):
        self.lm.parts.body.forward, self.lm.parts.logits = self.forward, self.logits
        return False

    def replay(self, phase: str, device: torch.device) -> tuple[float, float]:
        """Seconds of the phase's model calls run again bare: each body forward on the recorded inputs
        (with a zero-filled cache of the recorded shapes where it had one, built outside the clock), each
        projection on as many zero rows followed by the log-normaliser and the target gather, as the
        scorers do. Only the calls themselves are timed."""
        from transformers import DynamicCache

        from babelprobe.benchmarks.core.logprobs import _logsumexp_

        lm, seconds, cpu = self.lm, 0.0, 0.0
        with torch.inference_mode():
            for call in self.calls.get(phase, []):
                if call[0] == "body":
                    _, inputs, flags, shapes = call
                    kwargs = dict(inputs, **flags)
                    if shapes is not None:
                        cache = DynamicCache()
                        kwargs.update(lm.parts.cache_argument(cache))
                        for layer, (k, v, dtype) in enumerate(shapes):
                            cache.update(torch.zeros(k, dtype=dtype, device=lm.device),
                                         torch.zeros(v, dtype=dtype, device=lm.device), layer)
                    with Clock(device) as clock:
                        self.forward(**kwargs)
                else:
                    _, shape, dtype = call
                    states = torch.zeros(shape, dtype=dtype, device=lm.device)
                    targets = torch.zeros(shape[0], 1, dtype=torch.long, device=lm.device)
                    with Clock(device) as clock:
                        logits = self.logits(states).float()
                        logits.gather(1, targets)
                        _logsumexp_(logits)
                seconds += clock.seconds
                cpu += clock.cpu_seconds
        return seconds, cpu


class Clock:
    """Wall seconds of a block, the device synchronised at both ends (light enough to wrap every call)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
        self.start, self.cpu_start = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.start
        self.cpu_seconds = time.process_time() - self.cpu_start
        return False


class FitCalls:
    """Records the solver calls of the probe phase (`fit_predict` as the sweep calls it, per group) and
    replays them with the sweep's own parallelism: the probe phase's floor."""

    def __init__(self):
        self.calls: list = []
        self.recording = False

    def __enter__(self):
        import babelprobe.probes.run as runner

        self.runner, self.original = runner, runner.fit_predict

        def recorded(*args, **kwargs):
            if self.recording:
                self.calls.append((args, kwargs))
            return self.original(*args, **kwargs)

        runner.fit_predict = recorded
        return self

    def __exit__(self, *exc):
        self.runner.fit_predict = self.original
        return False

    def replay(self, device: torch.device) -> tuple[float, float]:
        from babelprobe.probes.run import group_workers, map_groups

        workers = group_workers(None, "torch", None, len(self.calls))
        with Meter(device) as meter:
            map_groups(lambda call: self.original(*call[0], **call[1]), self.calls, workers, False)
        return meter.seconds, meter.cpu_seconds


# ------------------------------------------------------------------------------------------------- the run

PHASES = (("direct", "direct"), ("meta", "meta"), ("extract", "extract"), ("probe", "neuro"))
BASELINE_NAMES = {"direct": "HF forward, all logits", "meta": "HF forward, all logits",
                  "extract": "body forward, own batches", "probe": "scikit-learn loop"}
FLOOR_NAMES = {"direct": "body + needed rows' logits", "meta": "prefix tree + needed rows' logits",
               "extract": "body forward, same batches", "probe": "solver fits only"}


def run(args) -> list[dict]:
    device = torch.device("cpu" if args.device == "simulated" else args.device)
    items = synthetic_items(args.pairs, tuple(args.languages.split(",")), seed=args.seed)
    if args.pairs == 1:  # one pair per cell cannot be split into pair-grouped folds: probe per language
        items["subset"] = "all"
    lm = build_model(args.shape, args.device, args.dtype, [*items["text"], *meta_texts(items)], args.tokenizer)
    warm_up(lm)
    if lm.simulated is not None:  # the simulated device batches as a GPU does (budget-cut extraction batches)
        import babelprobe.extract.run as extract_run

        extract_run.min_fill = lambda device: 0.0
    calls, fits = ModelCalls(lm), FitCalls()
    with calls, fits, tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        runs = {"babelprobe": lambda: babelprobe_run(lm, items, Path(tmp), args, device, calls, fits),
                "floor": lambda: floor_runs(calls, fits, device),
                "baseline": lambda: baseline_runs(lm, items, Path(tmp), args, device)}
        if args.no_baseline:  # the naive baselines take long (meta's: every position's logits over 262k)
            runs["baseline"] = dict
        rounds_done = rounds(runs, args.repeat)
    return table(rounds_done, args)


def warm_up(lm) -> None:
    """One short forward and projection before anything is timed (first-call set-up of the kernels)."""
    encodings = lm.encode(["warm up " * 8], truncate=True)
    with torch.inference_mode():
        batch = pad_batch(encodings, lm.pad_token_id, "right", lm.device)
        hidden = lm.parts.body(**batch, use_cache=False).last_hidden_state
        lm.parts.logits(hidden[0, :2]).float()


def babelprobe_run(lm, items, tmp: Path, args, device, calls: ModelCalls, fits: FitCalls) -> dict:
    """`compare` into a fresh directory, each phase timed; the first run records the model and solver calls."""
    phases: dict[str, Meter] = {}
    stage, ensure_store = RunDir.stage, comparison._ensure_store
    recording = not calls.calls

    def timed_stage(self, name, settings, produce, output, read):
        calls.phase = name if recording else None
        fits.recording = recording and name == "neuro"
        try:
            with Meter(device, lm.simulated) as phases[name]:
                return stage(self, name, settings, produce, output, read)
        finally:
            calls.phase, fits.recording = None, False

    def timed_store(*a, **k):
        calls.phase = "extract" if recording else None
        try:
            with Meter(device, lm.simulated) as phases["extract"]:
                return ensure_store(*a, **k)
        finally:
            calls.phase = None

    out = Path(tempfile.mkdtemp(dir=tmp, prefix="compare-"))
    RunDir.stage, comparison._ensure_store = timed_stage, timed_store
    try:
        comparison.compare(lm, items, out, folds=folds(args), batch_tokens=args.batch_tokens,
                           progress=not args.no_progress)
    finally:
        RunDir.stage, comparison._ensure_store = stage, ensure_store
    done = {name: phases[phase] for name, phase in PHASES}
    say("babelprobe", {name: meter.seconds for name, meter in done.items()})
    return {"phases": done, "acts": out / "acts"}


def say(run: str, seconds: dict) -> None:
    """One line per finished run, so that a run stopped by a time limit (a lent GPU) still tells its phases."""
    print(f"{run}: " + ", ".join(f"{name} {value:.2f} s" for name, value in seconds.items()), flush=True)


def floor_runs(calls: ModelCalls, fits: FitCalls, device) -> dict:
    out = {name: calls.replay(phase, device) for name, phase in PHASES if name != "probe"}
    out["probe"] = fits.replay(device)
    say("floor", {name: wall for name, (wall, _) in out.items()})
    return out


def baseline_runs(lm, items, tmp: Path, args, device) -> dict:
    out = {"direct": bare_forward(lm, items["text"].tolist(), args.batch_tokens, True, device),
           "meta": bare_forward(lm, meta_texts(items), args.batch_tokens, True, device),
           "extract": bare_forward(lm, items["text"].tolist(), args.batch_tokens, False, device)}
    stores = sorted(tmp.glob("compare-*/acts"))
    if not args.no_sklearn and stores:
        from babelprobe.probes import probe

        with Meter(device) as meter:
            probe(stores[0], folds=folds(args), solver="sklearn", items=items, progress=False)
        out["probe"] = (meter.seconds, 0)
    say("baseline", {name: wall for name, (wall, _) in out.items()})
    return out


def table(done: list[dict], args) -> list[dict]:
    """One row per phase: babelprobe's fastest round, both references' fastest, and the median of each
    within-round ratio (reference seconds / babelprobe seconds)."""
    rows = []
    n_pairs = args.pairs * len(args.languages.split(",")) * len(SUBSETS)
    for name, _ in PHASES:
        ours = [r["babelprobe"][0]["phases"][name] for r in done]
        base = [r["baseline"][0].get(name) for r in done]
        floor = [r["floor"][0][name] for r in done]
        best = min(ours, key=lambda m: m.seconds)
        tokens = base[0][1] if base[0] else 0
        row = {"phase": name, "seconds": round(best.seconds, 3),
               "tokens_per_s": round(tokens / best.seconds, 1) if tokens else None,
               "baseline": BASELINE_NAMES[name] if base[0] else "(skipped)",
               "baseline_seconds": round(min(b[0] for b in base), 3) if base[0] else None,
               "baseline_ratio": _median([b[0] / m.seconds for b, m in zip(base, ours, strict=True)]) if base[0]
               else None,
               "floor": FLOOR_NAMES[name], "floor_seconds": round(min(f[0] for f in floor), 3),
               "floor_ratio": _median([f[0] / m.seconds for f, m in zip(floor, ours, strict=True)]),
               # CPU seconds of this process: what a shared machine's other users change least
               "cpu_seconds": round(best.cpu_seconds, 3),
               "floor_cpu_ratio": _median([f[1] / m.cpu_seconds for f, m in zip(floor, ours, strict=True)]),
               "rounds": len(done), "peak_gib": round(best.peak_gib, 2), "gpu_busy": round(best.gpu_busy, 2),
               "host_ms_per_pair": round(1000 * best.cpu_seconds / n_pairs, 3),
               "device_ms_per_pair": round(1000 * best.device_seconds / n_pairs, 3),
               "overlap": round(best.seconds / max(best.cpu_seconds, best.device_seconds), 3)
               if best.device_seconds == best.device_seconds else None}
        rows.append(row)
    total = min(r["babelprobe"][1] for r in done)
    rows.append({"phase": "total", "seconds": round(total, 3), "tokens_per_s": None, "baseline": "",
                 "baseline_seconds": None, "baseline_ratio": None, "floor": "", "floor_seconds": None,
                 "floor_ratio": None, "cpu_seconds": None, "floor_cpu_ratio": None, "rounds": len(done), "peak_gib": None, "gpu_busy": None})
    return rows


def _median(values: list[float]) -> float:
    return round(float(np.median(values)), 3)


def folds(args) -> int:
    """XCOMPS's 5 folds, fewer when a smoke run has fewer pairs per probe group than that (2 at least).
    With --pairs 1 a probe group is a language (its 4 negative types' pairs, see `run`)."""
    per_group = args.pairs if args.pairs > 1 else len(SUBSETS)
    return max(2, min(5, per_group))


# ---------------------------------------------------------------------------------------------- reporting

def markdown(rows: list[dict], header: dict) -> str:
    lines = [f"**{header['shape']}** on {header['hardware']} ({header['pairs_total']} pairs, "
             f"{header['languages']} languages, batch_tokens {header['batch_tokens']}, {header['dtype']}, "
             f"{header['rounds']} round(s){', shared machine' if header.get('shared') else ''})", "",
             "| phase | seconds | tokens/s | baseline | baseline s | baseline/babelprobe | floor | floor s | "
             "floor/babelprobe | CPU s | floor/babelprobe (CPU) | peak GiB | GPU busy | host ms/pair | "
             "device ms/pair | wall/max(host, device) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["phase"], r["seconds"], r["tokens_per_s"], r["baseline"], r["baseline_seconds"],
                 r["baseline_ratio"], r["floor"], r["floor_seconds"], r["floor_ratio"], r["cpu_seconds"],
                 r["floor_cpu_ratio"], r["peak_gib"], r["gpu_busy"], r.get("host_ms_per_pair"),
                 r.get("device_ms_per_pair"), r.get("overlap")]
        lines.append("| " + " | ".join("" if c is None or c != c else str(c) for c in cells) + " |")
    return "\n".join(lines)


def hardware(device: str) -> str:
    if device == "simulated":
        return f"a simulated device (perf/simulated.py) on CPU ({platform.processor() or platform.machine()})"
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="tiny", choices=[*SHAPES, "default"])
    parser.add_argument("--pairs", type=int, default=4, help="pairs per language × negative type (XCOMPS: ~135); "
                        "probes use 5 folds, or --pairs folds when fewer; with 1, one probe group per language "
                        "(pair-grouped folds cannot split a single pair)")
    parser.add_argument("--languages", default=",".join(XCOMPS_LANGUAGES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda, cpu, or simulated (perf/simulated.py: a stand-in of --shape that holds the "
                        "thread for the measured device time)")
    parser.add_argument("--dtype", help="float32, bfloat16 (default: bf16 on CUDA, fp32 on CPU)")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--tokenizer", metavar="DIR", help="the Llama shapes' tokenizer directory (default: the "
                        "default model's, converted once into the cache)")
    parser.add_argument("--no-sklearn", action="store_true", help="skip the scikit-learn probe baseline")
    parser.add_argument("--no-baseline", action="store_true", help="skip every naive baseline (floors only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tmp", help="where the run directory goes (default: the system's temporary dir)")
    parser.add_argument("--json", help="write the table as JSON here")
    parser.add_argument("--markdown", help="write the table as Markdown here")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="rounds in which compare, the floors and the baselines "
                        "take turns (perf/timing.py); ratios are the medians of the within-round ones")
    parser.add_argument("--shared", action="store_true", help="say in the table that the machine was shared")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs must be at least 1 (got {args.pairs})")
    rows = run(args)
    n_languages = len(args.languages.split(","))
    header = {"shape": args.shape, "folds": folds(args), "hardware": hardware(args.device), "device": args.device,
              "dtype": args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"),
              "pairs_per_cell": args.pairs, "pairs_total": args.pairs * n_languages * len(SUBSETS),
              "languages": n_languages, "batch_tokens": args.batch_tokens, "torch": torch.__version__,
              "rounds": args.repeat, "shared": args.shared}
    table = markdown(rows, header)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"run": header, "phases": rows}, indent=1), encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
