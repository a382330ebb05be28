"""The whole XCOMPS workflow, timed per phase: `compare` (direct with extraction fused into it, meta, probes)
end to end on XCOMPS-sized synthetic items and a randomly initialised model, each phase against its floors and
a naive baseline, all measured in the same run.

    .venv/bin/python perf/workflow.py --shape tiny --pairs 4 --device cpu                # a smoke run (the test)
    .venv/bin/python perf/workflow.py --shape llama-3.1-8b --pairs xcomps --device cuda  # the whole XCOMPS
    .venv/bin/python perf/workflow.py --shape llama-3.1-8b --pairs 135 --device simulated  # progress without a GPU

Items: the 17 XCOMPS languages × 4 negative types × `--pairs` minimal pairs (`xcomps`: 3,592, the paper's
244,256; `quarter`: 898). As in XCOMPS, a language's acceptable sentences (a concept and a property) are the
same in its four negative types, each paired with that type's unacceptable concept: 37.5% of the item texts
repeat one before them, more where two types share an unacceptable concept (38% at `--pairs 135`, 43% at a
quarter). Each synthetic acceptable sentence takes its concept from one pair of the
bundled `xcomps-sample` in the same language and its property from another (4,624 combinations per language),
so texts and prompts are the sample's in length and the pairs distinct. For the eight XCOMPS languages the
sample lacks, a sample language stands in, its texts tagged with the language's code ("ar: ...") so that no
text is another language's, as in XCOMPS. Speed does not depend on weight values, so the model is built from a
config (`--shape`) with random weights; its vocabulary is the default tokenizer's (262k), about twice Llama's
own 128k (`--tokenizer DIR` takes another tokenizer, or the default one's files copied to a machine without
the gguf package). `--shape tiny` (the smoke run) has a 2,000-token BPE trained on the run's texts instead;
`--shape default` is the real Gemma-3-270M. `--device simulated` runs a stand-in of the shape whose forward
holds the thread for the H200-measured device time (perf/simulated.py): host work and its overlap with the
device, measured without a GPU.

Each phase is reported against references measured in the same run:

  floors     (perf/floors.py) the least of: the replay of babelprobe's own model calls of the phase; a bare
             forward of the same tokens at the best budget of a sweep; and the arithmetic floor, the phase's
             model FLOPs ÷ this device's dense matmul rate measured in this run. floor/babelprobe ≤ 1; MFU is
             the phase's FLOPs ÷ (its seconds × that rate), per phase and end to end.
  baseline   the naive way a user would do it (`--baseline`): a plain HF forward with every position's logits
             over the item texts (direct) and every prompt + answer (meta), the body over the item texts
             (extract), the scikit-learn loop on the same store (probe; `--no-sklearn` skips it).

and with host and device time: host = this process's CPU seconds (every thread's: tokenising, batching, prefix
trees, tables, writing, launching; "of which kernel": its system time, the store's writes into the page cache and
page faults), device = the simulated device's busy seconds (or, on CUDA, the NVML busy share × wall); wall ÷
max(host, device) is 1.0 when they overlap fully and about 2 when they run in series. On a shared machine the
thread that drives the device also waits for a CPU (its run-queue wait, from /proc/thread-self/schedstat); the
table gives that wait and the ratio with it taken off the wall. Two columns account for the wall of the thread
that drives the device: its own CPU seconds (launches, the prefix trees' per-pass steps) and, on the synchronous
simulated device, the rest of its time that is neither that, nor the device's, nor the run-queue wait (its turns
at the GIL beside the producer and the finisher, its waits for their chunks and for the store's writer). On that
device the three are what the wall has beyond the device's time. Where a phase writes the activation store
(direct, or a separate extraction), three columns say whether the store set its pace: how long the phase's loop
waited for room in the store writer's queue, how long the shards still queued took after the last batch (the
drain), and the shard writers' busy share (`StoreWriting`); a fourth gives the store's size on disk (a text is
stored once). Compare's direct scoring fills the activation store in its own forward passes (`extract/fused.py`), so the
extract phase only checks the store; `--separate` runs extraction as a pass of its own.

A warm-up runs before anything is timed. With `--repeat R` compare, the floors and the baselines take turns
R times (perf/timing.py; a fresh run directory each time); seconds are the fastest round's, ratios the medians
of the rounds'. The table is printed and written as JSON and Markdown (`--json`, `--markdown`) with the
hardware named, with the FLOP count of the run and of the whole XCOMPS at this shape and what they take at
100% and 50% MFU on an H100 (989 TFLOP/s dense bf16). Timings on a shared machine are noisy: compare ratios,
use CPU seconds (OMP_NUM_THREADS=1), rerun on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import floors  # noqa: E402  (perf/floors.py)
import trace_gaps  # noqa: E402  (perf/trace_gaps.py)
from timing import rounds  # noqa: E402  (perf/timing.py)

from babelprobe import comparison  # noqa: E402
from babelprobe.benchmarks.core.logprobs import logprobs_of_states  # noqa: E402
from babelprobe.benchmarks.meta import meta_requests, prompt_texts  # noqa: E402
from babelprobe.extract.settings import exact_dtype  # noqa: E402
from babelprobe.items import load_items  # noqa: E402
from babelprobe.models import length_batches, load_model, pad_batch, wrap_model  # noqa: E402
from babelprobe.runs import RunDir  # noqa: E402

XCOMPS_LANGUAGES = ("ar", "ca", "de", "el", "es", "fa", "fr", "he", "hu", "ja", "ko", "nl", "ru", "tr", "uk", "vi", "zh")
SUBSETS = ("taxonomic", "overlap", "co-occurrence", "random")
XCOMPS_PAIRS = 3592  # per language × negative type: 17 × 4 × 3,592 = 244,256 pairs (XCOMPS, Table 1)
NAMED_PAIRS = {"xcomps": XCOMPS_PAIRS, "quarter": XCOMPS_PAIRS // 4}
H100_FLOPS = 989.4e12  # dense bf16, H100 SXM (NVIDIA's data sheet): the MFU references of the projection
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
    """`pairs` distinct minimal pairs per language × negative type (module docstring): a language's acceptable
    sentences, the concepts of one sample pair with the property of another, drawn without repeats while the
    language has enough, are the same in its four negative types. Built a cell at a time (a row at a time took
    18 s for a quarter of XCOMPS, device time on a lent GPU)."""
    sample = load_items("xcomps-sample")
    rng = np.random.default_rng(seed)
    known = sorted(sample["language"].unique())
    cells = []
    for lang in languages:
        donor = lang if lang in known else known[int(rng.integers(len(known)))]
        n = int(((sample["language"] == donor) & (sample["subset"] == SUBSETS[0]) & (sample["label"] == 1)).sum())
        concepts, prop = np.divmod(rng.choice(n * n, size=pairs, replace=pairs > n * n), n)
        for subset in SUBSETS:  # the sample's pair k has the same acceptable sentence in every negative type
            cell = sample[(sample["language"] == donor) & (sample["subset"] == subset)]
            good = cell[cell["label"] == 1].set_index("pair_id")
            bad = cell[cell["label"] == 0].set_index("pair_id").loc[good.index]
            items = _cell_items(good, bad, concepts, good.iloc[prop], lang, subset)
            if donor != lang:  # a stand-in's texts are its own (XCOMPS shares none across languages)
                items["text"] = f"{lang}: " + items["text"]
                items["prefix"] = f"{lang}: " + items["prefix"]
            cells.append(items)
    return pd.concat(cells, ignore_index=True)


def _cell_items(good: pd.DataFrame, bad: pd.DataFrame, concepts: np.ndarray, donors: pd.DataFrame, lang: str,
                subset: str) -> pd.DataFrame:
    """One cell's pairs, good item then bad: pair k has the concepts of row concepts[k] and the property of
    donors' row k (its text between prefix and continuation, and its continuation)."""
    joins = [text[len(prefix):len(text) - len(end)]  # what joins prefix and property
             for text, prefix, end in zip(donors["text"], donors["prefix"], donors["continuation"])]
    pair_ids = [f"{lang}-{subset}-{k:05d}" for k in range(len(concepts))]
    sides = []
    for order, (side, rows) in enumerate((("good", good), ("bad", bad))):
        frame = rows.iloc[concepts].reset_index(drop=True)
        frame["pair_id"] = pair_ids
        frame["item_id"] = [f"{pid}-{side}" for pid in pair_ids]
        frame["language"], frame["subset"] = lang, subset
        frame["continuation"] = donors["continuation"].to_numpy()
        frame["text"] = (frame["prefix"].to_numpy(object) + np.array(joins, dtype=object)
                         + frame["continuation"].to_numpy(object))
        frame["property"] = donors["property"].to_numpy()
        frame["label"] = 1 - order
        frame.index = 2 * np.arange(len(frame)) + order
        sides.append(frame)
    return pd.concat(sides).sort_index(kind="stable")


