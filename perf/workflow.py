"""The whole XCOMPS workflow, timed per phase: `compare` (meta, direct, extraction, probes) end to end on
XCOMPS-sized synthetic items and a randomly initialised model, each phase against its limit measured
in the same run.

    .venv/bin/python perf/workflow.py --shape tiny --pairs 4 --device cpu          # a smoke run (the test)
    .venv/bin/python perf/workflow.py --shape llama-3.1-8b --pairs 135 --device cuda  # the headline goal

Items: the 17 XCOMPS languages × 4 negative types × `--pairs` minimal pairs. Each synthetic pair copies
the texts and concept fields of a random pair of the bundled `xcomps-sample` in the same language (or,
for the seven XCOMPS languages the sample lacks, of any language), so sentence and prompt lengths are
drawn like the sample's. Speed does not depend on weight values, so the model is built from a config
(`--shape`) with random weights; its vocabulary is the default tokenizer's (262k), which makes the
output layer of the Llama shapes about twice as large as Llama's own 128k one (direct and meta are
therefore measured on a harder case). `--shape tiny` (the smoke run) has a 2,000-token BPE trained on
the run's texts instead, so that it takes seconds. `--shape default` uses the real Gemma-3-270M.

Phases and their limits (the limit runs the same texts in babelprobe's own batches, nothing else):
  direct    sentence log-probabilities       vs a bare forward with full logits over the item texts
  meta      metalinguistic prompts, 2 orders vs a bare forward with full logits over every prompt+answer
  extract   every layer's last-token state   vs a bare forward of the model body (no output layer)
  probe     the probe sweep (all groups)      vs the scikit-learn loop on the same store (`--no-sklearn`: skip)
For each: wall seconds, tokens/s, the ratio limit/babelprobe (1.0 = as fast as the limit; probe: how
many times faster than scikit-learn), peak accelerator memory and, on CUDA with NVML, the GPU-busy
fraction. The table is printed and written as JSON and Markdown (`--json`, `--markdown`) so that a run
on a lent GPU can go into the README with the hardware named.
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


def build_model(shape: str, device: str, dtype: str | None, texts: list[str]):
    if shape == "default":
        return load_model("default", device=device, dtype=dtype)
    from transformers import AutoModelForCausalLM, LlamaConfig

    from babelprobe.models import parse_dtype

    tokenizer = small_tokenizer(texts) if shape == "tiny" else default_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=8192, bos_token_id=2, eos_token_id=1,
                         pad_token_id=0, tie_word_embeddings=False, **SHAPES[shape])
    torch_dtype = parse_dtype(dtype) or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    # a fixed fingerprint: hashing billions of random weights would take minutes and mean nothing
    return wrap_model(model.eval(), tokenizer, name=f"random {shape}", fingerprint=f"random-{shape}")


def default_tokenizer():
    from transformers import AutoTokenizer

    from babelprobe.models import _converted_default

    return AutoTokenizer.from_pretrained(_converted_default())


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

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.busy: list[float] = []

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._sampling = True
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.start
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
    """Seconds and tokens of the limit: the texts through the model in length-sorted batches under the
    token budget, with (`head`) or without the output layer."""
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


# ------------------------------------------------------------------------------------------------- the run

def run(args) -> list[dict]:
    device = torch.device(args.device)
    items = synthetic_items(args.pairs, tuple(args.languages.split(",")), seed=args.seed)
    lm = build_model(args.shape, args.device, args.dtype, [*items["text"], *meta_texts(items)])
    phases: dict[str, Meter] = {}

    # time compare's own stages: the stage runner (direct, meta, neuro) and the store step (extract)
    stage, ensure_store = RunDir.stage, comparison._ensure_store

    def timed_stage(self, name, settings, produce, output, read):
        with Meter(device) as phases[name]:
            return stage(self, name, settings, produce, output, read)

    def timed_store(*a, **k):
        with Meter(device) as phases["extract"]:
            return ensure_store(*a, **k)

    RunDir.stage, comparison._ensure_store = timed_stage, timed_store
    try:
        with tempfile.TemporaryDirectory(dir=args.tmp) as out, Meter(device) as total:
            comparison.compare(lm, items, out, folds=folds(args), batch_tokens=args.batch_tokens,
                               progress=not args.no_progress)
            limits = limit_runs(lm, items, Path(out) / "acts", args, device)
    finally:
        RunDir.stage, comparison._ensure_store = stage, ensure_store
    tokens = {"direct": limits["direct"][1], "meta": limits["meta"][1], "extract": limits["extract"][1]}
    rows = []
    for name, phase in (("direct", "direct"), ("meta", "meta"), ("extract", "extract"), ("probe", "neuro")):
        meter = phases[phase]
        limit = limits.get(name)
        row = {"phase": name, "seconds": round(meter.seconds, 3),
               "tokens_per_s": round(tokens[name] / meter.seconds, 1) if name in tokens else None,
               "limit": LIMIT_NAMES[name], "limit_seconds": round(limit[0], 3) if limit else None,
               "ratio": round(limit[0] / meter.seconds, 3) if limit else None,
               "peak_gib": round(meter.peak_gib, 2), "gpu_busy": round(meter.gpu_busy, 2)}
        rows.append(row)
    rows.append({"phase": "total", "seconds": round(total.seconds, 3), "limit": "", "tokens_per_s": None,
                 "limit_seconds": None, "ratio": None, "peak_gib": None, "gpu_busy": None})
    return rows


def folds(args) -> int:
    """XCOMPS's 5 folds, fewer when a smoke run has fewer pairs per group than that."""
    return min(5, args.pairs)


