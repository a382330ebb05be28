"""The settings of the two pair scorers (`DirectSettings`, `MetaSettings`) and the one resumable way to
score a whole item set into a result file (`score_pairs`), used by `babelprobe score direct|meta` and by
`compare`'s direct and meta stages.

`score_pairs` scores in chunks of whole pairs kept beside the output (`runs.score_resumably`), keyed by
the method, the model's fingerprint, the settings and, for meta, the digest of the prompt templates, so
an interrupted run resumes and a run of other settings never reuses a chunk.

This module imports nothing heavy at load (the CLI builds its flags from the settings).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from babelprobe.errors import BabelprobeError
from babelprobe.runtime import Runtime, runner
from babelprobe.settings import one_of, option, settings_record

REDUCTIONS = ("sum", "mean", "per_char", "per_byte")  # = core.logprobs.REDUCTIONS (tested)
RULES = ("sum", "both", "first")  # = meta.RULES (tested)
CHAT = ("off", "auto", "on")


@dataclass(frozen=True)
class DirectSettings:
    """What changes the numbers of direct scoring."""

    reduction: str = option("sum", choices=REDUCTIONS,
                            help="sum of the tokens' log-probs, mean per token, per character or per UTF-8 byte")
    conditional: bool = option(False, help="score only the continuation (property phrase) given its prefix")
    truncate: bool = option(False, help="keep the first tokens of a text longer than the context (recorded) "
                            "instead of stopping")

    def __post_init__(self):
        one_of(self, "reduction", REDUCTIONS)


@dataclass(frozen=True)
class MetaSettings:
    """What changes the numbers of metalinguistic prompting (XCOMPS Figure 8)."""

    rule: str = option("sum", choices=RULES,
                       help="when a pair is correct: sum (good − bad summed over both orders > 0), both (good wins in "
                       "both orders), first (only the order with the acceptable concept first)")
    reduction: str = option("sum", choices=REDUCTIONS,
                            help="of the answer's token log-probs: sum, mean per token, per character or per byte")
    close_quote: bool = option(True, help="score each concept with its closing quote, the complete answer "
                               "(--no-close-quote: the bare word)")
    chat_template: str = option("off", choices=CHAT, metavar="{off,auto,on}",
                                help="wrap the question in the model's chat template (user turn) and start the "
                                "assistant turn with the answer prefix: on, auto (when the model has one) or off")
    chat_template_file: str | None = option(None, metavar="FILE.jinja",
                                            help="use this Jinja chat template instead of the model's (implies "
                                            "--chat-template on)")
    prompts: str = option("xcomps", metavar="NAME|FILE.tsv",
                          help="prompt set: bundled 'xcomps' (Figure 8), 'xcomps-babelprobe' or a .tsv of templates")
    prompt_language: str | None = option(None, metavar="CODE",
                                         help="ask every item with this language's template (default: its own)")
    truncate: bool = option(False, help="keep the first tokens of a prompt longer than the context instead of "
                            "stopping")

    def __post_init__(self):
        chat = {True: "on", False: "off", None: "off"}.get(self.chat_template, self.chat_template)
        object.__setattr__(self, "chat_template", "on" if self.chat_template_file else str(chat))
        object.__setattr__(self, "prompts", str(self.prompts))
        one_of(self, "rule", RULES)
        one_of(self, "reduction", REDUCTIONS)
        one_of(self, "chat_template", CHAT)
        if self.chat_template_file and not Path(self.chat_template_file).expanduser().is_file():
            from babelprobe.errors import BabelprobeError

            raise BabelprobeError(f"--chat-template-file {self.chat_template_file}: no such file")

    def scorer_options(self, lm) -> dict:
        """`score_meta` keyword arguments (the chat template resolved against the model's tokenizer)."""
        options = settings_record(self)
        file, chat = options.pop("chat_template_file"), options.pop("chat_template")
        use = chat == "on" or (chat == "auto" and bool(getattr(lm.tokenizer, "chat_template", None)))
        options["chat_template"] = file if file else use
        return options


SETTINGS = {"direct": DirectSettings, "meta": MetaSettings}


def _method_and_settings(method: str | None, settings) -> tuple[str, DirectSettings | MetaSettings]:
    """The method the settings' class names (or `method`, with its default settings); both, disagreeing, is an
    error."""
    named = next((name for name, cls in SETTINGS.items() if isinstance(settings, cls)), None)
    if settings is not None and named is None:
        raise BabelprobeError(f"score_pairs takes DirectSettings or MetaSettings, not {type(settings).__name__}")
    if method is not None and method not in SETTINGS:
        raise BabelprobeError(f"unknown scoring method {method!r}; use {' or '.join(SETTINGS)}")
    if named is not None and method is not None and method != named:
        raise BabelprobeError(f"method {method!r} with {type(settings).__name__}: the settings are {named}'s")
    method = named or method
    if method is None:
        raise BabelprobeError("score_pairs needs its settings (DirectSettings or MetaSettings) or method='direct'|'meta'")
    return method, settings if settings is not None else SETTINGS[method]()


def _older(args: tuple, keywords: dict) -> bool:
    """The older form `score_pairs(method, lm, items, out, settings, ...)`: a method's name first."""
    return isinstance(args[0], str) and args[0] in SETTINGS


@runner(old=("method", "model", "items", "out", "settings"), old_when=_older)
def score_pairs(items, out: str | Path, settings: DirectSettings | MetaSettings | None = None,
                runtime: Runtime | None = None, *, method: str | None = None, padding_side: str = "right",
                share_prefix: bool = True):
    """Score every pair of `items` (a frame, or a source for `load_items`) with `method` and write the rows to
    `out` (a .csv or .parquet file), resumably; returns the rows. `settings`: a `DirectSettings` (direct) or a
    `MetaSettings` (meta), which names the method, or None with `method` ("direct" or "meta"): its defaults.
    `runtime`: the model and `batch_tokens`, `progress` (docs/design.md "Runtime, settings, runners"; the older
    `score_pairs(method, lm, items, out, settings, batch_tokens=...)` too). `share_prefix` runs each shared
    start once, as a prefix tree: meta's prompt once for both answers, direct's texts' common starts (the
    same numbers up to float rounding)."""
    import pandas as pd

    from babelprobe.inputs import check_input

    method, settings = _method_and_settings(method, settings)
    check_input("items", items, "items")
    if not isinstance(items, pd.DataFrame):
        from babelprobe.items import load_items

        items = load_items(items)
    return _score_pairs(method, runtime.lm, items, out, settings, batch_tokens=runtime.batch_tokens,
                        padding_side=padding_side, share_prefix=share_prefix, progress=runtime.progress)


def score_direct_capturing(lm, items, out: str | Path, settings: DirectSettings, capture, *, batch_tokens: int = 4096,
                           progress: bool = True):
    """`score_pairs` of direct scoring whose forward passes also fill an activation store (`capture`: an entered
    `extract.fused.StoreCapture` of the same items): `compare`'s direct scoring and extraction in one pass."""
    return _score_pairs("direct", lm, items, out, settings, batch_tokens=batch_tokens, progress=progress,
                        capture=capture)


def _score_pairs(method: str, lm, items, out, settings, *, batch_tokens: int, padding_side: str = "right",
                 share_prefix: bool = True, progress: bool = True, capture=None):
    from babelprobe.runs import score_resumably

    key = {"method": method, "fingerprint": lm.fingerprint, **settings_record(settings)}
    if method == "direct":
        from babelprobe.benchmarks.direct import DirectScorer

        # in three steps, so that chunks are prepared and finished while the device runs another
        score = DirectScorer(lm, batch_tokens=batch_tokens, padding_side=padding_side, capture=capture,
                             share_prefix=share_prefix, **settings_record(settings))
    else:
        from babelprobe.benchmarks.meta import MetaScorer, prompts_digest

        asked = [settings.prompt_language] if settings.prompt_language else sorted(items["language"].unique())
        key["prompts_digest"] = prompts_digest(settings.prompts, asked)
        score = MetaScorer(lm, share_prefix=share_prefix, batch_tokens=batch_tokens, padding_side=padding_side,
                           **settings.scorer_options(lm))
    # pairs that share a text in the same chunk, so that each text runs about once; not where the pass fills the
    # store, whose shards (contiguous items) are written when complete: so ordered, a quarter of XCOMPS at 8B
    # would hold 128 shards open (34 GB) instead of 10; there a text of an earlier chunk is copied instead
    # (`StoreCapture.plan`)
    together = "text" if capture is None else None
    return score_resumably(score, items, out, key, progress=progress, desc=method, model=lm, together=together)
