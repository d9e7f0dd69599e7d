"""The pinned CometBFT binary, and the homes, keys, genesis and configs of a local n-validator network.

The binary is built from source by `make cometbft` (`go install …/cmd/cometbft@COMETBFT_VERSION`
into `.tools/cometbft-<version>/bin`, never a downloaded binary), or on first use by whatever needs
it (`ensure_binary`: `devnet --engine cometbft`, `chain localnet`); a second build is a no-op.

`write_localnet` lays out one CometBFT home per validator: `cometbft init` makes each one's
consensus and node keys, then this module writes the one genesis all of them share (the validator
set, consensus params sized to the app's `Limits`, and our `Genesis` as `app_state`, which is where
the app reads its genesis too) and patches each `config.toml` from CometBFT's own defaults:
every listener on 127.0.0.1 (the P2P default is 0.0.0.0), persistent peers, block timing from the
block interval, an unbounded-enough mempool, no tx indexer (the app serves txs from its store).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chain.app import Limits
from chain.genesis import Genesis

COMETBFT_VERSION = "v0.38.26"
"""The newest v0.38.x the Go module proxy serves (Gonka runs CometBFT 0.38); the Makefile pins the same."""
COMETBFT_MODULE = "github.com/cometbft/cometbft/cmd/cometbft"
BINARY_ENV = "GONKA_COMETBFT"
"""Override the binary's path (e.g. a system-wide build of the same version)."""
REPO = Path(__file__).resolve().parents[2]
LOCALNET_FILE = "localnet.json"
NODE_FILE = "gonka.json"
"""In each validator home: its name and REST port, read by `chain start --engine cometbft`."""
VALIDATOR_POWER = 10


class CometBFTError(RuntimeError):
    """The CometBFT binary is missing or a home cannot be prepared; the message says how to fix it."""


def binary_path() -> Path:
    override = os.environ.get(BINARY_ENV)
    if override:
        return Path(override)
    return REPO / ".tools" / f"cometbft-{COMETBFT_VERSION}" / "bin" / "cometbft"


def ensure_binary(build: bool = True, progress: Callable[[str], None] | None = None) -> Path:
    """The binary's path; builds it with `go install` (`make cometbft`'s recipe) if missing, on
    first use: only `--engine cometbft` needs it. The build takes minutes, so it says so first
    (`progress`, default: a line on stderr) and when it is done."""
    path = binary_path()
    if path.exists():
        return path
    if not build:
        raise CometBFTError(f"no CometBFT binary at {path}: run `make cometbft`")
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    say(f"building CometBFT {COMETBFT_VERSION} from source (go install {COMETBFT_MODULE}) into "
        f"{path.parent}: first use only, a few minutes")  # fmt: skip
    started = time.monotonic()
    env = {**os.environ, "GOBIN": str(path.parent)}
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["go", "install", f"{COMETBFT_MODULE}@{COMETBFT_VERSION}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    except FileNotFoundError:
        raise CometBFTError("building CometBFT needs the Go toolchain (`go`) on PATH") from None
    if done.returncode != 0 or not path.exists():
        raise CometBFTError(f"go install {COMETBFT_MODULE}@{COMETBFT_VERSION} failed:\n{done.stderr[-4000:]}")
    say(f"built CometBFT {COMETBFT_VERSION} in {time.monotonic() - started:.0f} s: {path}")
    return path


def version(binary: Path | None = None) -> str:
    out = subprocess.run(
        [str(binary or ensure_binary()), "version"], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


# ---------------------------------------------------------------- config.toml


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))


def patch_toml(text: str, changes: dict[str, dict[str, Any]]) -> str:
    """Replace `key = value` lines of CometBFT's config template, by [section] ("" = top level).
    Every key must exist in the template: a typo is an error, never a silently ignored setting."""
    section = ""
    pending = {sec: dict(keys) for sec, keys in changes.items()}
    lines = []
    for line in text.splitlines():
        header = re.match(r"^\[([A-Za-z0-9_.-]+)\]\s*$", line)
        if header:
            section = header.group(1)
        else:
            match = re.match(r"^([A-Za-z0-9_-]+)\s*=", line)
            if match and match.group(1) in pending.get(section, {}):
                key = match.group(1)
                line = f"{key} = {_toml_value(pending[section].pop(key))}"
        lines.append(line)
    missing = {sec: sorted(keys) for sec, keys in pending.items() if keys}
    if missing:
        raise CometBFTError(f"keys not in CometBFT's config template: {missing}")
    return "\n".join(lines) + "\n"


def duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def node_config(
    *,
    moniker: str,
    p2p_port: int,
    rpc_port: int,
    peers: list[str],
    block_interval: float,
    limits: Limits,
) -> dict[str, dict[str, Any]]:
    """The settings this project changes from CometBFT's defaults (read in config/config.go)."""
    return {
        "": {
            "moniker": moniker,
            "proxy_app": "tcp://127.0.0.1:26658",  # replaced at start by --proxy_app (the app's port)
            "log_level": "*:error,state:info,consensus:error",
        },
        "rpc": {"laddr": f"tcp://127.0.0.1:{rpc_port}", "grpc_laddr": "", "pprof_laddr": ""},
        "p2p": {
            "laddr": f"tcp://127.0.0.1:{p2p_port}",
            "external_address": f"127.0.0.1:{p2p_port}",
            "persistent_peers": ",".join(peers),
            "addr_book_strict": False,  # loopback addresses are not routable
            "allow_duplicate_ip": True,  # every validator is on 127.0.0.1
            "pex": False,  # the peers are known: no address exchange
        },
        "mempool": {
            "size": 50_000,
            "cache_size": 100_000,
            "max_tx_bytes": limits.max_tx_bytes,
        },
        "consensus": {
            # A block every `block_interval`: the commit wait is the interval; the other timeouts
            # only matter when a validator is down or slow, and grow by their deltas each round.
            "timeout_commit": duration(block_interval),
            "timeout_propose": duration(max(1.0, 4 * block_interval)),
            "timeout_propose_delta": duration(0.25),
            "timeout_prevote": duration(max(0.25, block_interval)),
            "timeout_prevote_delta": duration(0.1),
            "timeout_precommit": duration(max(0.25, block_interval)),
            "timeout_precommit_delta": duration(0.1),
            "create_empty_blocks": True,  # phases are counted in blocks: the chain must tick
        },
        "tx_index": {"indexer": "null"},
        "instrumentation": {"prometheus": False},
    }


# ---------------------------------------------------------------- localnet


@dataclass(frozen=True)
class ValidatorHome:
    """One validator of a localnet: where it lives and where it listens (all on 127.0.0.1)."""

    name: str
    home: str  # relative to the localnet folder
    address: str  # consensus address, upper-case hex (as CometBFT prints it)
    node_id: str
    p2p_port: int
    rpc_port: int
    rest_port: int

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def rpc_url(self) -> str:
        return f"http://127.0.0.1:{self.rpc_port}"


@dataclass(frozen=True)
class Localnet:
    folder: Path
    chain_id: str
    block_interval: float
    validators: tuple[ValidatorHome, ...]

    def home(self, name: str) -> Path:
        return self.folder / next(v.home for v in self.validators if v.name == name)

    @property
    def rest_urls(self) -> list[str]:
        return [v.rest_url for v in self.validators]

    def to_json(self) -> str:
        return json.dumps(
            {
                "chain_id": self.chain_id,
                "block_interval": self.block_interval,
                "validators": [asdict(v) for v in self.validators],
            },
            indent=2,
        )

    @classmethod
    def load(cls, folder: Path) -> Localnet:
        data = json.loads((folder / LOCALNET_FILE).read_text())
        return cls(
            folder=folder,
            chain_id=data["chain_id"],
            block_interval=float(data["block_interval"]),
            validators=tuple(ValidatorHome(**v) for v in data["validators"]),
        )


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports (held open together, so no two are the same)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_id(home: Path) -> str:
    """CometBFT's node ID: hex of the first 20 bytes of SHA-256 of the ed25519 node public key."""
    key = json.loads((home / "config" / "node_key.json").read_text())["priv_key"]["value"]
    return hashlib.sha256(base64.b64decode(key)[32:]).digest()[:20].hex()


def rfc3339_now() -> tuple[str, int]:
    now = datetime.now(UTC).replace(microsecond=0)
    return now.strftime("%Y-%m-%dT%H:%M:%SZ"), int(now.timestamp())


def consensus_params(limits: Limits) -> dict[str, Any]:
    return {
        "block": {"max_bytes": str(limits.block_max_bytes), "max_gas": str(limits.block_max_gas)},
        "evidence": {
            "max_age_num_blocks": "100000",
            "max_age_duration": "172800000000000",
            "max_bytes": "1048576",
        },
        "validator": {"pub_key_types": ["ed25519"]},
        "version": {"app": "1"},
        "abci": {"vote_extensions_enable_height": "0"},
    }