def build_model(shape: str, device: str, dtype: str | None, texts: list[str], tokenizer_dir: str | None = None):
    """The model of `shape` on `device`; on the simulated device (perf/simulated.py) a stand-in of that
    shape, whose `Device` clock is `lm.simulated` (None on a real device)."""
    if shape == "default" and not device.startswith("simulated"):
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
    if device.startswith("simulated"):
        from simulated import device_pooler, queued_reads, simulated_model

        gpu_like = device == "simulated-gpu"
        device_pooler()  # this process only: extraction's pooling on the simulated device, as on a GPU
        if gpu_like:
            queued_reads()  # ... and its reads back queued, as on a GPU
        lm, clock = simulated_model(shape, config, tokenizer, parse_dtype(dtype) or torch.bfloat16, gpu_like=gpu_like)
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


def meta_texts(items: pd.DataFrame) -> tuple[list[str], list[int]]:
    """Every prompt + answer the meta scorer scores (both orders, both answers), and where each answer starts."""
    pairs, languages, prompts = meta_requests(items)
    texts, starts, _ = prompt_texts(pairs, prompts, languages, close_quote=True,
                                    render=lambda template, prop, w1, w2: template.plain(prop, w1, w2))
    return texts, starts


# ---------------------------------------------------------------------------------------------- measuring

