"""The GPT of examples/gpt.py trained on several processes, with DDP or
FSDP2 (torch.distributed.fsdp.fully_shard), one max_device device per rank.

    torchrun --standalone --nproc-per-node 2 examples/train_distributed.py --mode ddp
    MAX_DEVICE_COUNT=4 torchrun --standalone --nproc-per-node 4 examples/train_distributed.py --mode fsdp

Each step draws one combined batch of `--batch-size` x world_size windows
(gpt.batches, the same on every rank) and gives rank r its r-th slice, so
the run is the single-process run on the combined batch: the printed loss
is the mean of the ranks' losses, which is the combined batch's loss.
"""

import argparse
import os
import sys
from typing import List, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402
import max_device.distributed  # noqa: E402  (importing max_device registers Gloo for it)

DEVICE_TYPE = "max_device"


def rank_device(local_rank: int) -> torch.device:
    """max_device:<local rank> when there are enough devices
    (MAX_DEVICE_COUNT), else they are shared round-robin."""
    return torch.device(DEVICE_TYPE, local_rank % torch.max_device.device_count())


def wrap(model: gpt.GPT, mode: str) -> torch.nn.Module:
    if mode == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard
        mesh = max_device.distributed.init_device_mesh((dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        # The root holds the embeddings and the head tied to one of them.
        return fully_shard(model, mesh=mesh)
    raise ValueError(f"mode must be 'ddp' or 'fsdp', got {mode!r}")


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
         targets: torch.Tensor) -> torch.Tensor:
    """gpt.train_step through the wrapper's forward (DDP hooks its gradients there)."""
    optimizer.zero_grad(set_to_none=True)
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    optimizer.step()
    return loss.detach()


def train(mode: str, steps: int, batch_size: int, seed: int = 0,
          config: gpt.GPTConfig = gpt.GPTConfig()) -> Tuple[List[float], torch.nn.Module]:
    """Train on the initialised process group; returns the combined batch's
    loss of each step (the same on every rank) and the wrapped model."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = rank_device(int(os.environ.get("LOCAL_RANK", rank)))
    torch.max_device.set_device(device)
    model = wrap(gpt.make_model(config, seed, str(device)), mode)
    optimizer = gpt.make_optimizer(model)
    losses = []
    for tokens, targets in gpt.batches(config, batch_size * world, steps, seed):
        rows = slice(rank * batch_size, (rank + 1) * batch_size)
        loss = step(model, optimizer, tokens[rows].to(device), targets[rows].to(device))
        dist.all_reduce(loss)
        losses.append(loss.item() / world)
    return losses, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("ddp", "fsdp"), default="ddp")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4, help="windows per rank and step")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # Gloo serves CPU and max_device tensors
    try:
        losses, _ = train(args.mode, args.steps, args.batch_size)
        if dist.get_rank() == 0:
            for step, loss in enumerate(losses):
                print(f"step {step:3d}  loss {loss:.6f}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