def write_localnet(
    folder: Path,
    n_validators: int,
    *,
    genesis: Genesis,
    block_interval: float = 0.5,
    base_port: int = 0,
    limits: Limits = Limits(),
    binary: Path | None = None,
) -> Localnet:
    """Keys, one shared genesis and a config per validator in `folder/node<i>`; returns the layout.
    `base_port` 0 picks free ports; otherwise validator i uses base + 10·i + {0: p2p, 1: rpc, 2: REST}."""
    if n_validators < 1:
        raise CometBFTError("a network needs at least one validator")
    if (folder / LOCALNET_FILE).exists():
        raise CometBFTError(f"{folder} already holds a localnet; choose an empty folder")
    binary = binary or ensure_binary()
    folder.mkdir(parents=True, exist_ok=True)
    if base_port:
        ports = [base_port + 10 * i + k for i in range(n_validators) for k in range(3)]
    else:
        ports = free_ports(3 * n_validators)
    genesis_time, genesis_unix = rfc3339_now()
    app_genesis = genesis.model_copy(update={"genesis_time": float(genesis_unix)})
    homes: list[ValidatorHome] = []
    keys: list[dict[str, Any]] = []
    for i in range(n_validators):
        home = folder / f"node{i}"
        done = subprocess.run(
            [str(binary), "init", "--home", str(home)], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise CometBFTError(f"cometbft init {home} failed: {done.stderr[-2000:]}")
        key = json.loads((home / "config" / "priv_validator_key.json").read_text())
        keys.append(key)
        p2p, rpc, rest = ports[3 * i : 3 * i + 3]
        homes.append(
            ValidatorHome(
                name=f"validator-{i}",
                home=f"node{i}",
                address=key["address"].upper(),
                node_id=node_id(home),
                p2p_port=p2p,
                rpc_port=rpc,
                rest_port=rest,
            )
        )
    doc = {
        "genesis_time": genesis_time,
        "chain_id": genesis.chain_id,
        "initial_height": "1",
        "consensus_params": consensus_params(limits),
        "validators": [
            {"address": v.address, "pub_key": k["pub_key"], "power": str(VALIDATOR_POWER), "name": v.name}
            for v, k in zip(homes, keys, strict=True)
        ],
        "app_hash": "",
        "app_state": json.loads(app_genesis.model_dump_json()),
    }
    for v in homes:
        home = folder / v.home
        (home / "config" / "genesis.json").write_text(json.dumps(doc, indent=2))
        peers = [f"{p.node_id}@127.0.0.1:{p.p2p_port}" for p in homes if p is not v]
        config = home / "config" / "config.toml"
        changes = node_config(
            moniker=v.name,
            p2p_port=v.p2p_port,
            rpc_port=v.rpc_port,
            peers=peers,
            block_interval=block_interval,
            limits=limits,
        )
        config.write_text(patch_toml(config.read_text(), changes))
        (home / NODE_FILE).write_text(
            json.dumps({"name": v.name, "rest_port": v.rest_port, "block_interval": block_interval})
        )
    net = Localnet(folder, genesis.chain_id, block_interval, tuple(homes))
    (folder / LOCALNET_FILE).write_text(net.to_json())
    return net


# ---------------------------------------------------------------- reading a home


@dataclass(frozen=True)
class HomeInfo:
    """What a validator process needs from its CometBFT home."""

    home: Path
    name: str
    genesis: Genesis
    genesis_bytes: bytes
    rpc_url: str
    rest_port: int
    block_interval: float
    address: str


def read_home(home: Path) -> HomeInfo:
    """The app's genesis (`app_state` of CometBFT's genesis.json), the RPC address and our settings."""
    try:
        doc = json.loads((home / "config" / "genesis.json").read_text())
        config = tomllib.loads((home / "config" / "config.toml").read_text())
        node = json.loads((home / NODE_FILE).read_text()) if (home / NODE_FILE).exists() else {}
        key = json.loads((home / "config" / "priv_validator_key.json").read_text())
    except (OSError, ValueError) as exc:
        raise CometBFTError(f"{home} is not a validator home (run `chain localnet`): {exc}") from None
    app_state = json.dumps(doc["app_state"]).encode()
    genesis = Genesis.model_validate_json(app_state)
    if genesis.chain_id != doc["chain_id"]:
        raise CometBFTError(f"{home}: app_state chain id {genesis.chain_id} != {doc['chain_id']}")
    laddr = config["rpc"]["laddr"].removeprefix("tcp://")
    return HomeInfo(
        home=home,
        name=node.get("name", home.name),
        genesis=genesis,
        genesis_bytes=app_state,
        rpc_url=f"http://{laddr}",
        rest_port=int(node.get("rest_port", 1317)),
        block_interval=float(node.get("block_interval", 1.0)),
        address=key["address"].upper(),
    )


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the engine dies with the validator process even when that one is SIGKILLed."""
    import ctypes
    import signal

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn(home: Path, abci_port: int, log_path: Path, binary: Path | None = None) -> subprocess.Popen[bytes]:
    """Start `cometbft start` on `home`, connecting to the app on 127.0.0.1:`abci_port`."""
    binary = binary or ensure_binary(build=False)
    log = log_path.open("ab")
    try:
        return subprocess.Popen(
            [str(binary), "start", "--home", str(home), "--proxy_app", f"tcp://127.0.0.1:{abci_port}"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_set_pdeathsig if os.name == "posix" else None,
        )
    finally:
        log.close()
