"""A simulated accelerator for perf/workflow.py (`--device simulated`): progress on overlapping host and
device work measured on a machine without a GPU.

The stand-in model has the shape of a real one (its config: layers, d_model, heads, the real tokenizer's
vocabulary) and is called exactly as babelprobe calls a real model (`lm.parts.body`, each block as a module,
so extraction's hooks fire; `lm.parts.logits`; KV caches in `DynamicCache`), but its forward does no
arithmetic: it holds the calling thread, with the GIL released (`time.sleep`), for the time the measured
device would take (`DEVICE_RATES`), and returns correctly shaped outputs whose values are never computed.

Those outputs are `SimTensor`s: tensors without data (their operations run on PyTorch's meta device, which
computes shapes only), so everything that would run on the device (gathering rows, the log-normaliser over
the vocabulary, copying KV rows) costs only its dispatch on the host, as a kernel launch does. A read back to
the host (`.cpu()`, `.item()`, a copy into a host tensor) gives zeros of the right shape and dtype. The real
tokenizer, prefix trees, batching, scoring tables and writing run unchanged; only the numbers are zeros.

Two ways to run the clock. `--device simulated` holds the thread that drives the device for each forward's
time (synchronous: that thread's own launches are in series with the device by construction). `--device
simulated-gpu` queues the work as a GPU does (a launch returns at once; the device works through its queue)
and makes the host pay what a real forward's launches cost (`Launches`: each block runs a real transformers
Llama decoder layer's operators at width 64, so the Python, the dispatch and the turns at the GIL are a real
model's), and waits where a GPU run waits: transformers' check of the attention mask at the start of each
forward (`padding_mask.all()` reads a device value; not under babelprobe's `prefix.SYNC_FREE_SDPA`), `.item()`
and plain reads back; babelprobe's page-locked
reads back per chunk and per extraction batch wait, like a CUDA event, only for the work queued before them
(`queued_reads`). Its busy share is the column NVML fills on a GPU.

Device time: `tokens × body_s_per_token` for a forward over `tokens` (batch rows × width, padding included;
each block is charged its share, so a forward stopped after a layer costs that share) plus `rows ×
head_s_per_row` for the vocabulary projection of `rows` states, and never less than reading the weights of
what ran once at H200's memory bandwidth (a small batch costs that much on a real GPU). The rates come from
the H200 run in perf/README.md "The whole workflow" (source below); shapes not measured there are scaled by their
FLOPs per token.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch
from torch import nn

# ------------------------------------------------------------------------------------------- the rates

# Source: perf/README.md "The whole workflow", NVIDIA H200, 2026-11-26, llama-3.1-8b shapes, random weights, bfloat16,
# torch 2.11.0+cu130, 9,180 XCOMPS-sized pairs (171,828 text tokens), batch budget 4096:
#   body: "body forward, own batches" 5.443 s / 171,828 tokens                          = 31.7 us per token;
#   head: direct's floor (body + needed rows' logits) 6.897 s minus the body's 5.443 s over the
#         153,468 scored rows (every token but BOS)                                      = 9.47 us per row.
MEASURED = {"llama-3.1-8b": {"body_s_per_token": 5.443 / 171_828, "head_s_per_row": (6.897 - 5.443) / 153_468,
                             "source": "perf/README.md 'The whole workflow', H200 2026-11-26"}}


# A pass cannot be faster than reading its weights once: H200 memory bandwidth, 4.8 TB/s (NVIDIA's data sheet).
BANDWIDTH = 4.8e12


@dataclass(frozen=True)
class Rates:
    body_s_per_token: float
    head_s_per_row: float
    source: str
    body_min_s: float = 0.0  # the least a body forward costs (its blocks' weights read once)
    head_min_s: float = 0.0  # the least a projection costs (the output layer's weights read once)


def device_rates(shape: str, config, dtype=torch.bfloat16) -> Rates:
    """The measured rates of `shape`, else the 8B ones scaled by FLOPs per token (body: 2 × parameters
    of the blocks; head: 2 × d_model × vocabulary); with the least time of a pass (its weights read at
    `BANDWIDTH`)."""
    size = torch.finfo(dtype).bits // 8
    floors = {"body_min_s": block_flops(config) / 2 * size / BANDWIDTH,
              "head_min_s": config.hidden_size * config.vocab_size * size / BANDWIDTH}
    if shape in MEASURED:
        return Rates(**MEASURED[shape], **floors)
    from transformers import LlamaConfig

    ref = MEASURED["llama-3.1-8b"]
    big = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=config.vocab_size)
    body = block_flops(config) / block_flops(big)
    head = config.hidden_size / big.hidden_size
    return Rates(ref["body_s_per_token"] * body, ref["head_s_per_row"] * head,
                 f"scaled from llama-3.1-8b by FLOPs per token ({ref['source']})", **floors)


def block_flops(config) -> float:
    """Multiply-add FLOPs per token of the decoder blocks (2 × their weight count; attention over the
    context is left out: the texts are short)."""
    d, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", heads) or heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    attention = d * head_dim * (heads + 2 * kv) + heads * head_dim * d
    return 2.0 * layers * (attention + 3 * d * inner)


# ------------------------------------------------------------------------------------- tensors without data

class SimTensor(torch.Tensor):
    """A tensor that lives on the simulated device: shape, dtype and strides, no values (see module
    docstring). Operations run on the meta device; reading back gives zeros."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
                                                   device=inner.device, requires_grad=False)

    def __init__(self, inner: torch.Tensor):
        self.inner = inner

    def __repr__(self):
        return f"SimTensor(shape={tuple(self.shape)}, dtype={self.dtype})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in (aten._to_copy, aten.to) and _to_host(args, kwargs):
            dtype = kwargs.get("dtype") or next((a for a in args[1:] if isinstance(a, torch.dtype)), args[0].dtype)
            _read_back()
            return host_zeros(tuple(args[0].shape), dtype)  # a read back to the host
        if func is aten.copy_.default and not isinstance(args[0], SimTensor) and args[0].device.type != "meta":
            _read_back()
            return args[0].zero_()  # a read into a host tensor
        if func is aten._local_scalar_dense.default:
            _read_back()
            return 0
        shortcut = SHAPE_RULES.get(func)
        if shortcut is not None:
            out = shortcut(*args, **kwargs)
            if out is not None:
                return out
        out = func(*[_to_meta(a) for a in args], **{k: _to_meta(v) for k, v in kwargs.items()})
        return _wrap(out) if isinstance(out, torch.Tensor) else type(out)(_wrap(o) for o in out) \
            if isinstance(out, (tuple, list)) else out


