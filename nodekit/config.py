"""What host.toml and verifier.toml share: where a node lives, its key, its server; named errors.

Everything the *run* is bound to comes from the chain; this file only says where the node lives,
who it is and how it behaves, so a typo is an error at start-up, never a silently honest node.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from cosmpy.aerial.wallet import LocalWallet
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from protocol.config import Stake
from protocol.keys import PASSPHRASE_ENV, Keyring, read_passphrase_file, test_wallet, wallet_from_mnemonic

MAX_CONFIG_BYTES = 64 * 1024
MAX_MNEMONIC_BYTES = 4096


class ConfigError(ValueError):
    """A node's TOML is missing, unreadable, not TOML, or does not validate; the message says where."""


class KeySource(BaseModel):
    """Exactly one way to get the node's key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mnemonic_file: str = ""
    keyring_dir: str = ""
    name: str = ""
    passphrase_file: str = Field(
        "", description="with keyring_dir: a 0600 file whose first line unlocks an encrypted key"
    )
    test_index: int = Field(-1, ge=-1)

    @model_validator(mode="after")
    def _exactly_one(self) -> KeySource:
        chosen = [bool(self.mnemonic_file), bool(self.keyring_dir), self.test_index >= 0]
        if sum(chosen) != 1:
            raise ValueError("[key] needs exactly one of mnemonic_file, keyring_dir (+ name), test_index")
        if self.keyring_dir and not self.name:
            raise ValueError("[key] keyring_dir needs a key `name`")
        if self.passphrase_file and not self.keyring_dir:
            raise ValueError("[key] passphrase_file unlocks a keyring key: give keyring_dir and name")
        return self

    def wallet(self, base: Path = Path(".")) -> LocalWallet:
        if self.test_index >= 0:
            return test_wallet(self.test_index)
        if self.keyring_dir:
            directory = Path(self.keyring_dir).expanduser()
            directory = directory if directory.is_absolute() else base / directory
            try:
                passphrase = (
                    read_passphrase_file(_under(base, self.passphrase_file))
                    if self.passphrase_file
                    else os.environ.get(PASSPHRASE_ENV) or None
                )
                return Keyring(directory, passphrase).wallet(self.name)
            except (OSError, ValueError) as e:
                raise ConfigError(f"[key] keyring {directory}: {e}") from e
        path = base / self.mnemonic_file
        try:
            if path.stat().st_mode & 0o077:
                raise ConfigError(f"{path} is readable by group or others; chmod 600 it")
            raw = path.read_bytes()[: MAX_MNEMONIC_BYTES + 1]
        except OSError as e:
            raise ConfigError(f"cannot read mnemonic file {path}: {e}") from e
        if len(raw) > MAX_MNEMONIC_BYTES:
            raise ConfigError(f"mnemonic file {path} is too large")
        try:
            return wallet_from_mnemonic(raw.decode().strip())
        except (UnicodeDecodeError, ValueError) as e:
            raise ConfigError(f"mnemonic file {path}: {e}") from e


def _under(base: Path, p: str) -> Path:
    path = Path(p).expanduser()
    return path if path.is_absolute() else base / path


class NodeConfig(BaseModel):
    """What every node (host or verifier) configures; relative paths are relative to the TOML file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chain_url: str = Field(pattern=r"^https?://")
    run_id: int = Field(ge=1)
    data_dir: str = Field(min_length=1)
    listen: str = Field("127.0.0.1:0", pattern=r"^[^:\s]+:\d{1,5}$")
    public_url: str = Field("", pattern=r"^(https?://.*)?$", max_length=256)
    stake: int = Field(
        Stake.model_fields["min_verifier_stake"].default,
        ge=0,
        description="ngonka bonded at MsgJoinRun; default: a run's default minimum for the role",
    )
    threads: int = Field(1, ge=1, le=256)
    device: str = Field(
        "cpu",
        pattern=r"^(cpu|cuda(:\d{1,3})?)$",
        description="where the replayable step runs: cpu, cuda (this rank's GPU) or cuda:N",
    )
    behaviour: str = Field("honest", min_length=1)
    behaviour_params: dict[str, Any] = Field(default_factory=dict)
    min_transfer_bps: float = Field(
        1_000_000.0, gt=0, description="slowest a peer may serve before a transfer gives up (bytes/s)"
    )
    key: KeySource
    dataset: str = Field(
        "",
        max_length=4096,
        description="dataset folder or manifest.json, path or fsspec URL ('' = Shakespeare)",
    )
    init_checkpoint: str = Field(
        "", max_length=4096, description="safetensors file or HF model folder holding the run's G_0"
    )
    base_dir: Path = Field(Path("."), exclude=True)

    def path(self, p: str) -> Path:
        return Path(p) if Path(p).is_absolute() else self.base_dir / p

    def _source(self, value: str) -> str:
        """A URL as given; a local path resolved against the TOML's folder; '' stays ''."""
        if not value or re.match(r"^[a-z][a-z0-9+.-]*://", value):
            return value
        return str(self.path(value))

    @property
    def dataset_source(self) -> str:
        return self._source(self.dataset)

    @property
    def init_checkpoint_source(self) -> str:
        return self._source(self.init_checkpoint)

    @property
    def data_path(self) -> Path:
        return self.path(self.data_dir)

    def wallet(self) -> LocalWallet:
        return self.key.wallet(self.base_dir)


C = TypeVar("C", bound=NodeConfig)


def load_node_config(path: str | Path, cls: type[C]) -> C:
    """Read a node's TOML (size-bounded) and validate it as `cls`; failures are `ConfigError`s."""
    path = Path(path)
    try:
        raw = path.read_bytes()[: MAX_CONFIG_BYTES + 1]
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e}") from e
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        data = tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from e
    if "base_dir" in data:
        raise ConfigError(f"{path}: unknown field 'base_dir'")
    try:
        return cls.model_validate({**data, "base_dir": path.parent})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc'])) or '(top)'}: {x['msg']}" for x in e.errors())
        raise ConfigError(f"{path}: {problems}") from e
