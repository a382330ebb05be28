"""Options shared by several commands (`--model`, `--items`, ...) and the objects they build."""

from __future__ import annotations

import argparse

from babelprobe.items import load_items
from babelprobe.models import LoadedModel, load_model


def add_model_options(parser: argparse.ArgumentParser, dtype_option: str = "--dtype") -> None:
    """`dtype_option` renames the model's --dtype (its value stays `args.dtype`) for commands whose own
    --dtype means something else (extract: the stored dtype)."""
    group = parser.add_argument_group("model")
    group.add_argument("--model", default="default", metavar="SPEC",
                       help="'default' (Gemma-3-270M, offline), a local dir, a hub id ORG/NAME[@REV] or a .gguf file")
    group.add_argument("--revision", help="hub revision (branch, tag or commit)")
    group.add_argument("--device", help="cuda, mps or cpu (default: the first available)")
    group.add_argument(dtype_option, dest="dtype",
                       help="float32, bfloat16 or float16 (default: bf16 on GPU, fp32 on CPU)")
    group.add_argument("--trust-remote-code", action="store_true",
                       help="allow model code from the hub to run (off by default; only for models you trust)")


def add_items_options(parser: argparse.ArgumentParser, required: bool = False) -> None:
    group = parser.add_argument_group("items")
    group.add_argument("--items", default=None if required else "xcomps-sample", required=required,
                       metavar="NAME|PATH", help="bundled set name, item file (.jsonl .json .csv .tsv .parquet; released "
                       "COMPS/XCOMPS layouts too) or directory, or hf:ORG/NAME[:config[:split]]")
    group.add_argument("--language", metavar="CODE",
                       help="language of a single-language source that does not say (no 'language' field and no "
                       "code in its name, e.g. a renamed COMPS file: --language en)")
    group.add_argument("--languages", type=comma_list, metavar="LIST", help="comma-separated language codes to keep")
    group.add_argument("--subsets", type=comma_list, metavar="LIST", help="comma-separated subsets to keep")
    group.add_argument("--limit", type=int, metavar="N", help="at most N pairs per language × subset")


def comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def items_from(args):
    return load_items(args.items, languages=args.languages, subsets=args.subsets, limit=args.limit,
                      language=args.language)


def add_http_options(parser) -> None:
    """The OpenAI-compatible endpoint's options (add once per command, whatever generators it has)."""
    group = parser.add_argument_group("OpenAI-compatible endpoint (for openai:MODEL@URL generators)")
    group.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="NAME",
                       help="environment variable holding the API key (default OPENAI_API_KEY; unset: no key sent)")
    group.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds per request (default 60)")
    group.add_argument("--retries", type=int, default=3, metavar="N",
                       help="retries after a timeout, 429, 5xx or malformed answer, with doubling back-off (default 3)")
    group.add_argument("--rate-limit", type=float, metavar="PER_S", help="at most this many requests per second")
    group.add_argument("--workers", type=int, default=1, metavar="N", help="requests in flight at once (default 1)")


def http_options(args) -> dict:
    """The options of `add_http_options` that were given, for `make_generator`."""
    return {name: getattr(args, name) for name in ("api_key_env", "timeout", "retries", "rate_limit", "workers")
            if getattr(args, name, None) is not None}


def load_options(args) -> dict:
    """`load_model` keyword arguments from the model options."""
    return {"device": args.device, "dtype": args.dtype, "revision": args.revision,
            "trust_remote_code": args.trust_remote_code}


def model_from(args) -> LoadedModel:
    return load_model(args.model, **load_options(args))