class Meter:
    """Wall, CPU (host) and device seconds, peak accelerator memory, GPU-busy share and the CUDA allocator's calls
    into the driver of one phase."""

    def __init__(self, device: torch.device, clock=None):
        self.cuda = device.type == "cuda"
        self.busy: list[float] = []
        self.clock = clock  # the simulated device's (perf/simulated.py), or None
        self.device_seconds = float("nan")
        self.allocator = None

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._allocator_start = allocator_calls()
            self._sampling = True
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        if self.clock is not None:
            self.clock.wait()
        self.device_start = self.clock.busy if self.clock is not None else 0.0
        self.queued_start = run_queue_wait()
        self.start, self.cpu_start, self.sys_start = time.perf_counter(), time.process_time(), os.times().system
        self.driving_start = time.thread_time()  # the thread that enters the meter drives the device
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
        if self.clock is not None:
            self.clock.wait()  # queued work of the phase done (the synchronous device's is)
        self.seconds = time.perf_counter() - self.start
        self.cpu_seconds = time.process_time() - self.cpu_start  # this process, all its threads
        self.sys_seconds = os.times().system - self.sys_start  # of which in the kernel (writes, page faults)
        self.queued = run_queue_wait() - self.queued_start  # the calling thread's, on a loaded machine
        self.driving_cpu = time.thread_time() - self.driving_start
        if self.clock is not None:
            self.device_seconds = self.clock.busy - self.device_start
            if self.clock.queued:  # the device's busy share, as NVML gives it on a GPU
                self.busy = [min(1.0, self.device_seconds / self.seconds)]
        self.peak_gib = torch.cuda.max_memory_allocated() / 2 ** 30 if self.cuda else float("nan")
        if self.cuda:
            self.allocator = "/".join(str(b - a) for a, b in zip(self._allocator_start, allocator_calls(), strict=True))
            self._sampling = False
            self._thread.join()
            if self.busy:
                self.device_seconds = self.gpu_busy * self.seconds
        return False

    def _sample(self):
        while self._sampling:
            try:
                self.busy.append(torch.cuda.utilization() / 100)  # needs NVML (pynvml)
            except Exception:  # no NVML: the share stays unknown
                return
            time.sleep(0.05)

    @property
    def allocator_said(self) -> str:
        return f", allocator {self.allocator} (mallocs/frees/retries)" if self.allocator else ""

    @property
    def gpu_busy(self) -> float:
        return float(np.mean(self.busy)) if self.busy else float("nan")


def allocator_calls() -> tuple[int, int, int]:
    """The CUDA caching allocator's cudaMalloc and cudaFree calls and its retries so far. A cudaFree waits for the
    whole device: a retry (freeing cached blocks to make room after a failed cudaMalloc) leaves the GPU idle while
    the driving thread waits, then refills the queue."""
    stats = torch.cuda.memory_stats()
    return (stats.get("num_device_alloc", 0), stats.get("num_device_free", 0), stats.get("num_alloc_retries", 0))


class StoreWriting:
    """The activation store's writer during a phase (`extract.background.BackgroundWriter`, direct's fused pass or
    a separate extraction): how long the phase's loop waited for room in the writer's queue (the store then sets
    the pace), how long closing it took after the last batch (the shards still queued, written after the device's
    last pass), the shard writers' busy share of the phase, and the store's size on disk (a text stored once)."""

    def __init__(self):
        self.waited = self.drain = self.write = 0.0
        self.writers = 0
        self.bytes = 0

    def __enter__(self):
        from babelprobe.extract.background import BackgroundWriter

        self._close = close = BackgroundWriter.close

        def timed(writer):
            start = time.perf_counter()
            try:
                return close(writer)
            finally:
                self.drain += time.perf_counter() - start
                self.waited, self.write = self.waited + writer.waited, self.write + writer.write_seconds
                self.writers = max(self.writers, writer.n_writers)
                self.bytes += sum(f.stat().st_size for f in writer.writer.path.glob("shard-*.h5"))

        BackgroundWriter.close = timed
        return self

    def __exit__(self, *exc):
        from babelprobe.extract.background import BackgroundWriter

        BackgroundWriter.close = self._close
        return False

    def row(self, seconds: float) -> dict:
        if not self.writers:
            return {}
        return {"store_wait_s": round(self.waited, 3), "store_drain_s": round(self.drain, 3),
                "store_busy": round(self.write / (self.writers * seconds), 2), "store_mb": round(self.bytes / 1e6, 3)}

    def said(self, seconds: float) -> str:
        """The row as the end of a phase's progress line ("" where the phase wrote no store)."""
        row = self.row(seconds)
        return (f", store: loop waited {row['store_wait_s']} s, drained {row['store_drain_s']} s after, writers busy "
                f"{row['store_busy']}, {row['store_mb']} MB") if row else ""