aten = torch.ops.aten


def _to_host(args, kwargs) -> bool:
    """Whether a `to`/`_to_copy` call moves to a real device (the host): its device argument is not meta."""
    device = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (torch.device, str))), None))
    if device is None and len(args) > 1 and isinstance(args[1], torch.Tensor):
        device = args[1].device  # `to(other)`
    return device is not None and torch.device(device).type != "meta"


def _to_meta(value):
    if isinstance(value, SimTensor):
        return value.inner
    if isinstance(value, torch.Tensor):
        return value if value.device.type == "meta" else torch.empty_strided(
            value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    return value


def _wrap(value):
    return SimTensor(value) if isinstance(value, torch.Tensor) and value.device.type == "meta" else value


# Shapes of the hot operations worked out directly: the meta device's own rules for these are written in
# Python and cost far more per call than launching a kernel does (the simulation would overstate host work).

def _index(self, indices):
    """Advanced indexing by integer tensors on the leading dimensions (`x[rows, cols]`, `x[index]`)."""
    if any(i is None or i.dtype in (torch.bool, torch.uint8) for i in indices):
        return None
    shapes = {tuple(i.shape) for i in indices}
    shape = (shapes.pop() if len(shapes) == 1 else tuple(torch.broadcast_shapes(*shapes))) + tuple(
        self.shape[len(indices):])
    return empty(*shape, dtype=self.dtype)


def _cat(tensors, dim=0):
    tensors = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)]  # legacy: empty 1-d tensors skipped
    if not tensors:
        return None
    first = tensors[0]
    dim = dim % first.dim()
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    return empty(*shape, dtype=first.dtype)


