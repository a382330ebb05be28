"""Text generation for the generative benchmarks (ECLEKTIC answers, self-consistency translations,
Cross-Lingual Pitfalls perturbations): one small interface, two backends.

    gen = make_generator("local", lm)                                   # the loaded model
    gen = make_generator("openai:gpt-4o-mini@https://api.openai.com/v1")  # any OpenAI-compatible server
    outputs = gen.generate(prompts, max_new_tokens=32, stop=["\\n"])

A `Generator` returns one string per prompt: the continuation only (never the prompt), cut before the
first stop string that follows its first non-space character (so a continuation that opens with a
line break still yields its first line when the stop is "\\n"); nothing else is stripped. Decoding is
greedy unless `temperature > 0` is asked for (`generate(..., temperature=0.7, seed=0)`): then tokens
are sampled from the temperature-scaled distribution (no top-k/top-p cut), reproducibly for a seed.

**local** (`local_generator(lm)`): greedy decoding with Hugging Face `generate`, prompts tokenised like
every other stage (`LoadedModel.encode`, BOS first), sorted by length and batched with left padding;
the attention mask hides the padding and position ids count from each prompt's first real token, so
a batched output equals the one-prompt-at-a-time output (tests check this against HF `generate`).
Generation stops at the model's end-of-sequence tokens, after `max_new_tokens`, or, per prompt, as
soon as a stop string appears in its decoded continuation.

**openai** (`openai_generator(base_url, model)`): an OpenAI-compatible HTTP endpoint, `/v1/chat/
completions` (spec `openai:MODEL@URL`; the prompt is one user message) or `/v1/completions` (spec
`openai-completions:MODEL@URL`; the prompt is continued as is). Temperature 0, one request per
prompt, optionally several in flight (`workers`). Timeouts, connection errors, HTTP 429 and 5xx and
malformed JSON are retried with exponential back-off (429's Retry-After is honoured); other HTTP
errors stop at once; when the retries are spent a one-line `BabelprobeError` says why. The API key
is read from an environment variable (default OPENAI_API_KEY) at request time; it is never stored on
the object, logged, printed or put in an error message (server messages are scrubbed of it).

**Resuming** (`generate_cached`): benchmarks send prompts through a JSONL cache in their output
directory, appended chunk by chunk, so an interrupted run keeps what was generated and the same
command continues from there.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from tqdm.auto import tqdm

from babelprobe.benchmarks.core.options import CHAT_TEMPLATE, SPEC_HELP
from babelprobe.errors import BabelprobeError
from babelprobe.models import LoadedModel, pad_batch
from babelprobe.runs import JsonlMemo

MAX_RETRY_AFTER = 60.0  # seconds; a server asking for longer is waited for this long, then asked again


@runtime_checkable
class Generator(Protocol):
    """Anything that turns prompts into continuations; `name` identifies it in result rows and caches."""

    name: str

    def generate(self, prompts: list[str], max_new_tokens: int = 64, stop: list[str] | None = None,
                 temperature: float = 0.0, seed: int = 0) -> list[str]:
        ...


def cut_at_stop(text: str, stop: list[str] | None) -> str:
    """`text` up to (not including) the earliest stop string that occurs after its first non-space
    character: a continuation that opens with a line break is cut at the end of its first real line,
    not to nothing."""
    start = len(text) - len(text.lstrip())
    cut = len(text)
    for s in stop or []:
        found = text.find(s, start) if s else -1
        if 0 <= found < cut:
            cut = found
    return text[:cut]


def _check_max_new_tokens(max_new_tokens: int) -> None:
    if int(max_new_tokens) < 1:
        raise BabelprobeError(f"max_new_tokens must be at least 1, got {max_new_tokens}")


def _check_temperature(temperature: float) -> None:
    if not 0 <= float(temperature) <= 2:
        raise BabelprobeError(f"temperature must lie in 0..2, got {temperature}")


# ------------------------------------------------------------------------------------------------ local

class _StopStrings:
    """HF stopping criterion: a row is done once its decoded continuation contains a stop string."""

    def __init__(self, tokenizer, stop: list[str], prompt_width: int):
        self.tokenizer, self.stop, self.width = tokenizer, [s for s in stop if s], prompt_width

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.width:], skip_special_tokens=True)
        return torch.tensor([cut_at_stop(t, self.stop) != t for t in texts], device=input_ids.device)


class LocalGenerator:
    """Greedy, batched generation with a loaded HF model (see module docstring)."""

    def __init__(self, lm: LoadedModel, batch_size: int = 8, chat_template: bool = False, progress: bool = False):
        if batch_size < 1:
            raise BabelprobeError(f"batch_size must be at least 1, got {batch_size}")
        if chat_template and not getattr(lm.tokenizer, "chat_template", None):
            raise BabelprobeError(f"model {lm.name} has no chat template; generate without chat_template")
        self.lm, self.batch_size, self.chat_template, self.progress = lm, batch_size, chat_template, progress
        # The name keys generation caches: the same prompt through the chat template is another generation.
        self.name = f"local:{lm.name}" + (" (chat template)" if chat_template else "")
        self.fingerprint = lm.fingerprint  # caches key on it: same name, different weights = different outputs
        self.preferred_chunk = 4 * batch_size  # prompts between two saves of a resumable run

    def __repr__(self) -> str:
        return f"LocalGenerator({self.name!r}, batch_size={self.batch_size})"

    def generate(self, prompts: list[str], max_new_tokens: int = 64, stop: list[str] | None = None,
                 temperature: float = 0.0, seed: int = 0) -> list[str]:
        _check_max_new_tokens(max_new_tokens)
        _check_temperature(temperature)
        encodings = self.lm.encode([self._render(p) for p in prompts], truncate=True)
        for i, enc in enumerate(encodings):
            if enc.truncated or len(enc.ids) + max_new_tokens > self.lm.max_length:
                raise BabelprobeError(f"prompt #{i} ({prompts[i][:40]!r}...) with max_new_tokens={max_new_tokens} "
                                      f"does not fit the model's context of {self.lm.max_length} tokens; shorten it")
        order = sorted(range(len(prompts)), key=lambda i: -len(encodings[i].ids))  # little padding per batch
        outputs: list[str] = [""] * len(prompts)
        with tqdm(total=len(prompts), desc="generating", unit="prompt", disable=not self.progress,
                  dynamic_ncols=True) as bar:
            for start in range(0, len(order), self.batch_size):
                batch = order[start:start + self.batch_size]
                if temperature > 0:  # one seed per batch: the same prompts in the same order sample the same
                    torch.manual_seed(seed + start)
                for i, text in zip(batch, self._generate_batch([encodings[i] for i in batch], max_new_tokens, stop,
                                                               temperature)):
                    outputs[i] = text
                bar.update(len(batch))
        return outputs

    def _render(self, prompt: str) -> str:
        if not self.chat_template:
            return prompt
        tok = self.lm.tokenizer
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                       add_generation_prompt=True)
        return text.removeprefix(tok.bos_token or "\0")  # encode() puts BOS first itself

    def _eos_ids(self) -> list[int]:
        configured = getattr(self.lm.model.generation_config, "eos_token_id", None)
        ids = configured if isinstance(configured, list) else [configured]
        return sorted({i for i in [*ids, self.lm.tokenizer.eos_token_id] if i is not None})

    def _generate_batch(self, encodings, max_new_tokens: int, stop: list[str] | None,
                        temperature: float = 0.0) -> list[str]:
        from transformers import GenerationConfig, StoppingCriteriaList

        lm = self.lm
        inputs = pad_batch(encodings, lm.pad_token_id, "left", lm.device)
        width = inputs["input_ids"].shape[1]
        eos = self._eos_ids()
        # A fresh config: greedy (or plain temperature sampling) and nothing else, whatever sampling defaults
        # the checkpoint ships with.
        sampling = {"do_sample": True, "temperature": float(temperature), "top_k": 0, "top_p": 1.0} \
            if temperature > 0 else {"do_sample": False}
        config = GenerationConfig(**sampling, max_new_tokens=int(max_new_tokens), pad_token_id=lm.pad_token_id,
                                  eos_token_id=eos or None, bos_token_id=lm.bos_token_id)
        criteria = StoppingCriteriaList([_StopStrings(lm.tokenizer, stop, width)]) if stop else None
        with torch.inference_mode():
            sequences = lm.model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                          generation_config=config, stopping_criteria=criteria)
        texts = []
        for row in sequences[:, width:].tolist():
            end = next((k for k, token in enumerate(row) if token in eos), len(row))
            texts.append(cut_at_stop(lm.tokenizer.decode(row[:end], skip_special_tokens=True), stop))
        return texts


def local_generator(lm: LoadedModel, batch_size: int = 8, chat_template: bool = False,
                    progress: bool = False) -> LocalGenerator:
    """Greedy batched generation with `lm`; `chat_template` wraps each prompt as a user turn (instruct models)."""
    return LocalGenerator(lm, batch_size=batch_size, chat_template=chat_template, progress=progress)


def with_chat_template(generator: Generator, mode: str) -> Generator:
    """`generator` with each prompt sent as the user turn of its model's chat template, as `mode` says
    (`CHAT_TEMPLATE`): off, as it is; auto, a local generator whose model has a chat template; on, a local
    generator (a model without a template: an error). A non-local generator stays as it is under auto
    (an `openai:` chat endpoint sends a user turn by itself) and is an error under on."""
    if mode not in CHAT_TEMPLATE:
        raise BabelprobeError(f"--chat-template: unknown value {mode!r}; use {', '.join(CHAT_TEMPLATE)}")
    if mode == "off" or getattr(generator, "chat_template", False):
        return generator
    if not isinstance(generator, LocalGenerator):
        if mode == "on":
            raise BabelprobeError(f"--chat-template on applies to local generators, not {generator.name!r} "
                                  "(openai: chat endpoints always send a user turn); use --chat-template auto or off")
        return generator
    if mode == "auto" and not getattr(generator.lm.tokenizer, "chat_template", None):
        return generator
    return local_generator(generator.lm, batch_size=generator.batch_size, chat_template=True,
                           progress=generator.progress)


# ----------------------------------------------------------------------------------------------- openai

class RateLimiter:
    """At most `per_second` request starts per second, shared by all worker threads."""

    def __init__(self, per_second: float | None, clock=time.monotonic, sleep=time.sleep):
        if per_second is not None and per_second <= 0:
            raise BabelprobeError(f"rate limit must be a positive number of requests per second, got {per_second}")
        self.interval = 1.0 / per_second if per_second else 0.0
        self.clock, self.sleep = clock, sleep
        self.next_start = float("-inf")
        self.lock = threading.Lock()

    def wait(self) -> None:
        """Block until this caller may start a request (each caller gets its own slot)."""
        if not self.interval:
            return
        with self.lock:
            now = self.clock()
            start = max(now, self.next_start)
            self.next_start = start + self.interval
        if start > now:
            self.sleep(start - now)


class _Retry(Exception):
    """A failure worth another attempt; `after` is the server's Retry-After, if any."""

    def __init__(self, reason: str, after: float | None = None):
        super().__init__(reason)
        self.after = after