def run_queue_wait() -> float:
    """Seconds the calling thread has waited, ready to run, for a CPU (/proc/thread-self/schedstat; NaN where
    the kernel does not say). On a shared machine the thread that drives the device loses that time to other
    users' processes: the wall time less it is what the phase would take with a core of its own."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return float("nan")


def naive_forward(lm, texts: list[str], batch_tokens: int, head: bool, device: torch.device) -> tuple[float, int]:
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


# ------------------------------------------------------------------------------------------------- the run

PHASES = (("direct", "direct"), ("meta", "meta"), ("extract", "extract"), ("probe", "neuro"))
BASELINE_NAMES = {"direct": "HF forward, all logits", "meta": "HF forward, all logits",
                  "extract": "body forward", "probe": "scikit-learn loop"}


def run(args) -> tuple[list[dict], dict]:
    device = torch.device("cpu" if args.device.startswith("simulated") else args.device)
    items = synthetic_items(args.pairs, tuple(args.languages.split(",")), seed=args.seed)
    if args.pairs == 1:  # one pair per cell cannot be split into pair-grouped folds: probe per language
        items["subset"] = "all"
    texts, starts = meta_texts(items)
    lm = build_model(args.shape, args.device, args.dtype, [*items["text"], *texts], args.tokenizer)
    warm_up(lm)
    if lm.simulated is not None:
        simulate_gpu_batching()
    comparison.FUSE = not args.separate
    work = {name: floors.Work([], 0) for name, _ in PHASES[:3]}
    if not args.replay_only:
        # direct scoring fused with extraction runs every item's own pass; on its own, a prefix tree
        tree = args.batch_tokens if args.separate else None
        work = {"direct": floors.direct_work(lm, items["text"].tolist(), tree),
                "meta": floors.prefix_work(lm, texts, starts, args.batch_tokens),
                "extract": floors.extract_work(lm, items["text"].tolist()) if args.separate else floors.Work([], 0)}
    rate = floors.matmul_rate(lm, device)
    calls, fits = floors.ModelCalls(lm), floors.FitCalls()
    with calls, fits, tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        runs = {"babelprobe": lambda: babelprobe_run(lm, items, Path(tmp), args, device, calls, fits),
                "floor": lambda: floor_runs(lm, calls, fits, work, args, device),
                "baseline": lambda: baseline_runs(lm, items, texts, Path(tmp), args, device)}
        if not args.baseline:  # the naive baselines take long (meta's: every position's logits over 262k)
            runs["baseline"] = dict
        if args.no_floors:  # a run at scale: babelprobe's phases and their arithmetic floor only
            runs["floor"] = lambda: {"rate": rate, **{name: {"replay": (float("nan"), float("nan")), "bare": {}}
                                                      for name, _ in PHASES}}
        rounds_done = rounds(runs, args.repeat)
    vocab = lm.parts.head.weight.shape[0]
    flops = {name: w.flops(lm.model.config, vocab) for name, w in work.items()}
    rate = max([rate, *(r["floor"][0].get("rate", 0.0) for r in rounds_done)])
    return table(rounds_done, args, len(items) // 2, flops, rate), {"flops": flops, "rate": rate}


def simulate_gpu_batching() -> None:
    """The simulated device is batched as a GPU is: batches cut at an accelerator's cost of a forward pass,
    prefix-tree batches bounded by their new tokens, fresh tensors for a tree's gathered pasts (the device
    policies of `models.pass_tokens`, `prefix.past_budget`, `prefix.keeps_memory`; an older babelprobe's
    `min_fill`, none on a GPU)."""
    import babelprobe.models as models

    policies = {"pass_tokens": lambda device: models.ACCELERATOR_PASS_TOKENS, "min_fill": lambda device: 0.0}
    for name, gpu in policies.items():
        # imported by name into other modules: each one patched (an older babelprobe's min_fill: in extract.run)
        policy = getattr(models, name, None) or getattr(sys.modules.get("babelprobe.extract.run"), name, None)
        for module in [m for m in sys.modules.values() if getattr(m, "__name__", "").startswith("babelprobe")]:
            if policy is not None and getattr(module, name, None) is policy:
                setattr(module, name, gpu)
    try:
        import babelprobe.benchmarks.core.prefix as prefix
    except ImportError:  # an older babelprobe (a "before" run) has no device policy for prefix trees
        return
    prefix.past_budget = lambda device: prefix.PAST_PER_TOKEN
    prefix.keeps_memory = lambda device: False  # a GPU's allocator reuses freed blocks (an older babelprobe: unused)


def warm_up(lm) -> None:
    """One short forward and the scored tokens' log-probs, one tiny prefix tree (a shared prefix, then two
    texts after it: the KV cache's path), and one tiny probe fit on folds, before anything is timed: first-call
    costs of the process belong to no phase (the kernels' set-up; on the simulated device, the first
    log-normaliser imports torch._dynamo and the cache's first operators cost 0.5 s of the first meta chunk; the
    first folds import scikit-learn's model_selection, 0.4 s that the probe phase of the first round would
    otherwise pay and its replayed floor not)."""
    from babelprobe.benchmarks.core.prefix import shared_prefix_logprobs
    from babelprobe.probes.folds import make_folds
    from babelprobe.probes.solvers import fit_predict

    encodings = lm.encode(["warm up " * 8], truncate=True)
    with torch.inference_mode():
        batch = pad_batch(encodings, lm.pad_token_id, "right", lm.device)
        hidden = lm.parts.body(**batch, use_cache=False).last_hidden_state
        logprobs_of_states(lm, hidden[0, :2], batch["input_ids"][0, 1:3])
    shared = "warm up " * 8
    shared_prefix_logprobs(lm, [shared + "a dog", shared + "the cats"], [len(shared)] * 2, progress=False)
    labels = np.tile([0, 1], 4)
    fold = make_folds(labels, np.repeat(np.arange(4), 2), n_folds=2)
    fit_predict(np.random.default_rng(0).normal(size=(8, 2, 4)), labels[None], (fold != 0)[None])


def babelprobe_run(lm, items, tmp: Path, args, device, calls, fits) -> dict:
    """`compare` into a fresh directory, each phase timed; the first run records the model and solver calls
    for the floors' replay (not with `--no-floors`: the solver's calls hold every group's activations, 66 GB
    for a quarter of XCOMPS at the 8B shape)."""
    phases: dict[str, Meter] = {}
    stage, ensure_store = RunDir.stage, comparison._ensure_store
    first, calls.rounds = not getattr(calls, "rounds", 0), getattr(calls, "rounds", 0) + 1
    recording = first and not args.no_floors

    def timed_stage(self, name, settings, produce, output, read):
        calls.phase = name if recording else None
        fits.recording = recording and name == "neuro"
        if first and args.profile and name == args.profile_phase:
            produce = profiled(produce, Path(args.profile), device)
        try:
            with Meter(device, lm.simulated) as phases[name], StoreWriting() as phases[name].store:
                return stage(self, name, settings, produce, output, read)
        finally:
            calls.phase, fits.recording = None, False
            said(name, phases.get(name))

    def timed_store(*a, **k):
        calls.phase = "extract" if recording else None
        try:
            with Meter(device, lm.simulated) as phases["extract"], StoreWriting() as phases["extract"].store:
                return ensure_store(*a, **k)
        finally:
            calls.phase = None
            said("extract", phases.get("extract"))

    import babelprobe.probes as probes

    out = Path(tempfile.mkdtemp(dir=tmp, prefix="compare-"))
    RunDir.stage, comparison._ensure_store, probe = timed_stage, timed_store, probes.probe
    if args.probe_layers != "all":  # compare probes every layer; a simulated run may take fewer (zeros, on a CPU)
        probes.probe = lambda store, settings, **k: probe(store, replace(settings, layers=args.probe_layers), **k)
    try:
        comparison.compare(lm, items, out, folds=folds(args), store_dtype=args.store_dtype,
                           batch_tokens=args.batch_tokens, progress=not args.no_progress)
    finally:
        RunDir.stage, comparison._ensure_store, probes.probe = stage, ensure_store, probe
    done = {name: phases[phase] for name, phase in PHASES}
    say("babelprobe", {name: meter.seconds for name, meter in done.items()})
    return {"phases": done}


def profiled(produce, path: Path, device):
    """`produce` under torch's profiler (the host's operators on every thread, and the GPU's kernels): a
    Chrome trace, gzipped, at `path` (chrome://tracing, ui.perfetto.dev: where the GPU waits and what each
    thread did meanwhile), and at PATH.txt, also printed, where the GPU waited (`trace_gaps`: its idle gaps and the
host's innermost operators meanwhile) and the operators' totals. The profiler slows the phase:
    its seconds are not comparable with an unprofiled run."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity, profile

    def run():
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device.type == "cuda" else [])]
        with profile(activities=activities) as prof:
            out = produce()
        with tempfile.NamedTemporaryFile(suffix=".json") as raw:
            prof.export_chrome_trace(raw.name)
            with open(raw.name, "rb") as src, gzip.open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
        averages = prof.key_averages()
        sorts = ["self_cpu_time_total", *(["self_device_time_total"] if device.type == "cuda" else [])]
        text = "\n\n".join([trace_gaps.report(str(path)), *(averages.table(sort_by=key, row_limit=30)
                                                            for key in sorts)])
        Path(f"{path}.txt").write_text(text)
        print(text, flush=True)
        return out
    return run


