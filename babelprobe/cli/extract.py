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

from babelprobe.cli.common import add_items_options, add_model_options, add_settings_options, items_from
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
    group = parser.add_argument_group("running (does not change the stored values)")
    group.add_argument("--shard-size", type=int, metavar="N",
                       help="items per shard (default: at most 256 MiB of float32 per pooling and 2048 items)")
    group.add_argument("--batch-tokens", type=int, default=8192, metavar="N",
                       help="token budget per batch: batch size × longest text (default 8192)")
    group.add_argument("--compression", choices=COMPRESSIONS, default="none", help="HDF5 compression (default none)")
    group.add_argument("--padding-side", choices=("right", "left"), default="right",
                       help="padding side (results do not depend on it)")
    group.add_argument("--overwrite", action="store_true",
                       help="replace a store made with another model or other settings")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_extract)

    check = sub.add_parser(
        "verify", help="check an activation store (checksums, shapes, NaN/inf, manifest)",
        description="Recompute every shard's checksums and check shapes, dtypes, keys, finite values and the "
        "manifest. Exit 0 with a one-line summary if the store is sound, 1 naming each problem otherwise.")
    check.add_argument("acts", metavar="DIR", help="store directory")
    check.set_defaults(func=run_verify)


def add_placement_options(parser, replicas: bool = False, remote: bool = False) -> None:
    """Options that spread a model over devices (accelerate's dispatch), and for extract: replicas and NDIF."""
    group = parser.add_argument_group("model placement (models larger than one device)")
    group.add_argument("--device-map", metavar="MAP",
                       help="load the model across devices through accelerate: auto, balanced, balanced_low_0, "
                       "sequential, or a JSON file {module: device} (devices: 0, 1, ..., cpu, disk); "
                       "instead of --device")
    group.add_argument("--max-memory", metavar="LIST",
                       help="memory per device for --device-map, e.g. 0=70GiB,1=70GiB,cpu=200GiB (what does not "
                       "fit goes to disk)")
    group.add_argument("--offload-folder", metavar="DIR",
                       help="where disk-offloaded weights go (default: a temporary folder in the cache)")
    if replicas:
        group.add_argument("--gpus-per-replica", type=int, metavar="G",
                           help="with --device-map under torchrun: each rank holds one copy of the model over G "
                           "GPUs (local rank r: GPUs r*G..r*G+G-1); launch GPUs/G processes per node")
    if remote:
        group.add_argument("--remote", action="store_true",
                           help="run the forward passes on NDIF (--backend nnsight, --model a hub id; API key from "
                           "the NDIF_API_KEY environment variable); only pooled states come back")


def device_map_arg(value: str | None):
    """--device-map: a strategy name, or a JSON file holding an explicit {module: device} map."""
    if value is None or not value.endswith(".json"):
        return value
    import json
    from pathlib import Path

    try:
        mapping = json.loads(Path(value).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise BabelprobeError(f"--device-map {value}: cannot read a JSON device map ({str(err).splitlines()[0]})") from err
    if not isinstance(mapping, dict) or not mapping:
        raise BabelprobeError(f"--device-map {value}: expected a JSON object {{module name: device}}")
    return {name: int(where) if str(where).isdigit() else where for name, where in mapping.items()}


def placed_model(args, local_device: str | None = None):
    """The model of `args` on one device, dispatched over several (--device-map), or remote (--remote)."""
    from babelprobe.extract.distributed import env_world, replica_gpus, replica_max_memory
    from babelprobe.models import load_model, load_remote_model, parse_max_memory

    if getattr(args, "remote", False):
        if getattr(args, "backend", "hf") != "nnsight":
            raise BabelprobeError("--remote runs the forward passes through nnsight: add --backend nnsight")
        if args.device_map or args.device:
            raise BabelprobeError("--remote runs the model on NDIF: leave out --device and --device-map")
        return load_remote_model(args.model, revision=args.revision, dtype=args.model_dtype)
    device_map = device_map_arg(args.device_map)
    max_memory = parse_max_memory(args.max_memory)
    per_replica = getattr(args, "gpus_per_replica", None)
    if per_replica is not None and device_map is None:
        raise BabelprobeError("--gpus-per-replica needs --device-map (e.g. --device-map auto)")
    import torch

    if device_map is not None and torch.cuda.is_available() and (per_replica or env_world()[1] > 1):
        max_memory = replica_max_memory(replica_gpus(per_replica or 1), max_memory)
    device = args.device or (None if device_map is not None else local_device)
    return load_model(args.model, device=device, dtype=args.model_dtype, revision=args.revision,
                      trust_remote_code=args.trust_remote_code, device_map=device_map, max_memory=max_memory,
                      offload_folder=args.offload_folder)


def run_extract(args) -> int:
    from babelprobe.cli.common import settings_from
    from babelprobe.extract.distributed import env_world, local_device
    from babelprobe.extract.layers import check_spec
    from babelprobe.extract.run import check_extract, extract
    from babelprobe.tables import check_out_dir

    settings = settings_from(args, ExtractSettings)  # every check that needs no model, before loading one
    check_spec(settings.layers)
    if args.shard_size is not None and args.shard_size < 1:
        raise BabelprobeError(f"--shard-size must be at least 1, got {args.shard_size}")
    if args.batch_tokens < 1:
        raise BabelprobeError(f"--batch-tokens must be positive, got {args.batch_tokens}")
    check_out_dir(args.out)
    items = items_from(args)
    lm = placed_model(args, local_device())
    check_extract(lm, settings, batch_tokens=args.batch_tokens, shard_size=args.shard_size)
    source = {"source": args.items, "languages": args.languages, "subsets": args.subsets, "limit": args.limit,
              "language": args.language}
    report = extract(lm, items, args.out, settings, shard_size=args.shard_size, batch_tokens=args.batch_tokens,
                     compression=args.compression, padding_side=args.padding_side, overwrite=args.overwrite,
                     progress=not args.no_progress, source=source, remote=args.remote or None,
                     provenance={"model": {"spec": args.model, "revision": args.revision},
                                 "options": {k: v for k, v in vars(args).items() if k != "func"}})
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
