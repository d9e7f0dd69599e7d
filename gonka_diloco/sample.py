"""Text from a model: `gonka-diloco model sample`, and the devnet's G_0-versus-final lines.

Generation is the plain loop over the model's own training forward (`model(idx) -> logits`, the
last `context` tokens each time): greedy by default, or sampled at a temperature from a seeded
generator. Either way the same model, prompt and settings give the same text on one machine,
which is what lets a newcomer compare G_0 with the final model. No KV cache: these are small
models, and the forward is exactly the one that was trained and verified.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from replay.spec import ExportedModelError, exported_section

MAX_TOKENIZER_BYTES = 64 << 20


class TextCodec(Protocol):
    def encode(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class Settings:
    """How to continue a prompt: `temperature` 0 is greedy; `seed` draws the sampled tokens."""

    tokens: int = 80
    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0

    def describe(self) -> str:
        if self.temperature <= 0:
            return f"greedy, {self.tokens} tokens"
        top = f", top-k {self.top_k}" if self.top_k else ""
        return f"sampled at temperature {self.temperature:g}{top}, seed {self.seed}, {self.tokens} tokens"


def folder_tokenizer(folder: Path | str) -> TextCodec:
    """The tokenizer an export ships (tokenizer.json), size-bounded; one line if it has none."""
    from replay.data import DataError
    from replay.prepare import HFTokenizer

    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise ExportedModelError(
            f"{folder}: no tokenizer.json (the export did not know the run's dataset: export again with "
            "--dataset DIR|URL)"
        )
    try:
        return HFTokenizer.from_file(path)
    except DataError as e:
        raise ExportedModelError(str(e)) from None


def context_of(folder: Path | str) -> int:
    """The longest input the exported model takes (its block size or position embeddings)."""
    spec = exported_section(folder).get("model_spec")
    config = spec.get("config", {}) if isinstance(spec, dict) else {}
    for key in ("block_size", "max_position_embeddings"):
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return 128  # replay.model.GPTConfig's default block size


@torch.no_grad()
def generate(model: nn.Module, prompt: Sequence[int], context: int, settings: Settings) -> list[int]:
    """`settings.tokens` token ids after `prompt` (which must not be empty)."""
    if not prompt:
        raise ValueError("the prompt encodes to no tokens")
    ids = list(prompt)
    gen = torch.Generator().manual_seed(settings.seed)
    for _ in range(settings.tokens):
        idx = torch.tensor([ids[-context:]], dtype=torch.long)
        logits = model(idx)[0, -1].float()
        if settings.temperature <= 0:
            ids.append(int(torch.argmax(logits)))
            continue
        logits = logits / settings.temperature
        if settings.top_k:
            cut = torch.topk(logits, min(settings.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < cut, float("-inf"))
        ids.append(int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)))
    return ids[len(prompt) :]


def continue_text(model: nn.Module, codec: TextCodec, prompt: str, context: int, settings: Settings) -> str:
    """The text the model writes after `prompt` (the continuation only)."""
    ids = codec.encode([prompt])[0]
    return codec.decode(generate(model, ids, context, settings))
