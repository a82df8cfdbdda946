"""A small GPT in plain PyTorch, and a deterministic training loop for it.

The model is written out op by op (token and position embeddings, causal
self-attention as matmul + mask + softmax, layer norm, a GELU MLP, residual
connections, a head tied to the token embedding) so that a run on
max_device exercises the ops a plugin can serve: mm/addmm/bmm, softmax and
its backward, gelu, add/mul/div, sum. There is no dropout: training is
deterministic, so runs on two devices can be compared step by step.
tests/python/test_gpt.py trains it on the CPU and on max_device and
compares; bench/bench_gpt.py times its training step.

    .venv/bin/python examples/gpt.py [--device max_device] [--steps 20]
                                     [--plugin build/plugins/libreference.so]
"""

import argparse
import math
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# The training text: character-level, so its alphabet is the vocabulary.
TEXT = (
    "a kernel is a small loop that does one thing well. a plugin is a box of "
    "such loops, loaded while the program runs. when a loop is missing, the "
    "device asks the cpu to do the work on the very same bytes, and nobody "
    "has to copy anything. swap the box, keep the model, train on.\n"
)
ALPHABET = sorted(set(TEXT))
LEARNING_RATE = 3e-3


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 16      # the longest sequence the position embedding covers
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "n_embd must be a multiple of n_head"
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        # True above the diagonal: position t may not attend to positions after t.
        future = torch.ones(config.block_size, config.block_size, dtype=torch.bool).triu(1)
        self.register_buffer("future", future, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        head_dim = width // self.n_head
        # (batch, seq, 3 * width) -> three tensors of (batch, head, seq, head_dim)
        q, k, v = (t.view(batch, seq, self.n_head, head_dim).transpose(1, 2)
                   for t in self.qkv(x).split(width, dim=2))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
        scores = scores.masked_fill(self.future[:seq, :seq], float("-inf"))
        y = scores.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.up = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.down = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_mlp = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.position_embedding = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_final = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight  # tied: one matrix reads and writes tokens
        self.checkpoint_blocks = False
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2's scale: PyTorch's default N(0, 1) embeddings, read back through
        # the tied head, would start with logits of size ~sqrt(n_embd).
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (batch, seq) int64 -> logits (batch, seq, vocab)."""
        seq = tokens.shape[1]
        assert seq <= self.config.block_size, f"sequence {seq} > block_size {self.config.block_size}"
        positions = torch.arange(seq, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            # Activation checkpointing: keep only block inputs, recompute in backward.
            x = checkpoint(block, x, use_reentrant=False) if self.checkpoint_blocks else block(x)
        return self.head(self.ln_final(x))

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def encode(text: str, config: GPTConfig) -> torch.Tensor:
    assert len(ALPHABET) <= config.vocab_size, f"the text has {len(ALPHABET)} characters"
    index = {ch: i for i, ch in enumerate(ALPHABET)}
    return torch.tensor([index[ch] for ch in text], dtype=torch.int64)


def batches(config: GPTConfig, batch_size: int, steps: int, seed: int):
    """`steps` (input, target) pairs of (batch_size, block_size) windows of
    TEXT, the target shifted by one character. Drawn on the CPU from their
    own generator, so they are the same whatever device trains on them."""
    stream = encode(TEXT, config)
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - config.block_size, (steps, batch_size), generator=g)
    offsets = torch.arange(config.block_size)
    for row in starts:
        window = row[:, None] + offsets
        yield stream[window], stream[window + 1]


def make_model(config: GPTConfig, seed: int, device: str = "cpu") -> GPT:
    """A model initialised from `seed` directly on `device`. max_device's
    default generator draws from the CPU default generator's engine, so every
    device gets the same weights."""
    torch.manual_seed(seed)
    with torch.device(device):
        return GPT(config)


def make_optimizer(model: GPT) -> torch.optim.Optimizer:
    # fused=True: the same AdamW on every device, one _fused_adamw_ call per
    # step for all parameters (by default PyTorch would pick the _foreach_
    # variant for max_device and the per-tensor one for the CPU).
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01, fused=True)


def train_step(model: GPT, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
               targets: torch.Tensor, autocast_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Forward, backward and optimizer step; returns the loss (on the device).
    With `autocast_dtype`, the forward runs under torch.autocast."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(tokens.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        loss = model.loss(tokens, targets)
    loss.backward()
    optimizer.step()
    return loss


class TrainResult(NamedTuple):
    losses: List[float]
    parameters: Dict[str, torch.Tensor]  # name -> final value, on the CPU


def train(device: str, steps: int = 8, seed: int = 0, config: GPTConfig = GPTConfig(),
          batch_size: int = 4, autocast_dtype: Optional[torch.dtype] = None,
          checkpoint_blocks: bool = False) -> TrainResult:
    """Train a fresh model `steps` steps on `device`. Deterministic: the same
    seed gives the same initial weights and batches on every device."""
    model = make_model(config, seed, device)
    model.checkpoint_blocks = checkpoint_blocks
    optimizer = make_optimizer(model)
    losses = []
    for tokens, targets in batches(config, batch_size, steps, seed):
        loss = train_step(model, optimizer, tokens.to(device), targets.to(device), autocast_dtype)
        losses.append(loss.item())
    return TrainResult(losses, {name: p.detach().cpu() for name, p in model.named_parameters()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="max_device")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--plugin", help="a plugin .so to load first (e.g. the reference plugin)")
    args = parser.parse_args()
    if args.device.startswith("max_device") or args.plugin:
        import max_device
        if args.plugin:
            max_device.load_plugin(args.plugin)
    result = train(args.device, steps=args.steps)
    for step, loss in enumerate(result.losses):
        print(f"step {step:3d}  loss {loss:.4f}")


if __name__ == "__main__":
    main()