def _stack(tensors, dim=0):
    shape = list(tensors[0].shape)
    shape.insert(dim % (len(shape) + 1), len(tensors))
    return empty(*shape, dtype=tensors[0].dtype)


def _unbind(self, dim=0):
    shape = list(self.shape)
    del shape[dim % len(shape)]
    return [empty(*shape, dtype=self.dtype) for _ in range(self.shape[dim])]


def _in_place(self, *args, **kwargs):
    return self if isinstance(self, SimTensor) else None


def _slice(self, dim=0, start=None, end=None, step=1):
    """A view of every `step`-th index in [start, end) of `dim` (Python's clamping), the parent's strides."""
    dim = dim % self.dim()
    shape, strides = list(self.shape), list(self.stride())
    shape[dim] = len(range(*slice(start, end, step).indices(shape[dim])))
    strides[dim] *= step
    return SimTensor(torch.empty_strided(shape, strides, dtype=self.dtype, device="meta"))


def _sub(self, other, *, alpha=1):
    """Elementwise difference of contiguous operands (broadcast, dtypes promoted); others go to the meta rule,
    which also lays the result out after a permuted operand."""
    tensors = [t for t in (self, other) if isinstance(t, torch.Tensor)]
    if not all(t.is_contiguous() for t in tensors):
        return None
    dtype = torch.result_type(_to_meta(self), _to_meta(other))
    return empty(*torch.broadcast_shapes(*(t.shape for t in tensors)), dtype=dtype)


def _reduced_shape(self, dim, keepdim: bool) -> list[int]:
    dims = range(self.dim()) if dim is None or len(dim) == 0 else [d % self.dim() for d in dim]
    return [1 if j in dims else n for j, n in enumerate(self.shape) if keepdim or j not in dims]


def _amax(self, dim=(), keepdim=False):
    return empty(*_reduced_shape(self, dim, keepdim), dtype=self.dtype) if self.is_contiguous() else None


def _sum(self, dim=None, keepdim=False, *, dtype=None):
    if not self.is_contiguous():
        return None
    if dtype is None:  # integers and flags sum in int64, as torch does
        dtype = self.dtype if self.dtype.is_floating_point or self.dtype.is_complex else torch.int64
    return empty(*_reduced_shape(self, dim, keepdim), dtype=dtype)


SHAPE_RULES = {aten.index.Tensor: _index, aten.cat.default: _cat, aten.index_put_.default: _in_place,
               aten.stack.default: _stack, aten.unbind.int: _unbind, aten.exp_.default: _in_place,
               aten.log_.default: _in_place, aten.sub_.Tensor: _in_place, aten.add_.Tensor: _in_place,
               aten.slice.Tensor: _slice, aten.sub.Tensor: _sub, aten.amax.default: _amax,
               aten.sum.dim_IntList: _sum}


def empty(*shape: int, dtype=torch.float32) -> SimTensor:
    return SimTensor(torch.empty(shape, dtype=dtype, device="meta"))


READ_BACK_CACHE = 1 << 20  # bytes: larger read backs share one buffer of zeros per shape


def host_zeros(shape: tuple[int, ...], dtype) -> torch.Tensor:
    """What a read back gives: zeros (True for flags). A large one (pooled states of a batch) is a buffer kept per
    shape, as a GPU's reads land in page-locked memory that PyTorch's host allocator keeps and reuses; a new buffer each
    time would charge the host for faulting in fresh pages, which a real run does not pay."""
    n = torch.Size(shape).numel()
    if dtype == torch.bool:  # flags computed on the device (extraction's finite rows): zeros are finite
        return torch.ones(shape, dtype=dtype)
    if n * dtype.itemsize < READ_BACK_CACHE:
        return torch.zeros(shape, dtype=dtype)
    kept = _KEPT.get(dtype)
    if kept is None or kept.numel() < n:
        kept = _KEPT[dtype] = torch.zeros(max(n, 2 * (0 if kept is None else kept.numel())), dtype=dtype)
    return kept[:n].view(shape)