def said(name: str, meter: Meter | None) -> None:
    """One line per finished phase of a babelprobe run (compare's stage names: neuro is the probe phase), as it
    finishes: a run stopped by a time limit (a lent GPU's call) still tells the phases it finished, with their
    busy share and memory."""
    if meter is not None and hasattr(meter, "seconds"):  # not when the phase failed before its meter stopped
        print(f"phase {name}: {meter.seconds:.2f} s, CPU {meter.cpu_seconds:.2f} s, GPU busy {meter.gpu_busy:.2f}, "
              f"peak {meter.peak_gib:.1f} GiB{meter.allocator_said}{meter.store.said(meter.seconds)}", flush=True)


def say(run: str, seconds: dict) -> None:
    """One line per finished run, so that a run stopped by a time limit (a lent GPU) still tells its phases."""
    print(f"{run}: " + ", ".join(f"{name} {value:.2f} s" for name, value in seconds.items()), flush=True)


def floor_runs(lm, calls, fits, work: dict, args, device) -> dict:
    """Per phase: the replay of its calls (seconds, CPU seconds) and the bare forward at each budget."""
    budgets = floors.CPU_BUDGETS if device.type == "cpu" and lm.simulated is None else floors.GPU_BUDGETS
    out = {}
    for name, phase in PHASES[:3]:
        out[name] = {"replay": calls.replay(phase, device),
                     "bare": floors.bare_seconds(lm, work[name], budgets, device, args.sweep_tokens)
                     if work[name].tokens else {}}
    out["probe"] = {"replay": fits.replay(device), "bare": {}}
    out["rate"] = floors.matmul_rate(lm, device)  # each round's: the best of the rounds is the reference
    say("floor (replay)", {name: value["replay"][0] for name, value in out.items() if name != "rate"})
    return out


