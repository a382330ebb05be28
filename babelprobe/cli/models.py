"""`babelprobe models [SPEC]`: load a model spec and print what babelprobe records about it."""

from __future__ import annotations

import json

from babelprobe.cli.common import add_model_options, model_from


def register(sub) -> None:
    parser = sub.add_parser("models", help="load a model and show layers, d_model, BOS policy, fingerprint",
                            description=__doc__)
    add_model_options(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    print(json.dumps(model_from(args).describe(), indent=2))
    return 0
