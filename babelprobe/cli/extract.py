"""`babelprobe extract` (activations of every layer into an HDF5 store) and `babelprobe verify` (check one).

    babelprobe extract --model default --items xcomps-sample --out acts/ --pool both
    babelprobe verify acts/
    torchrun --nproc-per-node 8 -m babelprobe extract ... --out acts/     # one store, 8 GPUs
    babelprobe extract --model ORG/70B --device-map auto --out acts/      # one model over every GPU of a node
    torchrun --nproc-per-node 4 -m babelprobe extract ... --device-map auto --gpus-per-replica 2   # 4 replicas x 2 GPUs
    NDIF_API_KEY=... babelprobe extract --model ORG/NAME --backend nnsight --remote --out acts/   # NDIF
"""

from __future__ import annotations

import sys
from dataclasses import replace

from babelprobe.cli.common import (
    PLACEMENT,
    add_items_options,
    add_model_options,
    add_runtime_options,
    add_settings_options,
    items_from,
    runtime_from,
)
from babelprobe.errors import BabelprobeError
from babelprobe.extract.settings import ExtractSettings

COMPRESSIONS = ("none", "lzf", "gzip")  # = store.COMPRESSIONS (tested)


def register(sub) -> None:
    parser = sub.add_parser(
        "extract", help="store every layer's last-token / mean activations of the items (HDF5 shards)",
        description="Run the items through the model once and store, for every requested layer (0 = embeddings, "
        "i = output of block i before the final norm), the last-token and/or mean-pooled hidden state in "
        "crash-safe HDF5 shards. Running the same command again resumes an interrupted run.")
    add_model_options(parser, dtype_alias=False)
    add_placement_options(parser, replicas=True, remote=True)
    add_items_options(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="store directory (created if missing)")
    add_settings_options(parser, ExtractSettings, "extraction settings (recorded in the store's manifest)")
    group = parser.add_argument_group("store files (do not change the stored values)")
    group.add_argument("--shard-size", type=int, metavar="N",
                       help="items per shard (default: at most 256 MiB of float32 per pooling and 2048 items)")
    group.add_argument("--compression", choices=COMPRESSIONS, default="none", help="HDF5 compression (default none)")
    group.add_argument("--padding-side", choices=("right", "left"), default="right",
                       help="padding side (results do not depend on it)")
    add_runtime_options(parser, ("batch_tokens", "overwrite", "progress"), batch_tokens=8192)
    parser.set_defaults(func=run_extract)

    check = sub.add_parser(
        "verify", help="check an activation store (checksums, shapes, NaN/inf, manifest)",
        description="Recompute every shard's checksums and check shapes, dtypes, keys, finite values and the "
        "manifest. Exit 0 with a one-line summary if the store is sound, 1 naming each problem otherwise.")
    check.add_argument("acts", metavar="DIR", help="store directory")
    check.set_defaults(func=run_verify)


def add_placement_options(parser, replicas: bool = False, remote: bool = False) -> None:
    """Options that spread a model over devices (accelerate's dispatch), and for extract: replicas and NDIF."""
    title = "model placement (models larger than one device)"
    add_runtime_options(parser, PLACEMENT, title)
    group = next(g for g in parser._action_groups if g.title == title)
    if replicas:
        group.add_argument("--gpus-per-replica", type=int, metavar="G",
                           help="with --device-map under torchrun: each rank holds one copy of the model over G "
                           "GPUs (local rank r: GPUs r*G..r*G+G-1); launch GPUs/G processes per node")
    if remote:
        group.add_argument("--remote", action="store_true",
                           help="run the forward passes on NDIF (--backend nnsight, --model a hub id; API key from "
                           "the NDIF_API_KEY environment variable); only pooled states come back")