def baseline_runs(lm, items, texts, tmp: Path, args, device) -> dict:
    out = {"direct": naive_forward(lm, items["text"].tolist(), args.batch_tokens, True, device),
           "meta": naive_forward(lm, texts, args.batch_tokens, True, device),
           "extract": naive_forward(lm, items["text"].tolist(), args.batch_tokens, False, device)}
    stores = sorted(tmp.glob("compare-*/acts"))
    if not args.no_sklearn and stores:
        from babelprobe.probes import probe

        with Meter(device) as meter:
            probe(stores[0], folds=folds(args), solver="sklearn", items=items, progress=False)
        out["probe"] = (meter.seconds, 0)
    say("baseline", {name: wall for name, (wall, _) in out.items()})
    return out


def table(done: list[dict], args, n_pairs: int, flops: dict, rate: float) -> list[dict]:
    """One row per phase: babelprobe's fastest round, its host and device time per pair, each floor (fastest
    round), the least of them and the median within rounds of floor / babelprobe, MFU and the baseline."""
    rows = []
    for name, _ in PHASES:
        ours = [r["babelprobe"][0]["phases"][name] for r in done]
        best = min(ours, key=lambda m: m.seconds)
        found = [r["floor"][0][name] for r in done]
        replay = min(f["replay"][0] for f in found)
        bare = {budget: min(f["bare"][budget][0] for f in found) for budget in found[0]["bare"]}
        budget = min(bare, key=bare.get) if bare else None
        arithmetic = flops.get(name, 0.0) / rate if flops.get(name) else None
        candidates = {key: value for key, value in (("replay", replay), (f"bare@{budget}", bare.get(budget)),
                                                     ("arithmetic", arithmetic)) if value is not None and value == value}
        least = min(candidates, key=candidates.get) if candidates else None
        fused = name == "extract" and not args.separate  # its model work is direct scoring's own passes

        def floor_of(f, at=0, arithmetic=arithmetic):  # a round's least floor in wall (0) or CPU (1) seconds
            values = [v for v in (f["replay"][at], *(b[at] for b in f["bare"].values()), arithmetic)
                      if v is not None and v == v]
            return min(values) if values else float("nan")

        base = [r["baseline"][0].get(name) for r in done]
        device_s = best.device_seconds
        rows.append({
            "phase": name, "seconds": round(best.seconds, 3), "cpu_seconds": round(best.cpu_seconds, 3),
            "host_ms_per_pair": _figures(1000 * best.cpu_seconds / n_pairs),
            "host_sys_ms_per_pair": _figures(1000 * best.sys_seconds / n_pairs),
            "device_ms_per_pair": _figures(1000 * device_s / n_pairs) if device_s == device_s else None,
            "overlap": round(best.seconds / max(best.cpu_seconds, device_s), 3) if device_s == device_s else None,
            "queued_s": round(best.queued, 3) if best.queued == best.queued else None,
            "overlap_own_core": round((best.seconds - best.queued) / max(best.cpu_seconds, device_s), 3)
            if device_s == device_s and best.queued == best.queued else None,
            "driving_cpu_s": round(best.driving_cpu, 3), "driving_wait_s": _driving_wait(best),
            "floor_replay": None if fused or replay != replay else round(replay, 3), "floor_bare": round(bare[budget], 3) if bare else None,
            "bare_budget": budget, "floor_arithmetic": round(arithmetic, 3) if arithmetic else None,
            "floor": "fused into direct" if fused else least,
            "floor_seconds": round(candidates[least], 3) if least else None,
            "floor_ratio": None if fused or not least else _median([floor_of(f) / m.seconds
                                                                     for f, m in zip(found, ours, strict=True)]),
            # CPU seconds: what a shared machine's other users change least (run with OMP_NUM_THREADS=1)
            "floor_cpu_ratio": None if fused or not least else _median([floor_of(f, 1) / m.cpu_seconds
                                                                         for f, m in zip(found, ours, strict=True)]),
            "mfu": round(flops.get(name, 0.0) / (best.seconds * rate), 3) if flops.get(name) else None,
            "flops": flops.get(name), "baseline": BASELINE_NAMES[name] if base[0] else "(skipped)",
            "baseline_seconds": round(min(b[0] for b in base), 3) if base[0] else None,
            "baseline_ratio": _median([b[0] / m.seconds for b, m in zip(base, ours, strict=True)]) if base[0] else None,
            "peak_gib": round(best.peak_gib, 2), "gpu_busy": round(best.gpu_busy, 2), "allocator": best.allocator,
            "rounds": len(done),
            **best.store.row(best.seconds)})
    total = min(r["babelprobe"][1] for r in done)
    all_flops = sum(flops.values())
    rows.append({"phase": "total", "seconds": round(total, 3), "flops": all_flops,
                 "mfu": round(all_flops / (total * rate), 3), "rounds": len(done)})
    return rows