class OpenAIGenerator:
    """Completions from an OpenAI-compatible HTTP server (see module docstring)."""

    def __init__(self, base_url: str, model: str, api_key_env: str | None = "OPENAI_API_KEY", timeout: float = 60.0,
                 retries: int = 3, rate_limit: float | None = None, endpoint: str = "chat", workers: int = 1,
                 backoff: float = 1.0, progress: bool = False):
        if endpoint not in ("chat", "completions"):
            raise BabelprobeError(f"unknown endpoint {endpoint!r}; use 'chat' or 'completions'")
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise BabelprobeError(f"endpoint URL {base_url!r} is not an http(s) URL; e.g. http://127.0.0.1:8080/v1")
        if parsed.username or parsed.password:
            raise BabelprobeError("endpoint URL must not contain credentials; put the API key in an environment "
                                  "variable and name it with --api-key-env")
        if timeout <= 0 or retries < 0 or workers < 1:
            raise BabelprobeError(f"need timeout > 0, retries >= 0 and workers >= 1 (got {timeout}, {retries}, {workers})")
        self.model, self.endpoint, self.api_key_env = model, endpoint, api_key_env
        self.timeout, self.retries, self.workers, self.backoff, self.progress = timeout, retries, workers, backoff, progress
        self.base_url = base_url.rstrip("/")
        root = self.base_url if self.base_url.endswith("/v1") else self.base_url + "/v1"
        self.url = root + ("/chat/completions" if endpoint == "chat" else "/completions")
        self.limiter = RateLimiter(rate_limit)
        prefix = "openai" if endpoint == "chat" else "openai-completions"
        self.name = f"{prefix}:{model}@{self.base_url}"
        self.fingerprint = self.name
        self.preferred_chunk = workers  # every answer is saved as soon as it arrives (they cost money)
        # Loopback servers (tests, llama.cpp on this machine) are reached directly, never through a proxy.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({})) if _is_loopback(parsed.hostname) \
            else urllib.request.build_opener()

    def __repr__(self) -> str:  # no key here: it is never stored on the object
        return f"OpenAIGenerator({self.name!r}, api_key_env={self.api_key_env!r})"

    def generate(self, prompts: list[str], max_new_tokens: int = 64, stop: list[str] | None = None,
                 temperature: float = 0.0, seed: int = 0) -> list[str]:
        _check_max_new_tokens(max_new_tokens)
        _check_temperature(temperature)
        with tqdm(total=len(prompts), desc="generating", unit="prompt", disable=not self.progress,
                  dynamic_ncols=True) as bar:
            def one(prompt: str) -> str:
                text = cut_at_stop(self._complete(prompt, max_new_tokens, stop, temperature, seed), stop)
                bar.update(1)
                return text

            if self.workers == 1 or len(prompts) <= 1:
                return [one(p) for p in prompts]
            with ThreadPoolExecutor(self.workers) as pool:
                return list(pool.map(one, prompts))

    def _payload(self, prompt: str, max_new_tokens: int, stop: list[str] | None, temperature: float = 0.0,
                 seed: int = 0) -> dict:
        payload = {"model": self.model, "max_tokens": int(max_new_tokens), "temperature": float(temperature)}
        if temperature > 0:
            payload["seed"] = int(seed)  # honoured by servers that support it (OpenAI: best effort)
        if self.endpoint == "chat":
            payload["messages"] = [{"role": "user", "content": prompt}]
        else:
            payload["prompt"] = prompt
        if stop:
            payload["stop"] = [s for s in stop if s][:4]  # OpenAI accepts at most 4; the rest are cut here
        return payload

    def _complete(self, prompt: str, max_new_tokens: int, stop: list[str] | None, temperature: float = 0.0,
                  seed: int = 0) -> str:
        body = json.dumps(self._payload(prompt, max_new_tokens, stop, temperature, seed)).encode()
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        reason = ""
        for attempt in range(self.retries + 1):
            try:
                return self._attempt(body, key)
            except _Retry as err:
                reason = _scrub(str(err), key)
                if attempt < self.retries:
                    delay = err.after if err.after is not None else self.backoff * 2 ** attempt
                    time.sleep(min(delay, MAX_RETRY_AFTER) * random.uniform(1.0, 1.1))
        raise BabelprobeError(f"{self.name}: no usable answer after {self.retries + 1} "
                              f"attempt{'s' if self.retries else ''} (last: {reason}); "
                              "check that the server is up, or raise --timeout/--retries")

    def _attempt(self, body: bytes, key: str | None) -> str:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        self.limiter.wait()
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            detail = _scrub(_error_detail(err), key)
            if err.code == 429 or err.code >= 500:
                raise _Retry(f"HTTP {err.code} {detail}", after=_retry_after(err.headers)) from None
            hint = (f"; set the API key in the environment variable {self.api_key_env}"
                    if err.code in (401, 403) else "; check the model name and URL")
            raise BabelprobeError(f"{self.name}: the server refused the request (HTTP {err.code} {detail}){hint}") from None
        except TimeoutError:  # socket.timeout is an alias of it
            raise _Retry(f"no answer within {self.timeout:g} s") from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError) as err:
            reason = getattr(err, "reason", err)
            if isinstance(reason, TimeoutError):
                raise _Retry(f"no answer within {self.timeout:g} s") from None
            raise _Retry(f"connection failed: {reason}") from None
        return self._text(raw)

    def _text(self, raw: bytes) -> str:
        try:
            data = json.loads(raw)
            choice = data["choices"][0]
            text = choice["message"]["content"] if self.endpoint == "chat" else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Retry(f"malformed JSON answer: {raw[:80]!r}") from None
        if not isinstance(text, str):
            if text is None:
                return ""  # e.g. a chat reply with only a refusal or tool call: no text
            raise _Retry(f"malformed JSON answer: the text is a {type(text).__name__}")
        return text


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _scrub(text: str, key: str | None) -> str:
    """The text with the API key (if any) blanked out: servers sometimes echo what they were sent."""
    return text.replace(key, "***") if key else text