LIMIT_NAMES = {"direct": "bare forward with logits", "meta": "bare forward with logits",
               "extract": "bare forward, no head", "probe": "scikit-learn loop"}


def limit_runs(lm, items: pd.DataFrame, acts: Path, args, device) -> dict[str, tuple[float, int]]:
    limits = {"direct": bare_forward(lm, items["text"].tolist(), args.batch_tokens, True, device),
              "meta": bare_forward(lm, meta_texts(items), args.batch_tokens, True, device),
              "extract": bare_forward(lm, items["text"].tolist(), args.batch_tokens, False, device)}
    if not args.no_sklearn:
        from babelprobe.probes import sweep

        with Meter(device) as meter:
            sweep(acts, folds=folds(args), solver="sklearn", items=items, progress=False)
        limits["probe"] = (meter.seconds, 0)
    return limits


# ---------------------------------------------------------------------------------------------- reporting

def markdown(rows: list[dict], header: dict) -> str:
    lines = [f"**{header['shape']}** on {header['hardware']} ({header['pairs_total']} pairs, "
             f"{header['languages']} languages, batch_tokens {header['batch_tokens']}, {header['dtype']})", "",
             "| phase | seconds | tokens/s | limit | limit s | limit/babelprobe | peak GiB | GPU busy |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["phase"], r["seconds"], r["tokens_per_s"], r["limit"], r["limit_seconds"], r["ratio"],
                 r["peak_gib"], r["gpu_busy"]]
        lines.append("| " + " | ".join("" if c is None or c != c else str(c) for c in cells) + " |")
    return "\n".join(lines)


def hardware(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="tiny", choices=[*SHAPES, "default"])
    parser.add_argument("--pairs", type=int, default=4, help="pairs per language × negative type (XCOMPS: ~135); "
                        "probes use 5 folds, or --pairs folds when fewer")
    parser.add_argument("--languages", default=",".join(XCOMPS_LANGUAGES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", help="float32, bfloat16 (default: bf16 on CUDA, fp32 on CPU)")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--no-sklearn", action="store_true", help="skip the scikit-learn probe baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tmp", help="where the run directory goes (default: the system's temporary dir)")
    parser.add_argument("--json", help="write the table as JSON here")
    parser.add_argument("--markdown", help="write the table as Markdown here")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    rows = run(args)
    n_languages = len(args.languages.split(","))
    header = {"shape": args.shape, "folds": folds(args), "hardware": hardware(args.device), "device": args.device,
              "dtype": args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"),
              "pairs_per_cell": args.pairs, "pairs_total": args.pairs * n_languages * len(SUBSETS),
              "languages": n_languages, "batch_tokens": args.batch_tokens, "torch": torch.__version__}
    table = markdown(rows, header)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"run": header, "phases": rows}, indent=1), encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