def _driving_wait(meter: Meter) -> float | None:
    """On the synchronous simulated device, the seconds of the phase in which the thread that drives the device
    neither ran, nor was held by the device, nor waited for a CPU: its turns at the GIL beside the producer's and
    the finisher's Python, its waits for their chunks (the first chunk's preparation, the last one's finishing) and,
    where the phase writes the store, for room in the writer's queue and for its drain. The wall is the device's
    seconds, this thread's own CPU seconds, its run-queue wait and these (None on other devices, where the device
    runs beside the thread)."""
    clock = meter.clock
    if clock is None or clock.queued or meter.queued != meter.queued:
        return None
    return round(meter.seconds - meter.device_seconds - meter.driving_cpu - meter.queued, 3)


def _figures(value: float, digits: int = 4) -> float:
    """`value` to `digits` significant figures (a tiny shape's device ms per pair is not 0)."""
    return float(f"{value:.{digits}g}")


def _median(values: list[float]) -> float:
    return round(float(np.median(values)), 3)


def folds(args) -> int:
    """XCOMPS's 5 folds, fewer when a smoke run has fewer pairs per probe group than that (2 at least).
    With --pairs 1 a probe group is a language (its 4 negative types' pairs, see `run`)."""
    per_group = args.pairs if args.pairs > 1 else len(SUBSETS)
    return max(2, min(5, per_group))


# ---------------------------------------------------------------------------------------------- reporting

COLUMNS = (("phase", "phase"), ("seconds", "seconds"), ("host_ms_per_pair", "host ms/pair"),
           ("host_sys_ms_per_pair", "of which kernel"),
           ("device_ms_per_pair", "device ms/pair"), ("overlap", "wall/max(host, device)"),
           ("queued_s", "run-queue wait s"), ("overlap_own_core", "same, less the wait"),
           ("driving_cpu_s", "driving thread CPU s"), ("driving_wait_s", "driving thread's other waits s"),
           ("floor_replay", "replay s"), ("floor_bare", "bare s"), ("bare_budget", "bare budget"),
           ("floor_arithmetic", "arithmetic s"), ("floor", "least"), ("floor_ratio", "floor/babelprobe"),
           ("floor_cpu_ratio", "floor/babelprobe (CPU s)"),
           ("mfu", "MFU"), ("baseline_seconds", "baseline s"), ("baseline_ratio", "baseline/babelprobe"),
           ("peak_gib", "peak GiB"), ("gpu_busy", "GPU busy"),
           ("allocator", "CUDA allocator: mallocs/frees/retries"), ("store_wait_s", "store: loop's wait s"),
           ("store_drain_s", "store: drain s"), ("store_busy", "store writers busy"), ("store_mb", "store MB"))