def check_placement(args) -> None:
    """The placement flags go together (before any model work): --remote runs on NDIF through nnsight,
    --gpus-per-replica needs --device-map; the runtime checks the rest (--device or --device-map, ...)."""
    runtime = runtime_from(args)
    if getattr(args, "remote", False):
        if getattr(args, "backend", "hf") != "nnsight":
            raise BabelprobeError("--remote runs the forward passes through nnsight: add --backend nnsight")
        if runtime.device_map or runtime.device:
            raise BabelprobeError("--remote runs the model on NDIF: leave out --device and --device-map")
    if getattr(args, "gpus_per_replica", None) is not None and runtime.device_map is None:
        raise BabelprobeError("--gpus-per-replica needs --device-map (e.g. --device-map auto)")


def placed_model(args, local_device: str | None = None):
    """The model of `args` on one device, dispatched over several (--device-map), or remote (--remote):
    the runtime's one door (`Runtime.lm`), with a replica's share of the GPUs under torchrun."""
    from babelprobe.extract.distributed import env_world, replica_gpus, replica_max_memory
    from babelprobe.models import load_remote_model, parse_max_memory

    check_placement(args)
    runtime = runtime_from(args)
    if getattr(args, "remote", False):
        return load_remote_model(runtime.model, revision=runtime.revision, dtype=runtime.model_dtype)
    per_replica = getattr(args, "gpus_per_replica", None)
    import torch

    if runtime.device_map is not None and torch.cuda.is_available() and (per_replica or env_world()[1] > 1):
        max_memory = replica_max_memory(replica_gpus(per_replica or 1), parse_max_memory(runtime.max_memory))
        runtime = runtime.replace(max_memory=max_memory)
    if runtime.device_map is None and runtime.device is None and local_device is not None:
        runtime = runtime.replace(device=local_device)
    return runtime.lm


def run_extract(args) -> int:
    from babelprobe.cli.common import settings_from
    from babelprobe.extract.distributed import env_world, local_device
    from babelprobe.extract.layers import check_spec
    from babelprobe.extract.run import check_extract, check_store_room, extract, store_dtype
    from babelprobe.tables import check_out_dir

    settings = settings_from(args, ExtractSettings)  # every check that needs no model, before loading one
    check_spec(settings.layers)
    check_placement(args)
    check_out_dir(args.out)
    items = items_from(args)
    planned = runtime_from(args)  # the dtype the model will compute in decides the store's by default
    settings = replace(settings, dtype=store_dtype(settings, args.out, planned.compute_dtype, planned.overwrite))
    if not args.remote:  # the layers and the store's room by the model's config (a remote one's: once read)
        info = planned.info
        check_extract(info.n_layers, settings, batch_tokens=args.batch_tokens, shard_size=args.shard_size)
        check_store_room(args.out, items, settings, info, args.compression)
    lm = placed_model(args, local_device())
    check_extract(lm, settings, batch_tokens=args.batch_tokens, shard_size=args.shard_size)
    source = {"source": args.items, "languages": args.languages, "subsets": args.subsets, "limit": args.limit,
              "language": args.language}
    runtime = runtime_from(args, model=lm)
    report = extract(items, args.out, settings, runtime, shard_size=args.shard_size, compression=args.compression,
                     padding_side=args.padding_side, source=source, remote=args.remote or None,
                     provenance={"model": {"spec": args.model, "revision": args.revision},
                                 "options": {k: v for k, v in vars(args).items() if k not in ("func", "command_path")}})
    if env_world()[0] == 0:
        print(report.summary())
    return 0


def run_verify(args) -> int:
    from babelprobe.extract.store import open_store, verify_store

    problems = verify_store(args.acts)
    if problems:
        for problem in problems:
            print(f"babelprobe: verify: {args.acts}: {problem}", file=sys.stderr)
        print(f"babelprobe: verify: {len(problems)} problem(s) in {args.acts}", file=sys.stderr)
        return 1
    with open_store(args.acts) as store:
        layers = store.layers
        print(f"OK {args.acts}: {len(store)} items, layers {layers[0]}..{layers[-1]} ({len(layers)}), "
              f"d_model {store.d_model}, {'+'.join(store.pools)}, {store.dtype}, "
              f"{len(store.manifest['shards'])} shards, checksums match, all values finite")
    return 0
