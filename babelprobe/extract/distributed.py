"""Several processes writing one store: under `torchrun` / `accelerate launch` each rank takes the shards
k with k ≡ rank (mod world size); rank 0 prepares the store, holds the lock and writes the manifest.

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