def markdown(rows: list[dict], header: dict) -> str:
    lines = [f"**{header['shape']}** on {header['hardware']} ({header['pairs_total']} pairs, "
             f"{header['languages']} languages, batch_tokens {header['batch_tokens']}, {header['dtype']}, "
             f"{header['rounds']} round(s){', extraction separate' if header.get('separate') else ''}"
             f"{', shared machine' if header.get('shared') else ''}"
             f"{'' if header.get('probe_layers', 'all') == 'all' else ', probes of layer(s) ' + header['probe_layers']}"
             f"; matmul rate {header['rate'] / 1e12:.3g} "
             "TFLOP/s)", "",
             "| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = [r.get(key) for key, _ in COLUMNS]
        lines.append("| " + " | ".join("" if c is None or c != c else str(c) for c in cells) + " |")
    lines += ["", projection(rows, header)]
    return "\n".join(lines)


def projection(rows: list[dict], header: dict) -> str:
    """The FLOPs of this run and of the whole XCOMPS at this shape (per pair, scaled), and the time they take
    at 100% and 50% MFU on an H100."""
    flops = next(r["flops"] for r in rows if r["phase"] == "total")
    xcomps = flops / header["pairs_total"] * len(XCOMPS_LANGUAGES) * len(SUBSETS) * XCOMPS_PAIRS
    return (f"Model FLOPs: {flops:.3g} for these {header['pairs_total']} pairs; the whole XCOMPS (244,256 pairs) at "
            f"this shape: {xcomps:.3g}, {xcomps / H100_FLOPS / 60:.1f} min at 100% MFU and "
            f"{2 * xcomps / H100_FLOPS / 60:.1f} min at 50% MFU on an H100 (989 TFLOP/s dense bf16).")


def hardware(device: str) -> str:
    if device.startswith("simulated"):
        return f"a simulated H200{' (queued, launches paid)' if device == 'simulated-gpu' else ''} (perf/simulated.py) on CPU ({platform.processor() or platform.machine()})"
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def pair_count(value: str) -> int:
    if value in NAMED_PAIRS:
        return NAMED_PAIRS[value]
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pairs takes a number, xcomps or quarter, not {value!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="tiny", choices=[*SHAPES, "default"])
    parser.add_argument("--pairs", type=pair_count, default=4, help="pairs per language × negative type: a number, "
                        "xcomps (3,592: the whole XCOMPS) or quarter (898); probes use 5 folds, or --pairs folds when "
                        "fewer; with 1, one probe group per language (pair-grouped folds cannot split a single pair)")
    parser.add_argument("--languages", default=",".join(XCOMPS_LANGUAGES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda, cpu, simulated (perf/simulated.py: a stand-in of --shape that holds the "
                        "thread for the measured device time) or simulated-gpu (the stand-in's work queued as a GPU's, "
                        "the host paying each block's launches and waiting where a GPU run waits)")
    parser.add_argument("--dtype", help="float32, bfloat16 (default: bf16 on CUDA and simulated, fp32 on CPU)")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--store-dtype", choices=("float32", "float16", "bfloat16"),
                        help="the activation store's dtype (default: compare's, the model's own for a bfloat16 "
                        "model's last-token rows, 270 KB per item at the 8B shape; float32 on a CPU)")
    parser.add_argument("--separate", action="store_true", help="extraction as a pass of its own (not fused into "
                        "direct scoring)")
    parser.add_argument("--no-floors", action="store_true", help="measure no floor (the arithmetic one, computed, "
                        "stays): a run at scale, whose floors come from a smaller run")
    parser.add_argument("--replay-only", action="store_true", help="floors: only the replay of babelprobe's own "
                        "calls (no bare-forward sweep, no arithmetic floor)")
    parser.add_argument("--sweep-tokens", type=int, help="measure each bare-forward budget on at most this many "
                        "tokens of the phase, scaled up (default: all of them)")
    parser.add_argument("--probe-layers", default="all", metavar="SPEC", help="the layers the probe phase fits "
                        "(default all, as compare; a simulated run's store holds zeros: `0` keeps its probe phase short)")
    parser.add_argument("--tokenizer", metavar="DIR", help="the Llama shapes' tokenizer directory (default: the "
                        "default model's, converted once into the cache)")
    parser.add_argument("--baseline", action="store_true", help="also run the naive baselines (slow at 262k logits)")
    parser.add_argument("--no-baseline", action="store_true", help=argparse.SUPPRESS)  # the old default, now the default
    parser.add_argument("--no-sklearn", action="store_true", help="skip the scikit-learn probe baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tmp", help="where the run directory goes (default: the system's temporary dir)")
    parser.add_argument("--profile", metavar="FILE", help="profile one phase of the first round with torch's "
                        "profiler: a gzipped Chrome trace here, the operators' totals at FILE.txt (slows the phase)")
    parser.add_argument("--profile-phase", default="meta", choices=("direct", "meta", "neuro"),
                        help="the phase --profile profiles (default meta; direct includes a fused extraction)")
    parser.add_argument("--json", help="write the table as JSON here")
    parser.add_argument("--markdown", help="write the table as Markdown here")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="rounds in which compare, the floors and the baselines "
                        "take turns (perf/timing.py); ratios are the medians of the within-round ones")
    parser.add_argument("--shared", action="store_true", help="say in the table that the machine was shared")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs must be at least 1 (got {args.pairs})")
    if args.tmp and not Path(args.tmp).is_dir():  # before the model is built, not after
        parser.error(f"--tmp {args.tmp}: no such directory")
    rows, extra = run(args)
    n_languages = len(args.languages.split(","))
    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    header = {"shape": args.shape, "folds": folds(args), "hardware": hardware(args.device), "device": args.device,
              "dtype": dtype,
              "pairs_per_cell": args.pairs, "pairs_total": args.pairs * n_languages * len(SUBSETS),
              "languages": n_languages, "batch_tokens": args.batch_tokens, "torch": torch.__version__,
              "rounds": args.repeat, "shared": args.shared, "separate": args.separate, "rate": extra["rate"],
              "store_dtype": args.store_dtype or exact_dtype("last", dtype), "probe_layers": args.probe_layers}
    text = markdown(rows, header)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"run": header, "phases": rows}, indent=1, default=float),
                                   encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
