"""Options shared by several commands (`--model`, `--items`, ...) and the objects they build."""

from __future__ import annotations

import argparse

from babelprobe.items import load_items
from babelprobe.models import load_model


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
                       metavar="NAME|PATH", help="bundled set name, item file or directory, or hf:ORG/NAME[:config]")
    group.add_argument("--languages", type=comma_list, metavar="LIST", help="comma-separated language codes to keep")
    group.add_argument("--subsets", type=comma_list, metavar="LIST", help="comma-separated subsets to keep")
    group.add_argument("--limit", type=int, metavar="N", help="at most N pairs per language × subset")


def comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def model_from(args):
    return load_model(args.model, device=args.device, dtype=args.dtype, revision=args.revision,
                      trust_remote_code=args.trust_remote_code)


def items_from(args):
    return load_items(args.items, languages=args.languages, subsets=args.subsets, limit=args.limit)
