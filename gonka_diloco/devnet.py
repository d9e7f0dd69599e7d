"""The devnet orchestrator: one chain, N hosts, M verifiers, each its own OS process over HTTP.

It does only what an operator would do by hand — start a chain, create a run from the authority
key, write each node's TOML, start the nodes, watch the chain and the nodes' `/status` — and
then writes the report. Nothing is shared between nodes but the chain URL, so the devnet
exercises exactly the code paths separate machines would. `Devnet` is also the handle the fault
tests use to kill and restart nodes mid-run.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gonka_diloco.collect import (
    BlockTally,
    collect,
    delta_bytes,
    fetch_status,
    scan_blocks,
    update_from_status,
    validator_rows,
)
from gonka_diloco.devnet_config import (
    HF_MODELS,
    MODEL_SIZES,
    DevnetConfig,
    DevnetConfigError,
    dataset_vocab,
)
from gonka_diloco.live import LiveState, NodeView, progress_line, render
from gonka_diloco.procs import NodeProcess, Supervisor, python_cli
from gonka_diloco.report import FinalModelRow, NodeRow, Snapshot, evaluate, write_report
from protocol.config import Codec, InnerOptim, ModelSpec, OuterOptim, Phases, RunConfig, Stake

if TYPE_CHECKING:
    from chain.abci.cometbft import Localnet
    from chain.client import HttpChainClient

AUTHORITY_INDEX = 0
"""test_wallet(0) is the authority that creates runs; hosts are 1..N, verifiers N+1..N+M."""
HOST_STAKE = 2_000_000_000
VERIFIER_STAKE = 2_000_000_000
CHAIN_ROLES = ("chain", "validator")
FEED_EVENTS = frozenset(
    {
        "joined",
        "trained",
        "committed",
        "revealed",
        "verdict",
        "outcome",
        "outer_step_applied",
        "sitting_out",
        "error",
    }
)
"""Node log events shown in the live view's feed."""
PROGRESS_SECONDS = 10.0
"""Without a terminal (or with --no-live): a plain progress line this often, and at every new step."""
START_TIMEOUT = 120.0
"""Seconds a node may take to print its listening line (torch import on a loaded 2-core box)."""
MODEL_DIR = "model"
"""Where a finished devnet exports its final model, inside its run folder."""
LATEST = "latest"
"""`<out_dir>/latest`: a link to the newest run folder (`gonka-diloco model export runs/latest`)."""
SHAKESPEARE_PROMPT = "**HAMLET**  \n"
"""What G_0 and the final model continue at the end of a Shakespeare devnet (a speaker's line, as
the plays are written); other datasets get `OTHER_PROMPT`."""
OTHER_PROMPT = "The "
SAMPLE_TOKENS = 80
SAMPLE_TEMPERATURE = 0.8
"""Sampled (seeded by the run seed, so reproducible), not greedy: a young model's greedy text is
one word repeated, its samples show the spelling and line shapes it learned."""


class DevnetError(RuntimeError):
    """The devnet could not be set up or did not complete; the message says what and where."""


def _honest_work(behaviour: str) -> bool:
    """Whether a host adversary trains honestly and attacks only what follows (serving, the result
    vote): the report then accepts its contributions and judges it by the result."""
    if behaviour == "honest":
        return False
    try:
        from gonka_diloco.adversaries import HOSTS
    except ImportError:
        return False
    return bool(getattr(HOSTS.get(behaviour), "honest_work", False))


def check_behaviours(cfg: DevnetConfig) -> None:
    """Every adversary named must exist in the adversary library (a clear error otherwise)."""
    try:
        from gonka_diloco import adversaries
    except ImportError:
        if cfg.adversaries or cfg.verifier_adversaries:
            raise DevnetConfigError(
                "the adversary library (gonka_diloco.adversaries) is not installed"
            ) from None
        return
    for spec in cfg.adversaries:
        _resolve(adversaries.resolve_host, "host", spec.behaviour, spec.params)
    for spec in cfg.verifier_adversaries:
        _resolve(adversaries.resolve_verifier, "verifier", spec.behaviour, spec.params)


