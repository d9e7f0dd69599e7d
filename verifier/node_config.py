"""`verifier.toml`: the verifier operator's file, validated strictly (unknown keys are errors).

Mirrors `trainer.node_config.HostConfig` (DEVELOPERS-nodes.md) so one devnet orchestrator can
write both; `threads` is the verifier's replay thread count and the pool bounds are its own.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """The TOML file is missing, unreadable, too large or does not validate."""


MAX_CONFIG_BYTES = 1 << 20


class KeyRef(BaseModel):
    """Where the signing key comes from; exactly one source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mnemonic_file: str = ""
    keyring_dir: str = ""
    name: str = ""
    test_index: int = Field(-1, ge=-1)

    @model_validator(mode="after")
    def _exactly_one(self) -> KeyRef:
        sources = [bool(self.mnemonic_file), bool(self.keyring_dir), self.test_index >= 0]
        if sum(sources) != 1:
            raise ValueError("[key] needs exactly one of mnemonic_file, keyring_dir (+ name), test_index")
        if self.keyring_dir and not self.name:
            raise ValueError("[key] keyring_dir needs a name")
        return self


class VerifierConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    chain_url: str = Field("http://127.0.0.1:26657", pattern=r"^https?://")
    run_id: int = Field(1, ge=1)
    data_dir: str = Field("verifier-data", min_length=1)
    listen: str = "127.0.0.1:0"
    public_url: str = ""
    stake: int = Field(2_000_000_000, ge=0)
    threads: int = Field(1, ge=1, le=256)
    behaviour: str = "honest"
    behaviour_params: dict[str, Any] = Field(default_factory=dict)
    max_concurrent: int = Field(2, ge=1, le=64)
    max_states_in_memory: int = Field(4, ge=3, le=1024, description="one verification holds up to 3")
    fetch_timeout_s: float = Field(30.0, gt=0)
    fetch_retries: int = Field(2, ge=0, le=10)
    poll_interval_s: float = Field(1.0, gt=0)
    key: KeyRef

    @property
    def workers(self) -> int:
        """Concurrent verifications: bounded by the pool and by the states each one may hold."""
        return max(1, min(self.max_concurrent, self.max_states_in_memory // 3))


def load_config(path: str | Path) -> VerifierConfig:
    p = Path(path)
    try:
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES} bytes")
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{p}: {e.strerror or e}") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from e
    try:
        return VerifierConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"{p}: {e}") from e