def _error_detail(err: urllib.error.HTTPError) -> str:
    try:
        body = err.read(300).decode("utf-8", "replace")
    except OSError:
        body = ""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body
    return " ".join(str(message).split())[:200]


def _retry_after(headers) -> float | None:
    try:
        return max(0.0, float(headers.get("Retry-After")))
    except (TypeError, ValueError):
        return None


def openai_generator(base_url: str, model: str, api_key_env: str | None = "OPENAI_API_KEY", timeout: float = 60.0,
                     retries: int = 3, rate_limit: float | None = None, endpoint: str = "chat", workers: int = 1,
                     backoff: float = 1.0, progress: bool = False) -> OpenAIGenerator:
    """An OpenAI-compatible endpoint: `rate_limit` in requests per second, `backoff` the first retry's
    wait in seconds (doubling each time), the key read from the environment variable `api_key_env`."""
    return OpenAIGenerator(base_url, model, api_key_env=api_key_env, timeout=timeout, retries=retries,
                           rate_limit=rate_limit, endpoint=endpoint, workers=workers, backoff=backoff,
                           progress=progress)


# ------------------------------------------------------------------------------------------------ specs

def make_generator(spec: str, lm: LoadedModel | None = None, batch_size: int = 8, progress: bool = False,
                   **http_options) -> Generator:
    """A generator from a spec string (SPEC_HELP); `http_options` go to `openai_generator`."""
    kind, _, rest = spec.partition(":")
    if spec == "local":
        if lm is None:
            raise BabelprobeError("the 'local' generator needs a loaded model (--model)")
        return local_generator(lm, batch_size=batch_size, progress=progress)
    if kind == "local" and rest:
        from babelprobe.runtime import Runtime

        return local_generator(Runtime(model=rest).lm, batch_size=batch_size, progress=progress)
    if kind in ("openai", "openai-completions"):
        model, at, url = rest.partition("@")
        if not (model and at and url):
            raise BabelprobeError(f"generator {spec!r} must look like {kind}:MODEL@URL, "
                                  "e.g. openai:gpt-4o-mini@https://api.openai.com/v1")
        return openai_generator(url, model, endpoint="chat" if kind == "openai" else "completions",
                                progress=progress, **http_options)
    raise BabelprobeError(f"unknown generator {spec!r}; use {SPEC_HELP}")