def _resolve(resolver: Callable[..., Any], role: str, name: str, params: dict[str, Any]) -> None:
    try:
        resolver(name, params)
    except (KeyError, ValueError, TypeError) as e:
        raise DevnetConfigError(f"{role} adversary {name!r}: {e}") from None


def run_config(cfg: DevnetConfig) -> RunConfig:
    """The run's config: the preset GPT seeded with the run seed, G_0's hash (those parameters, zero
    momentum) and the Shakespeare manifest's hash — what every host recomputes and checks."""
    from gonka_diloco.run_cli import dataset_manifest_hash
    from nodekit.globalmodel import GlobalModel
    from replay.spec import build_model

    model = model_spec(cfg)
    phases = Phases(
        join_blocks=cfg.blocks(cfg.phases.join),
        min_hosts=cfg.hosts,  # step 0 waits for every node, however slowly the box starts them
        min_verifiers=cfg.verifiers,
        train_blocks=cfg.blocks(cfg.phases.train),
        reveal_blocks=cfg.blocks(cfg.phases.reveal),
        verify_blocks=cfg.blocks(cfg.phases.verify),
        escalation_blocks=cfg.blocks(cfg.phases.escalation),
        result_blocks=cfg.blocks(cfg.phases.result),
        audit_blocks=cfg.blocks(cfg.phases.audit),
        confirm_blocks=cfg.blocks(cfg.phases.confirm),
        epoch_length=1_000_000,
        poc_window=0,
        early_close=cfg.early_close,
    )
    return RunConfig(
        name="devnet",
        model=model,
        dataset_manifest_hash=dataset_manifest_hash(cfg.dataset),
        initial_model_hash=GlobalModel.from_module(build_model(model), cfg.state_chunk_bytes).hash,
        seed=cfg.seed,
        inner_steps=cfg.inner_steps,
        segment_len=cfg.segment_len,
        sampled_segments=cfg.sampled_segments,
        sampling=cfg.sampling,
        window_segments=cfg.window_segments,
        state_chunk_bytes=cfg.state_chunk_bytes,
        verifiers_per_contribution=cfg.verifiers_per_contribution,
        batch_size=cfg.batch_size,
        seq_len=cfg.seq_len,
        codec=cfg.codec,
        **_sparse_fields(cfg),
        phases=phases,
        stake=Stake(min_host_stake=HOST_STAKE // 2, min_verifier_stake=VERIFIER_STAKE // 2),
        replay_mode=cfg.replay_mode,
        inner=InnerOptim(moments=cfg.run_moments),
        tolerance=cfg.tolerance,
        tolerance_exp_avg=cfg.tolerance_exp_avg,
        tolerance_exp_avg_sq=cfg.tolerance_exp_avg_sq,
        tolerance_update=cfg.tolerance_update,
        tolerance_denominator=cfg.tolerance_denominator,
        tolerance_cumulative=cfg.tolerance_cumulative,
        tolerance_cumulative_update=cfg.tolerance_cumulative_update,
        threads=cfg.threads,
        max_outer_steps=cfg.outer_steps,
        overlap=cfg.overlap,
        outer=_outer(cfg),
    )


def _sparse_fields(cfg: DevnetConfig) -> dict[str, int | float]:
    """Codec sparse: its chunk, k and β (specs §4.1); nothing for the others."""
    if cfg.codec is not Codec.SPARSE:
        return {}
    return {"codec_block_size": cfg.sparse_chunk, "codec_topk": cfg.sparse_topk,
            "codec_ef_decay": cfg.sparse_ef_decay}  # fmt: skip


def _outer(cfg: DevnetConfig) -> OuterOptim:
    """DiLoCo's Nesterov for the dense codecs; for the sparse one its own rule, lr and mean (by
    default Nesterov 0.7 / 0.9 over the contributors' mean: bench/RESULTS.md §11f)."""
    if cfg.codec is not Codec.SPARSE:
        return OuterOptim(lr=cfg.outer_lr, momentum=cfg.outer_momentum)
    return OuterOptim(lr=cfg.sparse_outer_lr, momentum=cfg.outer_momentum, rule=cfg.sparse_outer_rule,
                      sparse_mean=cfg.sparse_mean)  # fmt: skip


def model_spec(cfg: DevnetConfig) -> ModelSpec:
    """`--model`: the GPT preset of `model_size`, or a transformers preset (complete config), seeded;
    with `--dataset`, its vocabulary is the dataset tokenizer's (a BPE of 2048 tokens needs a
    2048-row embedding, not the presets' 256 bytes)."""
    vocab = dataset_vocab(cfg.dataset)
    sized: dict[str, int] = {"vocab_size": vocab} if vocab is not None else {}
    if cfg.model == "gpt":
        return ModelSpec(
            factory="trainer.model:small_gpt",
            config={**MODEL_SIZES[cfg.model_size], "seed": cfg.seed, **sized},
        )
    from replay.hf import spec_config

    arch, preset = HF_MODELS[cfg.model]
    return ModelSpec(factory=f"trainer.hf:{arch}", config=spec_config(arch, preset, seed=cfg.seed, **sized))


def check_dataset(cfg: DevnetConfig) -> None:
    """Before any process starts, what every node would check at its start-up, said in one line
    rather than found in a crashed node's log: the dataset opens, its vocabulary fits the model,
    and each host's data shard and the validation split hold at least one window of seq_len + 1
    tokens and match their manifest hashes."""
    if not cfg.dataset:
        return
    from protocol.keys import test_wallet
    from replay.data import DataError, TokenStream, check_vocab, host_shard, open_dataset

    run = RunConfig(
        model=model_spec(cfg), dataset_manifest_hash="0" * 64, initial_model_hash="0" * 64, seed=cfg.seed,
        inner_steps=cfg.inner_steps, segment_len=cfg.segment_len, sampled_segments=cfg.sampled_segments,
        batch_size=cfg.batch_size, seq_len=cfg.seq_len,
    )  # fmt: skip
    where = f"dataset {cfg.dataset}"
    try:
        corpus = open_dataset(cfg.dataset)
        check_vocab(run, corpus)
        parts = {f"host-{i}'s data shard": host_shard(run, corpus, str(test_wallet(1 + i).address()))
                 for i in range(cfg.hosts)}  # fmt: skip
        for name, tokens in {**parts, "the validation split": corpus.val}.items():
            if tokens.numel() <= cfg.seq_len:
                raise DataError(
                    f"{name} holds {tokens.numel()} tokens, fewer than seq_len + 1 = {cfg.seq_len + 1}: "
                    "give more text or a shorter seq_len"
                )
            if isinstance(tokens, TokenStream):
                tokens.touch()
    except DataError as e:
        raise DevnetConfigError(f"{where}: {e}") from None


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def node_toml(fields: dict[str, Any], key: dict[str, Any]) -> str:
    """host.toml / verifier.toml text (flat fields plus the [key] table)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in fields.items()]
    lines += ["", "[key]", *[f"{k} = {_toml_value(v)}" for k, v in key.items()]]
    return "\n".join(lines) + "\n"


class Devnet:
    """One devnet: its folder, its processes and its chain client. Use as a context manager."""

    def __init__(self, cfg: DevnetConfig, folder: Path | None = None):
        self.cfg = cfg
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        # Absolute: node TOMLs resolve relative paths against their own directory.
        self.folder = (folder or cfg.out_dir / stamp).resolve()
        self.latest = None if folder is not None else cfg.out_dir / LATEST
        self.sup = Supervisor()
        self.rows: dict[str, NodeRow] = {}
        self.procs: dict[str, NodeProcess] = {}
        self.run_id = 0
        self.client: HttpChainClient | None = None
        self.chain_port = 0
        self.chain_url = ""
        self.localnet: Localnet | None = None
        self.tally = BlockTally()
        self.deltas: dict[tuple[int, str], int | None] = {}
        self.restarts: dict[str, int] = {}
        self.started = time.monotonic()
        self.live = LiveState(outer_steps=cfg.outer_steps)
        self._lock = threading.Lock()
        self.local_loss: dict[str, dict[int, float]] = {}
        self.val_loss: dict[str, dict[int, float]] = {}
        self.echo: Callable[[str], None] = lambda line: None
        """Start-up progress lines (`run_devnet` prints them): each process as it comes up."""

    # ------------------------------------------------------------------ setup

    def __enter__(self) -> Devnet:
        self.sup.install_handlers()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sup.close()
        if self.client is not None:
            self.client.close()

    @property
    def chain(self) -> HttpChainClient:
        """The chain client (a clear error before `start`)."""
        if self.client is None:
            raise DevnetError("the devnet has not started: no chain yet")
        return self.client

    def _log(self, name: str) -> Path:
        return self.folder / "logs" / f"{name}.log"

    def _on_event(self, node: str, event: dict[str, Any]) -> None:
        """Node log lines (reader threads): losses for the report, a short feed for the live view."""
        kind = event.get("event")
        step = event.get("outer_step")
        losses = {"trained": ("loss", self.local_loss), "outer_step_applied": ("val_loss", self.val_loss)}
        if kind in losses and isinstance(step, int):
            key, target = losses[kind]
            if isinstance(event.get(key), int | float):
                with self._lock:
                    target.setdefault(node, {})[step] = float(event[key])
        if kind in FEED_EVENTS:
            extra = {
                k: v
                for k, v in event.items()
                if k not in ("ts", "node", "event") and not isinstance(v, dict | list)
            }
            detail = " ".join(f"{k}={str(v)[:40]}" for k, v in list(extra.items())[:6])
            self.live.events.append(f"{node}: {kind} {detail}"[:400])  # the view cuts at its width

    def row(self, name: str) -> NodeRow:
        """The node's row with everything its log said so far."""
        proc = self.procs.get(name)
        with self._lock:
            update: dict[str, Any] = {
                "local_loss": dict(self.local_loss.get(name, {})),
                "val_loss": dict(self.val_loss.get(name, {})),
                "restarts": self.restarts.get(name, 0),
            }
        if proc is not None and proc.proc is not None:
            update["alive"] = proc not in self.sup.crashed()
        return self.rows[name].model_copy(update=update)

    def start_chain(self) -> str:
        """Start (or restart, on the same port and disk) the chain; returns its URL (with the
        CometBFT engine: every validator's, comma-separated, which is what clients take)."""
        if self.cfg.engine == "cometbft":
            return self._start_validators()
        argv = python_cli(
            "chain", "start", "--home", str(self.folder / "chain"), "--port", str(self.chain_port),
            "--block-interval", str(self.cfg.block_interval),
        )  # fmt: skip
        proc = self.procs.get("chain")
        if proc is None:
            proc = self.procs["chain"] = self.sup.add(NodeProcess("chain", argv, self._log("chain")))
        proc.argv = argv  # a restart must come back where every node already points
        proc.start()
        url = proc.wait_listening(START_TIMEOUT)
        self.chain_port = int(url.rsplit(":", 1)[1].split("/")[0])
        return url

    def _start_validators(self) -> str:
        """Write the localnet on first start, then start every validator not running; each comes
        back on its own home and ports, so a restart rejoins the network where it left."""
        from chain.abci.cometbft import LOCALNET_FILE, Localnet, write_localnet
        from chain.node import dev_genesis

        folder = self.folder / "chain"
        if (folder / LOCALNET_FILE).exists():
            self.localnet = Localnet.load(folder)
        else:
            self.localnet = write_localnet(
                folder, self.cfg.validators, genesis=dev_genesis(), block_interval=self.cfg.block_interval
            )
        started = []
        for v in self.localnet.validators:
            proc = self.procs.get(v.name)
            if proc is None:
                argv = python_cli("chain", "start", "--engine", "cometbft", "--home", str(folder / v.home))
                proc = self.procs[v.name] = self.sup.add(NodeProcess(v.name, argv, self._log(v.name)))
            if not proc.alive:
                proc.start()
                started.append(proc)
        for proc in started:
            proc.wait_listening(START_TIMEOUT)
        return ",".join(self.localnet.rest_urls)

    def _chain_rows(self, url: str) -> None:
        if self.localnet is None:
            self.rows["chain"] = NodeRow(name="chain", role="chain", url=url, log="logs/chain.log")
            return
        for v in self.localnet.validators:
            self.rows[v.name] = NodeRow(
                name=v.name, role="validator", url=v.rest_url, address=v.address, log=f"logs/{v.name}.log"
            )

    @property
    def chain_names(self) -> list[str]:
        """The chain's processes: `chain`, or `validator-0` … under CometBFT."""
        return [n.name for n in self.rows.values() if n.role in CHAIN_ROLES]

    def create_run(self, url: str) -> int:
        from chain.client import HttpChainClient
        from protocol.keys import test_wallet
        from protocol.messages import MsgCreateRun

        self.client = HttpChainClient(url)
        authority = test_wallet(AUTHORITY_INDEX)
        config = run_config(self.cfg)
        (self.folder / "run.json").write_text(config.model_dump_json(indent=2))
        result = self.chain.broadcast(
            authority, [MsgCreateRun(creator=str(authority.address()), config=config)]
        )
        for event in result.events:
            if event.type == "create_run":
                return int(event.attributes["run_id"])
        runs = self.chain.query("runs")["runs"]
        if not runs:
            raise DevnetError("MsgCreateRun was committed but the chain lists no run")
        return int(runs[-1]["run_id"])

    def _add_node(
        self, name: str, role: str, index: int, behaviour: str, params: dict[str, Any], url: str
    ) -> None:
        from protocol.keys import test_wallet

        home = self.folder / name  # the node's own disk; its name is the folder's
        home.mkdir(parents=True, exist_ok=True)
        fields: dict[str, Any] = {
            "chain_url": url,
            "run_id": self.run_id,
            "data_dir": str(home),
            "listen": "127.0.0.1:0",
            "stake": HOST_STAKE if role == "host" else VERIFIER_STAKE,
            "threads": self.cfg.threads,
            "behaviour": behaviour,
            "behaviour_params": params,
        }
        if role == "host" and self.cfg.checkpoint_every is not None:  # else the run's w (host.toml's default)
            fields["checkpoint_every"] = self.cfg.checkpoint_every
        if self.cfg.dataset:
            ds = self.cfg.dataset
            fields["dataset"] = ds if "://" in ds else str(Path(ds).resolve())
        config_path = home / f"{role}.toml"
        config_path.write_text(node_toml(fields, {"test_index": index}))
        proc = NodeProcess(
            name,
            python_cli(role, "run", "--config", str(config_path)),
            self._log(name),
            on_event=self._on_event,
        )
        self.sup.add(proc)
        self.procs[name] = proc
        self.rows[name] = NodeRow(
            name=name,
            role=role,
            behaviour=behaviour,
            honest_work=role == "host" and _honest_work(behaviour),
            address=str(test_wallet(index).address()),
            log=str(self._log(name).relative_to(self.folder)),
        )

    def start(self) -> None:
        """Chain, run, then every node; returns once all of them are listening."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "devnet.json").write_text(self.cfg.model_dump_json(indent=2))
        self._link_latest()
        validators = f" ({self.cfg.validators} CometBFT validators)" if self.cfg.engine == "cometbft" else ""
        self.echo(f"devnet: starting the chain{validators}")
        url = self.chain_url = self.start_chain()
        self._chain_rows(url)
        self.run_id = self.create_run(url)
        for i, (behaviour, params) in enumerate(self.cfg.host_behaviours()):
            self._add_node(f"host-{i}", "host", 1 + i, behaviour, params, url)
        for j, (behaviour, params) in enumerate(self.cfg.verifier_behaviours()):
            self._add_node(f"verifier-{j}", "verifier", 1 + self.cfg.hosts + j, behaviour, params, url)
        nodes = [name for name in self.procs if name not in self.chain_names]
        self.echo(f"devnet: run {self.run_id} created; starting {len(nodes)} nodes (each loads torch first)")
        for name in nodes:
            self.procs[name].start()
        for k, name in enumerate(nodes, 1):
            url = self.procs[name].wait_listening(START_TIMEOUT)
            self.rows[name] = self.rows[name].model_copy(update={"url": url})
            self.echo(f"devnet: {name} listening at {url} ({k}/{len(nodes)})")
        self.live.run_id = self.run_id
        self.live.nodes = [
            NodeView(n.name, n.role, n.behaviour) for n in self.rows.values() if n.role not in CHAIN_ROLES
        ]

    def _link_latest(self) -> None:
        """Point `<out_dir>/latest` at this run folder (replaced atomically; a courtesy, so a
        failure to link is ignored)."""
        if self.latest is None:
            return
        tmp = self.latest.with_name(f".{LATEST}-{os.getpid()}")
        try:
            tmp.unlink(missing_ok=True)
            os.symlink(self.folder.name, tmp)
            os.replace(tmp, self.latest)
        except OSError:
            tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------------ faults

    def kill(self, name: str) -> None:
        """SIGKILL a node's process group (fault injection)."""
        self.procs[name].kill()

    def restart(self, name: str, env: dict[str, str] | None = None) -> None:
        """Start a killed node again with the same config, disk and (for the chain) port; `env`
        replaces its extra environment (a validator restarted with a test fault, say)."""
        self.restarts[name] = self.restarts.get(name, 0) + 1
        if env is not None:
            self.procs[name].env = env
        if name in self.chain_names:
            self.start_chain()
            return
        proc = self.procs[name]
        proc.start()
        self.rows[name] = self.rows[name].model_copy(update={"url": proc.wait_listening(START_TIMEOUT)})

    # ------------------------------------------------------------------ watching

    def poll(self) -> dict[str, Any]:
        """One look at the chain and every node; updates the live view; returns the run summary."""
        run = self.chain.query("run", run_id=self.run_id)
        step = self.chain.query("outer_step", run_id=self.run_id, step=run["current_step"])
        for n in run.get("steps_in_flight") or [run["current_step"]]:  # overlapped: two steps
            self._measure_deltas(n)
        names = {r.address: r.name for r in self.rows.values() if r.address}
        for view in self.live.nodes:
            proc = self.procs[view.name]
            view.alive = proc.alive
            status = fetch_status(self.rows[view.name].url) if proc.alive else None
            if status is not None:
                view.status = status
                self.rows[view.name] = update_from_status(self.rows[view.name], status)
        self.live.height = step["height"]
        self.live.outer_step = run["current_step"]
        self.live.phase = step["phase"]
        self.live.run_status = run["status"]
        self.live.committed = len(step["committed"])
        self.live.accepted = [names.get(a, a) for a in step["accepted"]]
        self.live.outcomes = {names.get(a, a): o or "" for a, o in step["outcomes"].items()}
        rows = [self.row(n) for n in self.rows]
        self.live.val_loss = Snapshot(run_id=self.run_id, nodes=rows).val_loss()
        self.live.elapsed_s = time.monotonic() - self.started
        return run

    def _measure_deltas(self, current: int) -> None:
        """Δ blob sizes, read as soon as each is revealed (hosts prune them once a step is done)."""
        for r in self.chain.query("reveals", run_id=self.run_id, step=current)["reveals"]:
            key = (current, r["host"])
            if key not in self.deltas:
                self.deltas[key] = delta_bytes(r["endpoint"], r["delta_hash"])

    def watch(
        self,
        until: Callable[[dict[str, Any]], bool] | None = None,
        *,
        timeout: float | None = None,
        live: bool = False,
        lines: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Follow blocks until `until(run)` (default: the run finished); raises on crash or stall.
        `live` redraws the rich view; `lines` gets a plain progress line every PROGRESS_SECONDS
        and at each new outer step (for a pipe, where a redrawn view shows nothing until the end)."""
        from rich.live import Live

        until = until or (lambda run: run["status"] == "finished")
        deadline = time.monotonic() + (timeout if timeout is not None else self.cfg.timeout)
        height = self.chain.height()
        view = Live(render(self.live), refresh_per_second=4, transient=False) if live else nullcontext()
        said_at, said_step = -math.inf, -1
        with view as screen:
            while True:
                run = self.poll()
                if screen is not None:
                    screen.update(render(self.live))
                now = time.monotonic()
                if lines is not None and (
                    now - said_at >= PROGRESS_SECONDS or self.live.outer_step != said_step
                ):
                    lines(progress_line(self.live))
                    said_at, said_step = now, self.live.outer_step
                if until(run):
                    return run
                crashed = self.sup.crashed()
                if crashed:
                    raise DevnetError(
                        f"{crashed[0].name} crashed (exit {crashed[0].returncode}); see {crashed[0].log_path}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DevnetError(
                        f"run stalled: not done within the timeout (step {run['current_step']})"
                    )
                height = self._next_block(height, min(remaining, 30.0))

    def _next_block(self, height: int, timeout: float) -> int:
        """The next block's height, or the same height if none came within `timeout`."""
        from chain.client import ChainTimeout

        try:
            return int(self.chain.wait_for_block(height, timeout=timeout).height)
        except ChainTimeout:
            return height

    # ------------------------------------------------------------------ the end

    def settle_losses(self, timeout: float = 30.0) -> None:
        """Wait (block by block) until every running honest host logged the final validation loss."""
        honest = [r.name for r in self.rows.values() if r.role == "host" and r.behaviour == "honest"]
        deadline = time.monotonic() + timeout
        height = self.chain.height()
        while time.monotonic() < deadline:
            pending = [
                h for h in honest if self.procs[h].alive and len(self.row(h).val_loss) < self.cfg.outer_steps
            ]
            if not pending:
                return
            height = self._next_block(height, max(0.1, deadline - time.monotonic()))

    def snapshot(self, failures: list[str] | None = None) -> Snapshot:
        """Everything the chain and the nodes said, as the report's input."""
        rows = [self.row(n) for n in self.rows]
        try:
            scan_blocks(self.chain, self.run_id, self.tally, self.chain.height())
            snap = collect(self.chain, self.run_id, rows, tally=self.tally)
        except Exception as e:  # the chain itself is gone: report what we know
            failures = [*(failures or []), f"cannot read the chain at the end: {e}"]
            snap = Snapshot(run_id=self.run_id, nodes=rows, chain_url=self.chain_url)
        for c in snap.contributions:
            c.delta_bytes = self.deltas.get((c.outer_step, c.address))
        if self.localnet is not None:
            snap.validators = validator_rows(
                [(v.name, v.rest_url, v.address) for v in self.localnet.validators], self.tally, self.restarts
            )
        snap.wall_s = time.monotonic() - self.started
        snap.failures = [*(failures or [])]
        from gonka_diloco.export import chain_id_of

        snap.chain_id = chain_id_of(self.chain)
        return snap

    def export_final_model(self, snap: Snapshot, echo: Callable[[str], None]) -> None:
        """A finished run's final model, exported from the nodes' disks (honest hosts first) into
        `<folder>/model`, and what G_0 and it write after one prompt (seeded): into the snapshot
        and printed. Run after the nodes stopped: a final model that no honest disk holds intact
        is a failure (it must outlive the nodes that trained it)."""
        from gonka_diloco.export import ExportError, export, final_from_snapshot
        from gonka_diloco.sample import Settings, context_of, continue_text, folder_tokenizer
        from replay.spec import ExportedModelError, build_model, load_exported

        if snap.run_status != "finished":
            return
        try:
            final = final_from_snapshot(snap, self.folder)
            final.dataset = self.cfg.dataset
            path, who = export(final, self.folder / MODEL_DIR)
        except ExportError as e:
            snap.failures.append(f"the final model could not be exported: {e}")
            return
        echo(f"devnet: final model {final.prov.model_hash[:12]} exported to {path} (read from {who})")
        prompt = OTHER_PROMPT if self.cfg.dataset else SHAKESPEARE_PROMPT
        settings = Settings(tokens=SAMPLE_TOKENS, temperature=SAMPLE_TEMPERATURE, seed=self.cfg.seed)
        row = FinalModelRow(
            folder=MODEL_DIR, model_hash=final.prov.model_hash, prompt=prompt, settings=settings.describe()
        )
        try:
            codec, context = folder_tokenizer(path), context_of(path)
            for name, model in (("G_0", build_model(final.cfg.model).eval()), ("final", load_exported(path))):
                row.samples[name] = continue_text(model, codec, prompt, context, settings)
        except (ExportedModelError, ValueError) as e:
            snap.notes.append(f"no text sample from the final model: {e}")
        snap.final_model = row
        if row.samples:
            echo(f"devnet: text after {json.dumps(prompt)} ({settings.describe()}):")
            for name, text in row.samples.items():
                echo(f"  {name:>5}: {json.dumps(text, ensure_ascii=False)}")


def run_devnet(
    cfg: DevnetConfig, folder: Path | None = None, *, echo: Callable[[str], None] = print
) -> Snapshot:
    """Run a whole devnet and write its report; the snapshot's `failures` decide the exit code."""
    check_behaviours(cfg)
    check_dataset(cfg)
    with Devnet(cfg, folder) as dn:
        failures: list[str] = []
        try:
            echo(f"devnet: starting in {dn.folder}")
            dn.echo = echo
            dn.start()
            chain = f"{len(dn.chain_names)} validators" if dn.localnet else f"chain {dn.chain_url}"
            nodes = len(dn.procs) - len(dn.chain_names)
            echo(f"devnet: {chain}, run {dn.run_id}, {nodes} nodes listening")
            view = cfg.live and sys.stdout.isatty()  # a pipe gets plain lines instead of frames
            dn.watch(live=view, lines=None if view else echo)
            if view:
                echo("")
            dn.settle_losses()
        except DevnetError as e:
            failures.append(str(e))
        except Exception as e:  # anything else still ends in a report; the traceback goes to a log
            (dn.folder / "logs").mkdir(parents=True, exist_ok=True)
            (dn.folder / "logs" / "devnet-error.log").write_text(traceback.format_exc())
            failures.append(f"{type(e).__name__}: {e} (see logs/devnet-error.log)")
        except KeyboardInterrupt:
            failures.append("interrupted (Ctrl-C)")
        snap = dn.snapshot(failures) if dn.client is not None else Snapshot(run_id=0, failures=failures)
        snap.failures = [*failures, *(f for f in evaluate(snap) if f not in failures)]
        dn.close()
        dn.export_final_model(snap, echo)
        report = write_report(snap, dn.folder)
        echo(f"devnet: report at {report}")
        return snap