_KEPT: dict[torch.dtype, torch.Tensor] = {}  # the zeros large read backs share, one buffer per dtype

# ------------------------------------------------------------------------------------------- the device

class Device:
    """The simulated device's clock. Work is charged (`charge`) as it is queued. Synchronous (the default), the
    calling thread is held for it (`settle`: once per forward pass or projection, not once per block, so that
    waking up from many short sleeps on a loaded machine does not add to the device time). Queued (`queued`,
    `--device simulated-gpu`), work runs while the host goes on, as a GPU's launches return at once: it starts
    when the work before it is done or when it is launched, whichever is later, and the host waits only where
    a GPU run waits (`wait`: a read back, transformers' check of the attention mask at each forward). `busy`
    is the device time charged; the thread's sleeps are kept to it over many calls."""

    def __init__(self, rates: Rates, queued: bool = False, clock=time.perf_counter, sleep=time.sleep):
        self.rates, self.busy, self.owed, self.debt, self.queued = rates, 0.0, 0.0, 0.0, queued
        self.free_at = 0.0  # queued: when the work charged so far is done (on `clock`)
        self.clock, self.sleep = clock, sleep
        self.lock = threading.Lock()

    def charge(self, seconds: float) -> None:
        with self.lock:
            self.busy += seconds
            if self.queued:
                self.free_at = max(self.free_at, self.clock()) + seconds
            else:
                self.owed += seconds

    def settle(self) -> None:
        """Synchronous: hold the calling thread (GIL released) for the work charged since the last settle.
        Queued: nothing (the host does not wait for a launch)."""
        if self.queued:
            return
        with self.lock:
            owed, self.owed = self.owed, 0.0
        target = owed - self.debt
        if target <= 0:
            self.debt = -target
            return
        start = self.clock()
        self.sleep(target)
        self.debt = self.clock() - start - target

    def wait(self) -> None:
        """A synchronisation: hold the calling thread (GIL released) until the work queued so far is done
        (the synchronous device has done it already)."""
        with self.lock:
            left = self.free_at - self.clock() if self.queued else 0.0
        if left > 0:
            self.sleep(left)


CLOCK: list[Device] = []  # the device of this process's stand-in: a read back waits for it
_QUEUED_READ = threading.local()  # set while a read back is queued as a GPU run queues it (`queued_reads`)


def _read_back() -> None:
    """A read back to the host waits for the device's work before it, unless it is one that a GPU run queues
    (page-locked, non-blocking, an event after it: `queued_reads`)."""
    if CLOCK and not getattr(_QUEUED_READ, "on", False):
        CLOCK[-1].wait()


def queued_reads() -> None:
    """babelprobe's one read back per chunk (`Readback`) and per extraction batch (`Pooler.result_async`) as a
    GPU run has them: queued without waiting, their `wait()` waiting for the device work launched before them
    only (a CUDA event's semantics), asleep (babelprobe's events block: `models.copies_done`). A patch of this
    process's babelprobe classes, installed by perf/workflow.py for `--device simulated-gpu` (on the synchronous
    device every read is already done)."""
    from babelprobe.benchmarks.core.logprobs import Readback
    from babelprobe.extract.capture import PooledRows, Pooler

    def queued(make):
        done_at = CLOCK[-1].free_at
        _QUEUED_READ.on = True
        try:
            return make(), done_at
        finally:
            _QUEUED_READ.on = False

    def until(done_at: float) -> None:
        left = done_at - time.perf_counter()
        if left > 0:
            time.sleep(left)

    readback_init, readback_wait = Readback.__init__, Readback.wait
    result_async, rows_wait = Pooler.result_async, PooledRows.wait

    def init(self, values):
        _, self.sim_done_at = queued(lambda: readback_init(self, values))

    def pooled(self, *args, **kwargs):
        rows, rows.sim_done_at = queued(lambda: result_async(self, *args, **kwargs))
        return rows

    def readback_waited(self):
        until(self.sim_done_at)
        return readback_wait(self)

    def rows_waited(self):
        until(getattr(self, "sim_done_at", 0.0))
        return rows_wait(self)

    Readback.__init__, Readback.wait = init, readback_waited
    Pooler.result_async, PooledRows.wait = pooled, rows_waited


