"""The values benchmark settings offer, importable without torch (so `babelprobe bench NAME --help` stays
fast): how the token log-probs of a text reduce to one score (`REDUCTIONS`, used by `logprobs.reduce`),
how a generator is named (`SPEC_HELP`, read by `generate.make_generator`) and how a prompt meets a chat
template (`CHAT_TEMPLATE`, `generate.with_chat_template`)."""

from babelprobe.errors import BabelprobeError

REDUCTIONS = ("sum", "mean", "per_char", "per_byte")

SPEC_HELP = ("'local' (the --model), 'local:SPEC' (another local model, e.g. a bigger one), "
             "'openai:MODEL@URL' (chat completions) or 'openai-completions:MODEL@URL' (plain completions) "
             "of an OpenAI-compatible server, e.g. openai:gpt-4o-mini@https://api.openai.com/v1")

# off: plain text; auto: the model's chat template when it has one; on: the chat template, or an error.
CHAT_TEMPLATE = ("off", "auto", "on")
# The earlier boolean `chat_template` of eclektic, consistency and pitfalls, as a value of CHAT_TEMPLATE.
CHAT_TEMPLATE_VALUES = {True: "on", False: "off", "true": "on", "false": "off"}


def check_spec(spec: str, flag: str, also: tuple[str, ...] = ()) -> None:
    """A one-line error naming `flag` when `spec` is not a generator spec (SPEC_HELP) nor one of `also`;
    checked before anything loads (the spec's model or server is reached only when the run needs it)."""
    kind, _, rest = spec.partition(":")
    model, at, url = rest.partition("@")
    if spec in ("local", *also) or (kind == "local" and rest):
        return
    if kind in ("openai", "openai-completions") and model and at and url.startswith(("http://", "https://")):
        return
    raise BabelprobeError(f"{flag} {spec!r}: not a generator spec; use {SPEC_HELP}"
                          + (f" or {', '.join(also)}" if also else ""))