# ---------------------------------------------------------------------------------------------- caching

def _cache_key(generator: Generator, prompt: str, max_new_tokens: int, stop: list[str] | None,
               temperature: float = 0.0, seed: int = 0) -> str:
    sampling = [float(temperature), int(seed)] if temperature > 0 else []  # greedy keys stay as they were
    return json.dumps([generator.name, getattr(generator, "fingerprint", ""), int(max_new_tokens),
                       list(stop or []), *sampling, prompt], ensure_ascii=False)


def generate_cached(generator: Generator, prompts: list[str], cache: str | Path | None, max_new_tokens: int = 64,
                    stop: list[str] | None = None, chunk: int | None = None, progress: bool = False,
                    desc: str = "generating", temperature: float = 0.0, seed: int = 0) -> list[str]:
    """`generator.generate(prompts, ...)`, but outputs already in the JSONL `cache` are reused and new
    ones are appended after every `chunk` prompts (flushed to disk), so an interrupted run resumes.
    The default chunk is the generator's `preferred_chunk` (local: 4 batches; HTTP: one round of
    requests), else 16.
    Identical prompts are generated once. The key is (generator name and fingerprint, max_new_tokens,
    stop, temperature and seed when sampling, prompt): a different model or setting never reuses another's
    outputs, and two sampled runs with different seeds are two runs."""
    chunk = chunk or getattr(generator, "preferred_chunk", 16)
    keys = [_cache_key(generator, p, max_new_tokens, stop, temperature, seed) for p in prompts]
    sampling = {"temperature": temperature, "seed": seed} if temperature > 0 else {}  # greedy: the plain call
    done = JsonlMemo(cache)
    todo = list(dict.fromkeys(k for k in keys if k not in done))
    prompt_of = dict(zip(keys, prompts))
    bar = tqdm(total=len(todo), desc=desc, unit="prompt", disable=not progress or not todo, dynamic_ncols=True)
    for start in range(0, len(todo), chunk):
        part = todo[start:start + chunk]
        outputs = generator.generate([prompt_of[k] for k in part], max_new_tokens=max_new_tokens, stop=stop, **sampling)
        if len(outputs) != len(part):
            raise BabelprobeError(f"generator {generator.name} returned {len(outputs)} outputs for {len(part)} prompts")
        outputs = [cut_at_stop(o, stop) for o in outputs]  # whatever the generator did with `stop`
        done.add(list(zip(part, outputs)))
        bar.update(len(part))
    bar.close()
    return [done[k] for k in keys]