class Launches:
    """The host's side of a real forward: a transformers Llama with the stand-in's number of decoder layers
    at width 64 (`launch(i)` runs layer i's operators on 1 × 4 tokens, `start()` the embedding and rotary
    tables), so that each block costs the host what launching a real block's few dozen operators costs
    (perf/gil.py: ~25-30 ms for 32 layers on the development machine), its Python and its turns at the GIL."""

    def __init__(self, n_layers: int):
        from transformers import LlamaConfig, LlamaModel

        config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=128)
        self.model = LlamaModel(config).eval()
        self.ids = torch.zeros(1, 4, dtype=torch.long)
        self.positions = torch.arange(4)[None]
        self.hidden, self.rotary = None, None

    def start(self) -> None:
        with torch.inference_mode():
            self.hidden = self.model.embed_tokens(self.ids)
            self.rotary = self.model.rotary_emb(self.hidden, self.positions)

    def launch(self, index: int) -> None:
        with torch.inference_mode():
            out = self.model.layers[index](self.hidden, position_embeddings=self.rotary, position_ids=self.positions)
            self.hidden = out[0] if isinstance(out, tuple) else out


class SimBlock(nn.Module):
    """One decoder block: appends its keys and values to a cache it is given, returns its input as output,
    and charges the device its share of the forward."""

    def __init__(self, index: int, device: Device, share: float, kv_shape: tuple[int, int], dtype,
                 launches: Launches | None = None):
        super().__init__()
        self.index, self.device, self.share, self.kv_shape, self.dtype = index, device, share, kv_shape, dtype
        self.launches = launches

    def forward(self, hidden, cache=None, **_):
        if self.launches is not None:
            self.launches.launch(self.index)
        batch, width = hidden.shape[:2]
        if cache is not None:
            heads, head_dim = self.kv_shape
            cache.update(empty(batch, heads, width, head_dim, dtype=self.dtype),
                         empty(batch, heads, width, head_dim, dtype=self.dtype), self.index)
        rates = self.device.rates
        self.device.charge(max(batch * width * rates.body_s_per_token, rates.body_min_s) * self.share)
        return hidden


class SimBody(nn.Module):
    """The model body (embeddings, blocks, final norm) as babelprobe calls it: keyword inputs, an optional
    cache, hidden states after the final norm in `last_hidden_state`."""

    _supports_attention_backend = True  # as a Llama body's: its attention is switched as a real Llama's is

    def __init__(self, config, device: Device, dtype, launches: Launches | None = None):
        super().__init__()
        config._attn_implementation = config._attn_implementation or "sdpa"  # a real model's default
        self.config, self.dtype, self.device, self.launches = config, dtype, device, launches
        heads = config.num_attention_heads
        kv = (config.num_key_value_heads or heads, getattr(config, "head_dim", None) or config.hidden_size // heads)
        self.embed_tokens = nn.Identity()
        self.layers = nn.ModuleList(SimBlock(i, device, 1 / config.num_hidden_layers, kv, dtype, launches)
                                    for i in range(config.num_hidden_layers))
        self.norm = nn.Identity()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                use_cache=None, past_key_values=None, **kwargs):
        from transformers.modeling_outputs import BaseModelOutputWithPast

        cache = cache if cache is not None else past_key_values  # transformers before 5.2x: past_key_values
        if attention_mask is not None and self.config._attn_implementation == "sdpa":
            self.device.wait()  # transformers' SDPA mask check reads the mask's value (`padding_mask.all()`)
        if self.launches is not None:
            self.launches.start()
        batch, width = input_ids.shape
        hidden = empty(batch, width, self.config.hidden_size, dtype=self.dtype)
        try:
            for block in self.layers:  # as modules: hooks on them fire (and may stop the pass)
                hidden = block(hidden, cache=cache)
        finally:
            self.device.settle()
        field = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden), **{field: cache})

    def get_input_embeddings(self):
        return self.embed_tokens


