"""Several processes writing one store: under `torchrun` / `accelerate launch` each rank takes the shards
k with k ≡ rank (mod world size); rank 0 prepares the store, holds the lock and writes the manifest.

A model too large for one GPU is split over several (`--device-map auto --gpus-per-replica G`): each rank
is then one data-parallel replica holding the model dispatched over its own G GPUs (local rank r uses
GPUs r*G .. r*G+G-1), takes its shards like any rank and writes them itself: one writer per replica.
Launch one process per replica: `torchrun --nproc-per-node $((GPUS / G))`.

The ranks agree through `torch.distributed` (NCCL on GPUs, gloo on CPU), started from the usual
environment variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). A single process is
a world of one and needs none of it. Errors are shared: if one rank fails, every rank raises the
same one-line error instead of waiting forever for the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from babelprobe.errors import BabelprobeError


@dataclass
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    started_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def my_shards(self, shards: list[int]) -> list[int]:
        return [k for k in shards if k % self.size == self.rank]

    def agree(self, error: str | None) -> None:
        """Collective: raise BabelprobeError on every rank if any rank reports an error."""
        if self.size == 1:
            if error:
                raise BabelprobeError(error)
            return
        errors = [None] * self.size
        torch.distributed.all_gather_object(errors, error)
        first = next((e for e in errors if e), None)
        if first:
            raise BabelprobeError(first if error else f"another rank failed: {first}")

    def gather(self, value):
        """Collective: every rank's `value`, in rank order."""
        if self.size == 1:
            return [value]
        values = [None] * self.size
        torch.distributed.all_gather_object(values, value)
        return values

    def close(self) -> None:
        if self.started_here and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def env_world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the launcher's environment (0, 1, 0 when not launched)."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)))


def local_device() -> str | None:
    """The GPU of this rank under a launcher (cuda:LOCAL_RANK), else None (choose automatically)."""
    rank, size, local = env_world()
    if size > 1 and torch.cuda.is_available():
        return f"cuda:{local}"
    return None


def replica_gpus(gpus_per_replica: int, local_rank: int | None = None, n_gpus: int | None = None) -> list[int]:
    """The GPU indices of this rank's replica: local rank r has r*G .. r*G+G-1 (`G = gpus_per_replica`)."""
    if gpus_per_replica < 1:
        raise BabelprobeError(f"--gpus-per-replica must be at least 1, got {gpus_per_replica}")
    local = env_world()[2] if local_rank is None else local_rank
    n_gpus = torch.cuda.device_count() if n_gpus is None else n_gpus
    first = local * gpus_per_replica
    if first + gpus_per_replica > n_gpus:
        raise BabelprobeError(f"--gpus-per-replica {gpus_per_replica}: local rank {local} needs GPUs {first}.."
                              f"{first + gpus_per_replica - 1} but this node has {n_gpus}; launch "
                              f"{max(1, n_gpus // gpus_per_replica)} process(es) per node")
    return list(range(first, first + gpus_per_replica))


def replica_max_memory(gpus: list[int], max_memory: dict | None = None, free=None) -> dict:
    """accelerate's `max_memory` restricted to a replica's GPUs (so the dispatch uses those and no other).

    `max_memory` keys are GPU indices within the replica (0 .. G-1), "cpu" and "disk"; a GPU not named
    gets 90% of its free memory (`free(index)` -> bytes; default `torch.cuda.mem_get_info`)."""
    given = dict(max_memory or {})
    free = free or (lambda index: torch.cuda.mem_get_info(index)[0])
    out = {}
    for position, index in enumerate(gpus):
        out[index] = given.pop(position, None) or int(0.9 * free(index))
    extra = [k for k in given if not isinstance(k, str)]
    if extra:
        raise BabelprobeError(f"--max-memory names GPU {extra[0]} but a replica has GPUs 0..{len(gpus) - 1} "
                              "(indices within the replica)")
    out.update(given)  # cpu, disk
    return out


def join_world(device: torch.device) -> World:
    """The process group of a launched run (started here if the launcher did not), or a world of one."""
    rank, size, local = env_world()
    if size <= 1:
        return World()
    started = False
    if not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.distributed.init_process_group(backend=backend)
        started = True
    return World(rank=torch.distributed.get_rank(), size=torch.distributed.get_world_size(),
                 local_rank=local, started_here=started)
