"""A small byte-level GPT, nanoGPT-style, in one file.

Initialisation draws from a local `torch.Generator` so that the same (config, seed) gives the
same weights on every machine without touching the global RNG: the initial model hash of a run
must be reproducible by anyone holding the run config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

VOCAB_SIZE = 256  # bytes


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128
    vocab_size: int = VOCAB_SIZE
    dropout: float = 0.0
    bias: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1")
        if self.n_embd % self.n_head:
            raise ValueError("GPTConfig.n_embd must be a multiple of n_head")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("GPTConfig.dropout must be in [0, 1)")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        # Untied head: weight tying would make two state names share one tensor, which a flat
        # named training state (and its hash) should not have to special-case.
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self._init_weights(cfg.seed)

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        """GPT-2 init from a local generator, in named-parameter order (stable across runs)."""
        g = torch.Generator().manual_seed(seed)
        proj_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith(".bias") or ".ln_" in name or name.startswith("ln_"):
                p.fill_(1.0 if name.endswith(".weight") else 0.0)
            else:
                std = proj_std if name.endswith("c_proj.weight") else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(self, idx: Tensor) -> Tensor:
        """Token ids (B, T) -> logits (B, T, vocab)."""
        seq_len = idx.shape[1]
        if seq_len > self.config.block_size:
            raise ValueError(f"sequence length {seq_len} exceeds block_size {self.config.block_size}")
        pos = torch.arange(seq_len, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy over next bytes."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def small_gpt(**config: int | float | bool) -> GPT:
    """The factory a `ModelSpec` names (`trainer.model:small_gpt`)."""
    known = set(GPTConfig.__dataclass_fields__)
    unknown = set(config) - known
    if unknown:
        raise ValueError(f"unknown GPT config keys: {sorted(unknown)}")
    return GPT(GPTConfig(**config))  # type: ignore[arg-type]
