"""The values benchmark settings offer, importable without torch (so `babelprobe bench NAME --help` stays
fast): how the token log-probs of a text reduce to one score (`REDUCTIONS`, used by `logprobs.reduce`),
how a generator is named (`SPEC_HELP`, read by `generate.make_generator`) and how a prompt meets a chat
template (`CHAT_TEMPLATE`, `generate.with_chat_template`)."""

REDUCTIONS = ("sum", "mean", "per_char", "per_byte")

SPEC_HELP = ("'local' (the --model), 'local:SPEC' (another local model, e.g. a bigger one), "
             "'openai:MODEL@URL' (chat completions) or 'openai-completions:MODEL@URL' (plain completions) "
             "of an OpenAI-compatible server, e.g. openai:gpt-4o-mini@https://api.openai.com/v1")

# off: plain text; auto: the model's chat template when it has one; on: the chat template, or an error.
CHAT_TEMPLATE = ("off", "auto", "on")
# The earlier boolean `chat_template` of eclektic, consistency and pitfalls, as a value of CHAT_TEMPLATE.
CHAT_TEMPLATE_VALUES = {True: "on", False: "off", "true": "on", "false": "off"}
