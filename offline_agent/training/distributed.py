"""Training on several processes (`accelerate launch`, `torchrun`): who does what.

The main process (rank 0) runs the pipeline: it alone opens the run's store (DuckDB allows
one writing process) and writes checkpoints, adapters and reference log-probs. The others
only train: `fit.follow` receives each `fit_policy` call the main process makes (its
arguments, sent by `share_job`, store callbacks excepted) and runs the same call, until the
main process sends `release()`. Every process then holds the same rows, config and data
order, takes its share of each step, and the loop sums gradients across processes
(trainer.py).

Nothing here imports torch at module level: the CLI asks `world_size()` on every run.
"""

from __future__ import annotations

import os

# accelerate's plain data-parallel modes: every process holds the whole model and adapter,
# which the loop's explicit gradient sum needs (DeepSpeed, FSDP shard them)
SUPPORTED = ("NO", "MULTI_CPU", "MULTI_GPU")


def world_size() -> int:
    """Processes launched together, as the launcher (torchrun, accelerate launch) says."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_follower() -> bool:
    """A launched process other than the main one: it trains, and never opens the store."""
    return world_size() > 1 and int(os.environ.get("RANK", "0")) != 0


def make_accelerator():
    """The Accelerator of this process, checked: plain data parallel, one process per rank.

    On a machine without a GPU the processes run on CPU (gloo), so a CPU launch needs no
    ACCELERATE_USE_CPU; accelerate would otherwise start each one as a lone process."""
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    kind = accelerator.distributed_type.name
    if kind not in SUPPORTED:
        raise ValueError(f"training under accelerate's {kind} is not supported: the loop sums "
                         "whole adapter gradients itself; launch plain data-parallel "
                         "processes (docs/training.md, Several processes)")
    if accelerator.mixed_precision != "no":
        raise ValueError(f"accelerate mixed precision {accelerator.mixed_precision!r} is not "
                         "used by the training loop; set train.dtype instead and launch with "
                         "--mixed_precision no")
    if accelerator.num_processes != world_size():
        raise RuntimeError(f"the launcher started {world_size()} processes but accelerate "
                           f"sees {accelerator.num_processes} ({kind}); they would each train "
                           "alone")
    return accelerator


def share_job(accelerator, job: dict) -> None:
    """Main process: send one fit_policy call's arguments to the other processes."""
    if accelerator.num_processes > 1 and accelerator.is_main_process:
        _broadcast(job)


def next_job() -> dict | None:
    """Other processes: the next fit_policy call's arguments, or None when the main process
    is done."""
    make_accelerator()
    return _broadcast(None)


def release() -> None:
    """Main process, after its last fit_policy: let the other processes exit."""
    if world_size() > 1:
        make_accelerator()
        _broadcast(None)
        leave()


def leave() -> None:
    """Destroy this process's group once it has nothing left to send or receive. A gloo group
    left to the interpreter's exit can abort it ("terminate called without an active
    exception", SIGABRT) after the run succeeded (pytorch/pytorch#190489)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _broadcast(job: dict | None) -> dict | None:
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([job], from_process=0)[0]