class SimHead(nn.Module):
    """The vocabulary projection: [rows, d] -> [rows, vocab] logits without values, charged per row."""

    def __init__(self, vocab: int, d_model: int, device: Device, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, d_model, dtype=dtype, device="meta"), requires_grad=False)
        self.device = device

    def forward(self, hidden):
        rows = hidden.numel() // hidden.shape[-1]
        rates = self.device.rates
        self.device.charge(max(rows * rates.head_s_per_row, rates.head_min_s))
        self.device.settle()
        return empty(*hidden.shape[:-1], self.weight.shape[0], dtype=self.weight.dtype)


class SimCausalLM(nn.Module):
    """What `LoadedModel.model` is: the config, the body, the head, and HF's forward (for the baselines)."""

    def __init__(self, config, device: Device, dtype, launches: Launches | None = None):
        super().__init__()
        self.config = config
        self.model = SimBody(config, device, dtype, launches)
        self.lm_head = SimHead(config.vocab_size, config.hidden_size, device, dtype)

    def forward(self, input_ids=None, logits_to_keep=0, **kwargs):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        hidden = self.model(input_ids=input_ids, **kwargs).last_hidden_state
        kept = hidden if not logits_to_keep else hidden[:, -logits_to_keep:]
        return CausalLMOutputWithPast(logits=self.lm_head(kept))


def device_pooler():
    """Extraction's `Pooler` with its buffers on the simulated device, where a GPU run has them (the batch's
    mask lives there): pooling each layer is device work and the pooled rows come back in one read per
    batch. The stand-in's inputs stay on the host, so without this every layer's pooled rows would be read
    back and copied on the host, work a GPU run does not do. A patch of the process's extraction modules:
    installed by perf/workflow.py in its own process when it runs the simulated device, never by
    `simulated_model` (a test building the stand-in must leave real extraction as it is)."""
    import babelprobe.extract.fused as fused
    import babelprobe.extract.run as run
    from babelprobe.extract.capture import Pooler

    class DevicePooler(Pooler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.rows, self.last_index, self.weights = (SimTensor(_to_meta(t)) for t in
                                                        (self.rows, self.last_index, self.weights))
            self._on = {torch.device("meta"): (self.rows, self.last_index, self.weights)}
            self.out = {pool: empty(*values.shape, dtype=values.dtype) for pool, values in self.out.items()}

    fused.Pooler = run.Pooler = DevicePooler


def simulated_model(shape: str, config, tokenizer, dtype=torch.bfloat16, gpu_like: bool = False):
    """A `LoadedModel` of `config`'s shape on the simulated device (module docstring), and its `Device`.
    `gpu_like`: the device queued and each block's launches paid on the host (`Device`, `Launches`)."""
    from babelprobe.models import LoadedModel, Parts

    device = Device(device_rates(shape, config, dtype), queued=gpu_like)
    CLOCK[:] = [device]
    launches = Launches(config.num_hidden_layers) if gpu_like else None
    model = SimCausalLM(config, device, dtype, launches).eval()
    body = model.model
    parts = Parts(body=body, embed=body.embed_tokens, layers=body.layers, final_norm=body.norm, head=model.lm_head,
                  softcap=None, device=None)  # outputs stay on the simulated device
    lm = LoadedModel(model=model, tokenizer=tokenizer, name=f"simulated {shape}", fingerprint=f"simulated-{shape}",
                     device=torch.device("cpu"), dtype=dtype, bos_token_id=tokenizer.bos_token_id,
                     max_length=int(config.max_position_embeddings), parts=parts)
    return lm, device
