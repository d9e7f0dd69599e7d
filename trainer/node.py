"""The host node: follow the chain's phases and train, commit, reveal, aggregate, report, repeat.

The chain is the source of truth for *where* the run is; the node's own disk (`data_dir`) is the
source of truth for *what it did*. Every step is idempotent against both, so a node killed at
any point and restarted on the same `data_dir` re-derives where it stands: it never commits a
second, different contribution for one outer step, reveals what it committed, and sits out an
outer step whose deadline it missed. Only Δs the chain finalized as accepted reach the model.

The node is its protocol script (`outer_step`: train → commit → reveal → aggregate); in a run with
the overlapped schedule (specs §2.2.1) the same script runs with its tail (reveal → aggregate) on a
thread of its own, so the node trains step n+1, as soon as the chain opens it, while step n is
revealed, verified and aggregated. The parts
it is built from are `nodekit`'s (chain view, store, fetcher, server, board), shared with the
verifier. Under torchrun this is rank 0, the only rank that talks to the chain, serves and
writes `data_dir`; its `team` (`trainer.ddp.Team`) makes the other ranks train each batch with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from chain.client import ChainClient, ChainTimeout, TxFailed
from nodekit.blobs import (
    BlobCatalog,
    BlobClient,
    BlobError,
    ServerThread,
    StoredObject,
    build_app,
    fetch_to_store,
    parse_listen,
)
from nodekit.board import Board
from nodekit.chainview import (
    Accepted,
    ChainView,
    ErrDuplicateCommit,
    Outcome,
    Phase,
    ResultRound,
    StartState,
    StepInfo,
    Stopped,
    is_chain_error,
)
from nodekit.eager import EagerStart, eager_start
from nodekit.globalmodel import GlobalModel, GlobalStore
from nodekit.memory import release, tune_allocator
from nodekit.node import NodeError, join_run, json_line
from nodekit.objects import DOMAINS, Kind, ObjectPolicy, TransferPolicy
from nodekit.reach import Reach, reach
from nodekit.statestore import StateStore
from nodekit.store import (
    OPTIMIZER_GROUP,
    ContentStore,
    StoreError,
    TensorSink,
    atomic_write,
    delta_group,
    delta_group_step,
    sweep_temps,
)
from protocol.chunks import verify_manifest
from protocol.codecs import CodecError, iter_decode
from protocol.config import Codec, Overlap, RunConfig
from protocol.messages import (
    EnvFingerprint,
    MsgReportUnavailable,
    MsgRevealContribution,
    MsgSubmitOuterResult,
    Role,
)
from replay.checkpoint import node_initial_global
from replay.data import Corpus, eval_loss, node_corpus
from replay.spec import DEFAULT_ALLOW_LIST, Factory, Holder, build, check_fits
from replay.step import (
    DeviceError,
    make_optimizer,
    optimizer_state,
    pin_device,
    training_state,
)
from trainer.behaviour import AcceptedDelta, HostBehaviour, OuterContext, resolve
from trainer.commit import Contribution, load_params, openings
from trainer.ddp import Team
from trainer.metrics import HostMetrics
from trainer.node_config import HostConfig
from trainer.recompute import materialize_openings

__all__ = ["VAL_BATCHES", "HostNode", "NodeError", "Record"]

VAL_BATCHES = 4


DELTA_FETCHES = 4
"""Accepted Δs fetched at once while aggregating (each from all of its holders at once)."""


@dataclass
class _Result:
    """What this host knows of one step's result rounds: the set it last computed G_{n+1} over,
    that model, and the Δs it could not fetch (or that do not decode) for the current set."""

    hosts: tuple[str, ...] | None = None
    model: GlobalModel | None = None
    missing: list[str] = field(default_factory=list)
    unusable: set[str] = field(default_factory=set)
    val_loss_ppm: int = 0  # our validation loss of `model`, sent with the vote (specs §2.7)


class _BadDelta(Exception):
    def __init__(self, host: str, error: Exception) -> None:
        super().__init__(host)
        self.host, self.error = host, error


def start_key(s: StartState) -> list[str | None]:
    return [s.base_model_hash, s.parent_delta_hash, s.optimizer_hash]


@dataclass
class Record:
    """What the node committed in one outer step, on disk before the commit is broadcast (the Δ
    payload itself is in the content store under its hash)."""

    outer_step: int
    base_model_hash: str
    leaves: list[str]
    trajectory_root: str
    delta_hash: str
    codec: str
    final_optimizer_hash: str
    tokens: int
    env: dict[str, Any]
    mean_loss: float
    start: list[str | None] | None = None
    """The start it trained from (base, eager parent Δ, optimizer; `StartState`): a step trained
    before it opened is committed only if the chain names the same start when it opens."""

    @classmethod
    def of(cls, c: Contribution, start: StartState | None = None) -> Record:
        return cls(
            c.outer_step,
            c.base_model_hash,
            list(c.leaves),
            c.trajectory_root,
            c.delta_hash,
            c.codec.value,
            c.final_optimizer_hash,
            c.tokens,
            c.env.model_dump(),
            c.mean_loss,
            start_key(start) if start is not None else None,
        )

    def contribution(self, payload: bytes) -> Contribution:
        return Contribution(
            outer_step=self.outer_step,
            base_model_hash=self.base_model_hash,
            leaves=self.leaves,
            trajectory_root=self.trajectory_root,
            delta={},
            payload=payload,
            delta_hash=self.delta_hash,
            codec=Codec(self.codec),
            final_optimizer_hash=self.final_optimizer_hash,
            tokens=self.tokens,
            env=EnvFingerprint(**self.env),
            mean_loss=self.mean_loss,
            losses=[],
        )


class HostNode:
    """One host. `run()` blocks until the run finishes, `max_outer_steps` are done, or `stop()`."""

    reach: Reach = Reach()
    """How `run()` waits for the chain and the run at start-up (`nodekit.reach`; the CLI sets it)."""

    def __init__(
        self,
        config: HostConfig,
        chain: ChainClient,
        *,
        behaviour: HostBehaviour | None = None,
        corpus: Corpus | None = None,
        allow_list: Mapping[str, Factory] = DEFAULT_ALLOW_LIST,
        log: Callable[[dict[str, Any]], None] = json_line,
        poll_timeout: float = 10.0,
        blob_timeout: float = 30.0,
        blob_retries: int = 3,
        blob_backoff: float = 0.5,
        team: Team | None = None,
    ) -> None:
        self.config = config
        self.chain = chain
        self.team = team
        self.behaviour = behaviour or resolve(config.behaviour, config.behaviour_params)
        self.wallet = config.wallet()
        self.address = str(self.wallet.address())
        self.name = config.data_path.name or "host"
        self._corpus = corpus
        self._allow_list = allow_list
        self._log = log
        self.view = ChainView(chain, config.run_id, poll_timeout=poll_timeout)
        self.dir = config.data_path
        self.dir.mkdir(parents=True, exist_ok=True)
        self._swept(sweep_temps(self.dir) + sweep_temps(self.dir / "commits"))  # before node.json is read
        self.state = self._load_state()
        self.board = Board(
            node=self.name, role="host", address=self.address, run_id=config.run_id, outer_step=None,
            phase="STARTING", loss=None, val_loss=dict(self.state.get("val_loss", {})),
            commits=self.state.get("commits", 0), accepted=self.state.get("accepted", 0),
            rejected=self.state.get("rejected", 0),
        )  # fmt: skip
        self.metrics = HostMetrics(self.board.registry)
        self.catalog = BlobCatalog()
        policy = TransferPolicy(min_bytes_per_s=config.min_transfer_bps, base_s=blob_timeout)
        self.blobs = BlobClient(
            [], blob_timeout, blob_retries, backoff=blob_backoff, on_bytes=self.metrics.bytes_received.inc,
            policy=policy,
        )  # fmt: skip
        self._gm_cache: dict[str, GlobalModel] = {}
        self._opts: dict[int, torch.optim.Optimizer] = {}  # per outer step, until its reveal
        self._served_deltas: dict[str, int] = {}  # Δ hash -> outer step: our own and those we fetched
        self._published_states: dict[int, set[str]] = {}
        # Overlapped runs: one step's tail (reveal → aggregate) runs beside the next step's training.
        self._lock = threading.RLock()  # node.json, counters, the optimizer states on disk, pruning
        self._replica_lock = threading.Lock()  # the second model: recomputed openings, evaluation
        self._replica: nn.Module | None = None
        self._tails: dict[int, threading.Thread] = {}
        self.overlapped = False  # the eager schedule, the only overlapped one
        self.server = self._bind_server()

    @property
    def status(self) -> dict[str, Any]:
        return self.board.status

    # ---------------------------------------------------------------- disk state

    def _load_state(self) -> dict[str, Any]:
        path = self.dir / "node.json"
        if not path.exists():
            return {"address": self.address, "run_id": self.config.run_id}
        try:
            state = json.loads(path.read_bytes())
        except (OSError, ValueError) as e:
            raise NodeError(f"{path} is unreadable ({e}); move it away to start over") from e
        if state.get("address") != self.address or state.get("run_id") != self.config.run_id:
            raise NodeError(f"{self.dir} belongs to {state.get('address')} in run {state.get('run_id')}")
        return state

    def _swept(self, gone: list[Path]) -> None:
        """Log what a start-up sweep removed (temp and part files a killed process left)."""
        if gone:
            self.log("swept", removed=len(gone), files=[p.name for p in gone[:8]])

    def _save_state(self) -> None:
        with self._lock:
            text = json.dumps(self.state, sort_keys=True, indent=1).encode()
            atomic_write(self.dir / "node.json", text)

    def _record_path(self, n: int) -> Path:
        return self.dir / "commits" / f"{n}.json"

    def _save_record(self, c: Contribution, start: StartState | None = None) -> None:
        self.content.put_bytes(Kind.DELTA, c.payload, delta_group(c.outer_step))
        atomic_write(self._record_path(c.outer_step), json.dumps(asdict(Record.of(c, start))).encode())

    def _load_record(self, n: int, start: StartState | None = None) -> Contribution | None:
        """What this node trained for step n, if anything; with `start`, only if trained from it."""
        try:
            record = Record(**json.loads(self._record_path(n).read_bytes()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:
            self.log("record_unreadable", outer_step=n, error=str(e))
            return None
        if start is not None and record.start is not None and record.start != start_key(start):
            self.log("trained_from_another_start", outer_step=n, trained=record.start, chain=start_key(start))
            return None
        try:  # verified chunk by chunk against the committed Δ hash on the way in
            payload = self.content.read_bytes(Kind.DELTA, record.delta_hash, delta_group(n))
        except (StoreError, ValueError, OSError) as e:
            self.log("record_unreadable", outer_step=n, error=f"payload: {e}")
            self.content.delete(Kind.DELTA, record.delta_hash, delta_group(n))
            return None
        return record.contribution(payload)

    # ---------------------------------------------------------------- server, logs, status

    def _bind_server(self) -> ServerThread:
        """Port 0 picks a free port once and keeps it across restarts: the endpoint is on chain."""
        host, port = parse_listen(self.config.listen)
        if port == 0 and self.state.get("port"):
            try:
                return self._make_server(f"{host}:{self.state['port']}")
            except OSError:
                self.log("port_taken", port=self.state["port"])
        server = self._make_server(f"{host}:{port}")
        self.state["port"] = server.port
        self._save_state()
        return server

    def _make_server(self, listen: str) -> ServerThread:
        def sent(kind: str, n: int) -> None:
            self.metrics.bytes_sent.labels(kind).inc(n)

        # an honest host streams from disk; a behaviour that tampers with what it serves sees whole objects
        tampers = type(self.behaviour).serve_blob is not HostBehaviour.serve_blob
        paces = type(self.behaviour).serve_bytes_per_s is not HostBehaviour.serve_bytes_per_s
        app = build_app(
            self.catalog,
            self.snapshot,
            self.board.registry,
            serve_filter=self.behaviour.serve_blob if tampers else None,
            serve_rate=self.behaviour.serve_bytes_per_s if paces else None,
            on_sent=sent,
        )
        return ServerThread(app, listen)

    @property
    def url(self) -> str:
        return self.config.public_url or self.server.url

    def snapshot(self) -> dict[str, Any]:
        return self.board.snapshot()

    def _set(self, **fields: Any) -> None:
        self.board.set(**fields)
        if "phase" in fields:
            self.metrics.phase.state(fields["phase"])
        if fields.get("outer_step") is not None:
            self.metrics.outer_step.set(fields["outer_step"])

    def log(self, event: str, **fields: Any) -> None:
        self._log({"ts": round(time.time(), 3), "node": self.name, "event": event, **fields})

    def stop(self) -> None:
        self.view.stop.set()

    def _broadcast(self, msgs: list[Any]) -> None:
        self.chain.broadcast(self.wallet, msgs)

    # ---------------------------------------------------------------- start-up

    def _setup(self) -> None:
        run = self.view.run()
        self.cfg = RunConfig.model_validate(run.config)
        if self.cfg.threads != self.config.threads:
            raise NodeError(
                f"host.toml threads={self.config.threads}, the run replays with {self.cfg.threads}"
            )
        try:
            device = pin_device(self.cfg.threads, self.config.device)
        except DeviceError as e:
            raise NodeError(str(e)) from e
        check_fits(self.cfg, device, Holder.HOST, allow_list=self._allow_list)  # before any allocation
        built = build(self.cfg.model, self._allow_list)
        self.model: nn.Module = built.module.to(device)
        self.device = device
        self.overlapped = self.cfg.overlap is Overlap.EAGER
        self.loss_fn = built.loss_fn
        self.corpus = (
            self._corpus
            if self._corpus is not None
            else node_corpus(self.cfg, self.config.dataset_source, self.dir, self.address)
        )
        if self.corpus.manifest_hash != self.cfg.dataset_manifest_hash:
            raise NodeError(
                f"local dataset {self.corpus.manifest_hash[:12]} is not the run's "
                f"{self.cfg.dataset_manifest_hash[:12]}"
            )
        c = self.cfg.state_chunk_bytes
        self.objects = ObjectPolicy.of(self.model, self.cfg)
        self.content = ContentStore(self.dir / "store", c)
        self._swept(self.content.sweep())  # what a kill left half-written, before anything writes
        self.store = StateStore(
            self.dir / "store", chunk_bytes=c, checkpoint_every=self.config.checkpoint_every
        )
        self.globals = GlobalStore(
            self.content, {n: tuple(p.shape) for n, p in self.model.named_parameters()}
        )
        self.catalog.chunk_bytes = c
        g0 = node_initial_global(
            self.cfg.initial_model_hash, self.model, self.config.init_checkpoint_source, c
        )
        if g0.hash == self.cfg.initial_model_hash:
            self.globals.save(g0)
        for h in self.globals.hashes():
            self.catalog.publish(Kind.MODEL, h, StoredObject(self.content, Kind.MODEL, h))
        self._publish_optimizer()

    def _join(self) -> None:
        me = join_run(self.chain, self.wallet, self.config.run_id, Role.HOST, self.url, self.config.stake)
        if me is None:
            self.log("joined", run_id=self.config.run_id, stake=self.config.stake, endpoint=self.url)
        elif me["endpoint"] != self.url:
            self.log("endpoint_changed", on_chain=me["endpoint"], now=self.url)

    def _peers(self) -> list[str]:
        """Everyone who may hold a run object: the other hosts, then the verifiers."""
        hosts = self.view.endpoints(Role.HOST, exclude=self.address)
        return hosts + self.view.endpoints(Role.VERIFIER)

    # ---------------------------------------------------------------- the loop

    def run(self, max_outer_steps: int | None = None, *, linger: bool = False) -> None:
        """With `linger`, keep serving (the final G, the last Δs) after the run ends, until `stop()`:
        late peers and verifiers still fetch from us, and we keep following blocks meanwhile."""
        tune_allocator()  # freed tensors go back to the OS: peak RSS is the peak, not the sum of phases
        self.server.start()
        self._log({"event": "listening", "url": self.server.url, "node": self.name})
        done = 0
        try:
            reach(self.chain, self.config.run_id, self.reach, log=self.log, stop=self.view.stop)
            self._setup()
            self._join()
            while max_outer_steps is None or done < max_outer_steps:
                run = self.view.run()
                if not run.active:
                    self.log("run_finished", outer_step=run.current_step)
                    break
                if self.overlapped:
                    done += self._overlapped_step(run)
                    continue
                try:
                    self.outer_step(run.current_step)
                except (BlobError, ValueError, OSError) as e:  # peers down, a bad G on offer, disk trouble
                    self._failed(run.current_step, e)
                done += 1
            for tail in list(self._tails.values()):
                tail.join()
            self._set(phase="DONE")
            if self.team is not None:
                self.team.close()  # no more training: the other ranks exit
            if linger:
                self.log("lingering", url=self.url)
                self.view.wait_height(sys.maxsize)
        except Stopped:
            self.log("stopped")
        finally:
            self.view.stop.set()  # tails still running leave at their next wait (a tx being
            for tail in list(self._tails.values()):  # confirmed may hold one a while: not waited for)
                tail.join(timeout=2 * self.view.poll_timeout)
            self.server.stop()
            self.blobs.close()

    def _failed(self, n: int, e: Exception) -> None:
        """Peers down, a bad G on offer, disk trouble: log, and wait for the step to close."""
        self.log("outer_step_failed", outer_step=n, error=f"{type(e).__name__}: {e}")
        self.view.wait_step(n, lambda i: i.phase is Phase.DONE)

    def outer_step(self, n: int) -> None:
        """The protocol script, resumable at every point from the chain and the disk:
        train → commit → reveal → aggregate."""
        contribution = self._train_phase(n)
        self._tail(n, contribution)

    def _train_phase(self, n: int) -> Contribution | None:
        """Train and commit, or pick the commitment back up after a restart."""
        self._set(outer_step=n, phase="WAITING")
        info = self.view.step(n)
        mine = self.view.commitment(self.address, n)
        return self._train_and_commit(n, info) if mine is None else self._recover(n, mine)

    def _tail(self, n: int, contribution: Contribution | None) -> None:
        """After the commit: reveal what was committed, then aggregate the accepted Δs."""
        if contribution is not None:
            self._reveal(n, contribution)
        self._aggregate(n, contribution)

    # ---------------------------------------------------------------- the overlapped schedule

    def _overlapped_step(self, run: Any) -> int:
        """Take the next step the chain has in flight that this node has not taken yet: train it
        (the chain opened it when the previous step's training closed) and hand its tail to a
        thread; a step committed before a restart, or whose training already closed, only gets
        its tail. Returns 1 if a step was taken; otherwise waits for the next one to open."""
        for n in run.steps_in_flight:
            if n in self._tails:
                continue
            info = self.view.step(n)
            committed = self.view.commitment(self.address, n) is not None
            if not committed and info.phase not in (Phase.PENDING, Phase.TRAIN):
                contribution = None  # its training closed before we got to it: follow its result
                self.log("sitting_out", outer_step=n, reason="training closed before we got to it")
            else:
                try:
                    contribution = self._train_phase(n)
                except (BlobError, ValueError, OSError) as e:
                    contribution = None
                    self.log("outer_step_failed", outer_step=n, error=f"{type(e).__name__}: {e}")
            self._spawn_tail(n, contribution)
            # one process only: a data-parallel team's ranks are not driven ahead (not exercised)
            if contribution is not None and self.behaviour.trains_ahead and self.team is None:
                try:
                    self._train_ahead(n + 1)
                except (BlobError, ValueError, OSError) as e:  # trained again when the step opens
                    self.log("train_ahead_failed", outer_step=n + 1, error=f"{type(e).__name__}: {e}")
            return 1
        newest = max(self._tails, default=-1)
        self.view.wait_run(lambda r: not r.active or r.current_step > newest)
        return 0

    def _spawn_tail(self, n: int, contribution: Contribution | None) -> None:
        def tail() -> None:
            try:
                self._tail(n, contribution)
            except Stopped:
                pass
            except (BlobError, ValueError, OSError, ChainTimeout) as e:  # the training loop goes on
                with contextlib.suppress(Stopped, ChainTimeout):
                    self._failed(n, e)

        self._tails[n] = self._spawn(f"{self.name}-tail-{n}", tail)
        for m in [m for m, t in self._tails.items() if m < n - 1 and not t.is_alive()]:
            del self._tails[m]  # keep the recent ones: they mark steps already taken

    def _spawn(self, name: str, fn: Callable[[], None]) -> threading.Thread:
        """Start a worker thread of this node (one place, so a test harness can count it)."""
        thread = threading.Thread(target=fn, name=name, daemon=True)
        thread.start()
        return thread

    def _replica_model(self) -> nn.Module:
        """A second copy of the model for work beside training (overlapped runs): recomputing opened
        boundaries and evaluating adopted models. Built on first use, on the training device."""
        if self._replica is None:
            self._replica = build(self.cfg.model, self._allow_list).module.to(self.device)
        return self._replica

    def _eager_start(self, n: int, gm: GlobalModel, s: StartState | None = None) -> EagerStart | None:
        """An eager run's start params of step n (specs §2.2.1), None where the start is G_{n−1}
        (not eager, or no parent: the base alone). The chain names the parent (`start_state`):
        this host's own step n − 1 Δ, decoded from exactly the bytes whose hash it committed (read
        from disk, every chunk checked; fetched by hash from step n − 1's holders if lost), on
        G_{n−1} = `gm`; the start's tensors are computed when read, never held whole."""
        if not self.overlapped:
            return None
        s = self.view.start_state(self.address, n) if s is None else s
        if s.parent_delta_hash is None:
            return None
        if s.base_model_hash != gm.hash:
            raise ValueError(f"step {n} start builds on {s.base_model_hash[:12]}, not {gm.hash[:12]}")
        m = s.parent_outer_step if s.parent_outer_step is not None else n - 1
        payload = self._parent_payload(m, s.parent_delta_hash)
        try:
            return eager_start(gm, payload, self.cfg.outer)
        except CodecError as e:  # our own committed Δ does not decode: the chain's start cannot be built
            raise NodeError(f"own step {m} Δ {s.parent_delta_hash[:12]} does not decode: {e}") from e

    def _parent_payload(self, m: int, h: str) -> bytes:
        """Our step m Δ payload by its committed hash: from disk (verified on read), else from the
        verifiers and peers that hold it (verified chunk by chunk), kept and served again."""
        if not self.content.has(Kind.DELTA, h):
            self.log("fetching_parent_delta", outer_step=m, delta=h)
            endpoints = self.view.holders(m, exclude=self.address).get(self.address, [])
            self._fetch_delta(m, Accepted(self.address, h, 1, None), endpoints)
        try:
            return self.content.read_bytes(Kind.DELTA, h)
        except (StoreError, ValueError) as e:
            self.content.delete(Kind.DELTA, h)  # corrupted on our disk: fetched again next time
            raise OSError(f"own step {m} Δ {h[:12]} unreadable: {e}") from e

    # ---------------------------------------------------------------- train and commit

    def _global(self, h: str) -> GlobalModel:
        """G by hash: memory, else own disk (verified), else peers (verified chunk by chunk)."""
        if h not in self._gm_cache:
            if not self.globals.has(h):
                self.log("fetching_global", model_hash=h)
            self._gm_cache[h] = self.globals.fetch(h, self.blobs, endpoints=self._peers())
            self.catalog.publish(Kind.MODEL, h, StoredObject(self.content, Kind.MODEL, h))
        return self._gm_cache[h]

    @property
    def _sharded(self) -> bool:
        return self.team is not None and self.team.shard_state

    def _start_optimizer(
        self, n: int, model: nn.Module | None = None, *, start: StartState | None = None
    ) -> torch.optim.Optimizer:
        """The optimizer state the chain says step n starts from: last accepted, or fresh (overlapped
        runs: the one accepted in step n − 2, §2.2.1), for `model` (default: the training model;
        its parameters are G_n's: `run_committed` or the caller loads them). With a sharded team:
        rank 0's part of it (the others load theirs when the team trains)."""
        model = self.model if model is None else model
        if model is self.model:
            self.store.flush()  # a last boundary still being written reads the live model
        prev = self.view.prev_optimizer_hash(self.address, n) if start is None else start.optimizer_hash
        if self.team is not None and self.team.shard_state:
            try:
                self.team.carry(prev or None, OPTIMIZER_GROUP)
                return self.team.shard_optimizer(self.model, self.cfg, self.content)
            except (ValueError, RuntimeError) as e:
                raise NodeError(f"own optimizer state {prev[:12]} is lost ({e}); leave and rejoin") from e
        opt = make_optimizer(model, self.cfg.inner)
        if prev:  # read from disk straight into the new optimizer's own tensors (no second copy)
            into = optimizer_state(training_state(model, opt))
            sink = TensorSink.into(into)  # a GPU model's moments: via host tensors, then copied
            try:
                self.content.load_into(Kind.OPTIMIZER, prev, sink, OPTIMIZER_GROUP)
            except ValueError as e:
                raise NodeError(f"own optimizer state {prev[:12]} is lost ({e}); leave and rejoin") from e
            with torch.no_grad():
                for k, t in into.items():
                    if sink.tensors[k] is not t:
                        t.copy_(sink.tensors[k])
            for p in model.parameters():  # every parameter carries its own step counter
                opt.state[p]["step"].copy_(into["step"])
        return opt

    def _train_and_commit(self, n: int, info: StepInfo) -> Contribution | None:
        # the phase, not a height: outer step 0 may be postponed until its participants have joined
        info = self.view.wait_step(n, lambda i: i.phase is not Phase.PENDING, info.train_start)
        if info.phase is not Phase.TRAIN or info.height > info.commit_deadline:
            return self._sit_out(n, "commit deadline passed before training")
        start = self.view.start_state(self.address, n) if self.overlapped else None
        contribution, gm = self._trained(n, info.base_model_hash, start)
        ctx = self._context(n, gm, self._opts.get(n))
        try:
            for msg in self.behaviour.commit_messages(contribution, ctx):
                self._broadcast([msg])
                self.metrics.commits.inc()
        except TxFailed as e:
            if not is_chain_error(e, ErrDuplicateCommit):
                return self._sit_out(n, f"commit refused: {e.log}")
        contribution = dataclasses.replace(
            contribution, delta={}
        )  # the payload is enough from here: 4 B/param
        self._count("commits")
        self._set(phase="COMMITTED")
        self.log("committed", outer_step=n, root=contribution.trajectory_root, delta=contribution.delta_hash)
        return contribution

    def _train_ahead(self, n: int) -> None:
        """Overlapped runs, after this host's commit of step n − 1: train step n now if the chain
        has already fixed its start (`next_start_state`), instead of idling until the slowest host
        commits and the step opens. Its record names that start; it is committed when the step
        opens only if the chain then names the same one (else trained again from the chain's)."""
        got = self.view.next_start_state(self.address)
        if got is None or got[0] != n or self._record_path(n).exists():
            return
        self._trained(n, got[1].base_model_hash, got[1], ahead=True)

    def _trained(
        self, n: int, base: str, start: StartState | None, *, ahead: bool = False
    ) -> tuple[Contribution, GlobalModel]:
        """Step n's contribution trained from `start` (the chain's `start_state`; sequential runs:
        None, the base and the last accepted optimizer): from its record if this node already
        trained it from that start (a restart, or trained ahead), else trained now."""
        gm = self._global(base)
        with self._lock:  # G_{n-1}: nobody needs it once G_n is the base (overlapped: §2.2.1 keeps more)
            for h in self.globals.prune(self._models_to_keep([gm.hash])):
                self.catalog.withdraw(Kind.MODEL, h)
                self._gm_cache.pop(h, None)
        contribution = self._load_record(n, start)
        if contribution is None or contribution.base_model_hash != gm.hash:
            self._set(outer_step=n, phase="TRAINING")
            for m in [m for m in self._opts if m < n - (1 if self.overlapped else 0)]:
                del self._opts[m]  # a step that was never revealed still held its optimizer: 8 B/param
            opt = self._opts[n] = self._start_optimizer(n, start=start)
            ctx = self._context(n, gm, opt)
            ctx.start_params = self._eager_start(n, gm, start)
            t0 = time.perf_counter()
            contribution = self.behaviour.make_contribution(ctx)
            seconds = time.perf_counter() - t0
            for p in self.model.parameters():  # no more backward passes this step: free 4 B/param
                p.grad = None
            self.metrics.trained(self.cfg.inner_steps, contribution.tokens, seconds, contribution.mean_loss)
            with self._lock:  # the tail's pruning keeps what a record on disk names
                if not self._sharded:  # a sharded team's ranks saved their parts of it as they trained
                    self._save_optimizer(contribution, opt)
                self._save_record(contribution, start)
            self.board.update("training_seconds", lambda x: round((x or 0.0) + seconds, 3))
            self._set(loss=contribution.mean_loss)
            self.log(
                "trained",
                outer_step=n,
                loss=round(contribution.mean_loss, 4),
                seconds=round(seconds, 3),
                boundary_seconds=round(contribution.boundary_seconds, 3),
                boundary_waits=contribution.boundary_waits,
                step_seconds=round(contribution.train_seconds, 3),
                protocol_seconds=round(contribution.protocol_seconds, 3),
                tokens_per_s=round(contribution.tokens / max(seconds, 1e-9)),
                ahead=ahead,
            )
        return contribution, gm

    def _save_optimizer(self, c: Contribution, opt: torch.optim.Optimizer) -> None:
        """The carried optimizer state, written from the live tensors; with the digests the
        boundary worker computed when they match the committed hash (no second hashing pass)."""
        state = optimizer_state(training_state(self.model, opt))
        length = self.objects.length(Kind.OPTIMIZER)
        digests, h = list(c.optimizer_digests), c.final_optimizer_hash
        domain, c_bytes = DOMAINS[Kind.OPTIMIZER], self.cfg.state_chunk_bytes
        if digests and verify_manifest(h, domain, c_bytes, length, digests):
            self.content.put_tensors(
                Kind.OPTIMIZER, state, OPTIMIZER_GROUP, h=c.final_optimizer_hash, digests=digests
            )
        else:
            self.content.put_tensors(Kind.OPTIMIZER, state, OPTIMIZER_GROUP)

    def _recover(self, n: int, mine: dict[str, Any]) -> Contribution | None:
        """Restarted after committing: pick the contribution back up from disk."""
        contribution = self._load_record(n)
        if contribution is None or contribution.trajectory_root != mine["trajectory_root"]:
            return self._sit_out(n, "committed on chain but the record is not on disk")
        self.log("resumed", outer_step=n, root=contribution.trajectory_root)
        self._set(phase="COMMITTED", loss=contribution.mean_loss)
        return contribution

    def _sit_out(self, n: int, why: str) -> None:
        self._set(phase="SITTING_OUT")
        self.log("sitting_out", outer_step=n, reason=why)
        return None

    def _context(self, n: int, gm: GlobalModel, opt: torch.optim.Optimizer | None) -> OuterContext:
        previous: list[AcceptedDelta] = []
        if n > 0:
            _, acc = self.view.accepted(n - 1)
            previous = [AcceptedDelta(a.host, a.delta_hash, a.tokens, a.endpoint) for a in acc]
        return OuterContext(
            cfg=self.cfg,
            run_id=self.config.run_id,
            address=self.address,
            outer_step=n,
            global_model=gm,
            model=self.model,
            optimizer=opt,
            loss_fn=self.loss_fn,
            data=self.corpus,
            store=self.store,
            blobs=self.blobs,
            chain=self.chain,
            previous_accepted=previous,
            peers=self._peers(),
            team=self.team,
        )

    def _count(self, key: str) -> None:
        with self._lock:
            self.state[key] = self.state.get(key, 0) + 1
            self._save_state()
            self._set(**{key: self.state[key]})

    # ---------------------------------------------------------------- reveal

    def _reveal(self, n: int, c: Contribution) -> None:
        info = self.view.wait_step(n, lambda i: i.challenge_seed is not None or i.phase is Phase.DONE)
        if info.challenge_seed is None:
            return
        segments = self.view.segments(self.address, n)
        if segments is None:
            return
        already = self.view.reveal(self.address, n) is not None
        ctx = self._context(n, self._global(c.base_model_hash), self._opts.get(n))
        if not already and not self.behaviour.should_reveal(c, ctx):
            self.log("not_revealing", outer_step=n)
            return
        del ctx
        self._opts.pop(n, None)  # the last hook that sees it: its moments (8 B/param) go now
        self._materialize(n, c, segments)
        # The commit deadline is past, so serving now lets nobody copy; verifiers need it at once.
        self._publish(n, c, segments)
        if not already:
            msg = MsgRevealContribution(
                creator=self.address, run_id=self.config.run_id, outer_step=n, openings=openings(c, segments)
            )
            try:
                self._broadcast([msg])
            except TxFailed as e:
                self.log("reveal_refused", outer_step=n, error=e.log)
                return
        self._set(phase="REVEALED")
        self.log("revealed", outer_step=n, segments=segments)

    def _materialize(self, n: int, c: Contribution, segments: list[int]) -> None:
        """Opened boundaries that were not persisted are recomputed from the nearest persisted one
        (sparse checkpoints, host.toml `checkpoint_every`); every other boundary goes at once."""
        gm = self._global(c.base_model_hash)
        # Overlapped runs recompute on the replica while the training model trains the next step
        # (a sharded team has no replica: it recomputes between that step's training and commit).
        beside = self.overlapped and self.team is None
        model = self._replica_model() if beside else self.model

        eager = self._eager_start(n, gm)  # the same start the step trained from
        params = gm.params if eager is None else eager

        def start() -> tuple[nn.Module, torch.optim.Optimizer]:
            opt = self._start_optimizer(n, model)
            gm.check_fits(model)
            load_params(model, params)
            return model, opt

        with self._replica_lock if beside else contextlib.nullcontext():
            self._recompute(n, c, segments, params, start)

    def _recompute(
        self,
        n: int,
        c: Contribution,
        segments: list[int],
        params: Mapping[str, Tensor],
        start: Callable[[], tuple[nn.Module, torch.optim.Optimizer]],
    ) -> None:
        try:
            if self.team is not None and self.team.shard_state:
                self.team.carry(self.view.prev_optimizer_hash(self.address, n) or None, OPTIMIZER_GROUP)
                done = self.team.materialize(
                    self.store, n, c.leaves, segments, self.model, self.cfg, self.corpus, self.address,
                    params, loss_fn=self.loss_fn,
                )  # fmt: skip
            else:
                done = materialize_openings(
                    self.store, n, c.leaves, segments, start, self.cfg, self.corpus, self.address,
                    micro_batches=c.env.micro_batches, loss_fn=self.loss_fn,
                )  # fmt: skip
        except (ValueError, OSError) as e:  # cannot reproduce an own boundary: serve what we have
            self.log("recompute_failed", outer_step=n, error=f"{type(e).__name__}: {e}")
            return
        if done:
            self.log("recomputed", outer_step=n, boundaries=done)

    def _publish(self, n: int, c: Contribution, segments: list[int]) -> None:
        group = str(n)
        for s in segments:
            for leaf in (c.leaves[s], c.leaves[s + 1]):
                if self.content.has(Kind.STATE, leaf, group):
                    self.catalog.publish(
                        Kind.STATE, leaf, StoredObject(self.content, Kind.STATE, leaf, group)
                    )
                    self._published_states.setdefault(n, set()).add(leaf)
        if self.content.has(Kind.DELTA, c.delta_hash, delta_group(n)):
            obj = StoredObject(self.content, Kind.DELTA, c.delta_hash, delta_group(n))
            self.catalog.publish(Kind.DELTA, c.delta_hash, obj)
        else:  # a payload that does not hash to what was committed (an adversary's): as it is
            self.catalog.publish(Kind.DELTA, c.delta_hash, lambda: c.payload)
        self._served_deltas[c.delta_hash] = n

    def _start_optimizers(self) -> set[str]:
        """The optimizer states the chain names as this host's start states: of the current step
        (overlapped runs: of every step in flight, and of the next one)."""
        if not self.overlapped:
            return {h for h in [self.view.prev_optimizer_hash(self.address)] if h}
        run = self.view.run()
        steps = {*run.steps_in_flight, run.current_step + 1}
        return {h for n in steps if (h := self.view.prev_optimizer_hash(self.address, n))}

    def _publish_optimizer(self) -> None:
        """Serve the optimizer state the chain names as this host's start state: verifiers rebuild
        segment 0 from it and G_n instead of downloading a whole training state."""
        named = self._start_optimizers()
        for h in self.content.hashes(Kind.OPTIMIZER, OPTIMIZER_GROUP):
            if h in named:
                obj = StoredObject(self.content, Kind.OPTIMIZER, h, OPTIMIZER_GROUP)
                self.catalog.publish(Kind.OPTIMIZER, h, obj)
            else:
                self.catalog.withdraw(Kind.OPTIMIZER, h)

    # ---------------------------------------------------------------- aggregate

    def _aggregate(self, n: int, mine: Contribution | None) -> None:
        """Follow step n's result rounds to its end. In every round whose accepted set holds this
        host: fetch each Δ of the set from every holder, compute G_{n+1} over it and vote; what
        cannot be fetched by the middle of the round (retried every block) is reported
        unavailable, and a later vote withdraws the report. Then adopt what the chain adopted: the
        majority's G_{n+1}, or G_n when the step closed unchanged."""
        # overlapped runs: the Δs apply to the previous step's result, known once that is adopted.
        # Polled every block, not from the verify deadline read earlier: with early close (§2.3.1)
        # the deadlines move up after they were read, and the step may finalize long before.
        info = self.view.wait_step(
            n, lambda i: i.finalized_height is not None and i.apply_to_hash is not None
        )
        if not self.overlapped:
            self._set(phase="AGGREGATING")
        outcome = info.outcomes.get(self.address)
        ok = outcome in (Outcome.ACCEPTED, Outcome.WITHHELD)  # verified; dropped later or not
        if mine is not None:
            self._count("accepted" if ok else "rejected")
            (self.metrics.accepted if ok else self.metrics.rejected).inc()
            self.log("outcome", outer_step=n, outcome=outcome)
        try:  # G_n: the step's base, or in an overlapped run the previous step's result (§2.2.1)
            gm = self._global(info.apply_to_hash or info.base_model_hash)
        except (BlobError, ValueError, OSError) as e:  # G_n itself unavailable: take the chain's G_{n+1}
            self.log("outer_step_unavailable", outer_step=n, error=f"{type(e).__name__}: {e}")
            gm = None
        ctx = self._context(n, gm, None) if gm is not None else None
        if ctx is not None:
            self.behaviour.finalized(mine, ok, ctx)
        result = _Result()
        sent: set[tuple[str, int]] = set()  # (vote | report, round) already broadcast by this process
        while info.phase is Phase.AWAITING_RESULT and gm is not None and ctx is not None:
            rr = self.view.result_round(n)
            if rr.result_round == info.result_round and self.address in rr.hosts:
                self._result_round(n, gm, rr, info, result, ctx, sent)
            info = self.view.wait_step(n, lambda i: True, info.height + 1)
        done = self.view.wait_step(n, lambda i: i.phase is Phase.DONE)
        self._follow_result(n, done, gm, result)
        self._prune(n)

    def _result_round(
        self, n: int, gm: GlobalModel, rr: ResultRound, info: StepInfo, result: _Result,
        ctx: OuterContext, sent: set[tuple[str, int]],
    ) -> None:  # fmt: skip
        """One block of one result round (called again every block until the step is done)."""
        key = tuple(rr.hosts)
        if result.hosts != key:
            fetched = self._fetch_deltas(n, rr.accepted)
            result.missing = sorted({*fetched, *(result.unusable & set(key))})
            if not result.missing:
                new = self._compute(n, gm, rr.accepted, result.unusable)
                if new is not None:
                    self._keep_candidate(result, key, new)
                    self.log("outer_step_computed", outer_step=n, round=rr.result_round, model_hash=new.hash)
        if self.address in info.result_votes or ("vote", rr.result_round) in sent:
            return
        computed = result.model.hash if result.model is not None and result.hosts == key else None
        vote = self.behaviour.result_vote(computed, ctx)
        if vote is not None:
            sent.add(("vote", rr.result_round))
            loss = result.val_loss_ppm if vote == computed else 0
            msg = MsgSubmitOuterResult(
                creator=self.address, run_id=self.config.run_id, outer_step=n, model_hash=vote,
                val_loss_ppm=self.behaviour.result_loss(loss, ctx),
            )
            self._send(n, "result", msg, round=rr.result_round, model_hash=vote)
            return
        blocks = self.cfg.phases.result_blocks
        deadline = rr.result_deadline if rr.result_deadline is not None else info.height
        report_from = deadline - blocks + blocks // 2  # half the round is grace for a holder's outage
        if not result.missing or info.height < report_from or self.address in info.unavailable:
            return
        if ("report", rr.result_round) in sent:
            return
        hosts = self.behaviour.report_unavailable(result.missing, ctx)
        if hosts:
            sent.add(("report", rr.result_round))
            msg = MsgReportUnavailable(
                creator=self.address, run_id=self.config.run_id, outer_step=n, hosts=hosts
            )
            self._send(n, "report_unavailable", msg, round=rr.result_round, hosts=hosts)

    def _send(self, n: int, what: str, msg: Any, **fields: Any) -> None:
        try:
            self._broadcast([msg])
        except TxFailed as e:
            self.log(f"{what}_refused", outer_step=n, error=e.log)
            return
        self.log(what, outer_step=n, **fields)

    def _fetch_deltas(self, n: int, accepted: list[Accepted]) -> list[str]:
        """Every accepted Δ not yet on disk, fetched from its author, the verifiers that checked it
        and every other participant (a few Δs at once, each from all its holders; every chunk
        checked); returns the hosts whose Δ nobody served, after the fetcher's retries."""
        todo = [a for a in accepted if not self.content.has(Kind.DELTA, a.delta_hash)]
        if not todo:
            return []
        holders = self.view.holders(n, exclude=self.address)

        def one(a: Accepted) -> str | None:
            try:
                self._fetch_delta(n, a, holders.get(a.host, []))
            except BlobError as e:
                self.log("delta_unavailable", outer_step=n, host=a.host, error=f"{type(e).__name__}: {e}")
                return a.host
            return None

        with ThreadPoolExecutor(
            min(DELTA_FETCHES, len(todo)), thread_name_prefix=f"{self.name}-fetch"
        ) as pool:
            return sorted(h for h in pool.map(one, todo) if h is not None)

    def _fetch_delta(self, n: int, a: Accepted, holders: list[str]) -> None:
        group = delta_group(n)
        if not self.content.has(Kind.DELTA, a.delta_hash):
            endpoints = [e for e in [a.endpoint, *holders] if e and e != self.url]
            ref = self.objects.ref(Kind.DELTA, a.delta_hash)
            report = fetch_to_store(self.blobs, self.content, ref, group, endpoints)
            if report is not None:
                self.log("fetched", outer_step=n, host=a.host, **self.board.fetched(report))
        if a.delta_hash not in self._served_deltas and self.content.has(Kind.DELTA, a.delta_hash, group):
            obj = StoredObject(self.content, Kind.DELTA, a.delta_hash, group)
            self.catalog.publish(Kind.DELTA, a.delta_hash, obj)  # a peer serves what it fetched
            self._served_deltas[a.delta_hash] = n

    def _compute(
        self, n: int, gm: GlobalModel, accepted: list[Accepted], unusable: set[str] | None = None
    ) -> GlobalModel | None:
        """G_{n+1} from the given accepted Δs (all on disk), one Δ at a time in sorted host order,
        each decoded tensor by tensor; None (the host added to `unusable`) if one does not decode."""
        by_host = {a.host: a for a in accepted}

        def delta_of(host: str) -> Iterator[tuple[str, Tensor]]:
            try:
                yield from iter_decode(
                    self.content.read_bytes(Kind.DELTA, by_host[host].delta_hash), gm.layout
                )
            except (CodecError, StoreError) as e:
                raise _BadDelta(host, e) from e

        try:
            return gm.apply_streamed({a.host: a.tokens for a in accepted}, delta_of, self.cfg.outer)
        except _BadDelta as e:
            self.log(
                "delta_unusable", outer_step=n, host=e.host, error=f"{type(e.error).__name__}: {e.error}"
            )
            if isinstance(e.error, StoreError):  # corrupted on our disk: fetch it again
                self.content.delete(Kind.DELTA, by_host[e.host].delta_hash)
            elif unusable is not None:  # it hashes right and still does not decode: nobody can use it
                unusable.add(e.host)
            return None

    def _keep_candidate(self, result: _Result, hosts: tuple[str, ...], new: GlobalModel) -> None:
        """Our G_{n+1} over a round's set: on disk and served at once (a peer that could not compute
        it fetches it by hash once it is adopted); the previous round's candidate leaves memory."""
        if result.model is not None and result.model.hash != new.hash:
            self._gm_cache.pop(result.model.hash, None)
        result.hosts, result.model = hosts, new
        self.globals.save(new)
        self._gm_cache[new.hash] = new
        self.catalog.publish(Kind.MODEL, new.hash, StoredObject(self.content, Kind.MODEL, new.hash))
        result.val_loss_ppm = self._candidate_loss_ppm(new)

    def _candidate_loss_ppm(self, gm: GlobalModel) -> int:
        """The validation loss of a candidate G_{n+1}, as the vote carries it (10⁻⁶ nats, 0 if not
        finite): what a report reads after the nodes exited. Evaluated like `_adopt` does (the
        replica in an overlapped run); `_adopt` reuses it for the model the chain adopts."""
        beside = self.overlapped
        with self._replica_lock if beside else contextlib.nullcontext():
            model = self._replica_model() if beside else self.model
            gm.load_into(model)
            loss = eval_loss(
                model, self.corpus.val, VAL_BATCHES, self.cfg.seed,
                batch_size=self.cfg.batch_size, seq_len=self.cfg.seq_len, loss_fn=self.loss_fn,
            )  # fmt: skip
        self._candidate_losses = {gm.hash: loss}
        return round(loss * 1e6) if math.isfinite(loss) and 0 < loss < 1e9 else 0

    def _follow_result(self, n: int, done: StepInfo, gm: GlobalModel | None, result: _Result) -> None:
        """Adopt what the chain adopted: our own G_{n+1} if it is the one, G_n if the step closed
        unchanged, else computed over the final set or fetched by its hash from the holders."""
        target = done.result_hash or done.apply_to_hash or done.base_model_hash
        voted = done.result_votes.get(self.address)
        if voted is not None and voted != target:
            self.log("result_differs", outer_step=n, chain=target, mine=voted)
        if result.model is not None and result.model.hash == target:
            new = result.model
        elif gm is not None and target == gm.hash:
            new = gm  # no majority in any round: G_{n+1} = G_n
            self.log("outer_step_unchanged", outer_step=n, model_hash=target, dropped=done.dropped)
        else:
            new = None
            if gm is not None:
                rr = self.view.result_round(n)
                if not self._fetch_deltas(n, rr.accepted):
                    new = self._compute(n, gm, rr.accepted)
            if new is None or new.hash != target:
                new = self._global(target)
        self._adopt(n, new)

    def _adopt(self, n: int, gm: GlobalModel) -> None:
        self.globals.save(gm)
        beside = self.overlapped  # the training model is busy with the next step: evaluate on the replica
        with self._replica_lock if beside else contextlib.nullcontext():
            model = self._replica_model() if beside else self.model
            gm.load_into(model)
            if not gm.stored:  # from here on read from disk when used: G_{n+1}'s 8 B/param go now
                gm = self.globals.load(gm.hash)
                release()
            self._gm_cache[gm.hash] = gm
            self.catalog.publish(Kind.MODEL, gm.hash, StoredObject(self.content, Kind.MODEL, gm.hash))
            known = getattr(self, "_candidate_losses", {}).get(gm.hash)  # evaluated for the vote
            loss = known if known is not None else eval_loss(
                model,
                self.corpus.val,
                VAL_BATCHES,
                self.cfg.seed,
                batch_size=self.cfg.batch_size,
                seq_len=self.cfg.seq_len,
                loss_fn=self.loss_fn,
            )
        with self._lock:
            self.state.setdefault("val_loss", {})[str(n)] = loss
            self._save_state()
        self.metrics.val_loss.set(loss)
        self.board.set(val_loss=dict(self.state["val_loss"]))
        self.log("outer_step_applied", outer_step=n, model_hash=gm.hash, val_loss=round(loss, 4))

    def _models_to_keep(self, keep: list[str]) -> list[str]:
        """Overlapped runs also keep the bases of the steps in flight and the latest G (the next
        step's Δs apply to it); sequential runs keep just `keep`."""
        if not self.overlapped:
            return keep
        run = self.view.run()
        bases = [self.view.step(m).base_model_hash for m in run.steps_in_flight]
        return [*keep, run.global_model_hash, *bases]

    def _prune(self, n: int) -> None:
        """Finalized states go; Δs stay one step longer (late peers, copycats download them like
        anyone); only the optimizer state the chain chains on and the last two models stay
        (overlapped runs: what the steps still in flight need as well)."""
        with self._lock:
            self._prune_locked(n)

    def _prune_locked(self, n: int) -> None:
        if self.overlapped:  # the next step's openings are being served to its verifiers
            for m in [m for m in self._published_states if m <= n]:
                for h in self._published_states.pop(m):
                    self.catalog.withdraw(Kind.STATE, h)
        else:
            for _, h in self.catalog.served(Kind.STATE):
                self.catalog.withdraw(Kind.STATE, h)
        self.store.prune(n + 1)
        for h, m in list(self._served_deltas.items()):
            if m < n:
                self.catalog.withdraw(Kind.DELTA, h)
                del self._served_deltas[h]
        for group in self.content.groups():
            m = delta_group_step(group)
            if m is not None and m < n:
                self.content.drop_group(group)
                self._record_path(m).unlink(missing_ok=True)
        keep = self._start_optimizers() | self._own_pending_optimizers(n)
        for h in self.content.hashes(Kind.OPTIMIZER, OPTIMIZER_GROUP):
            if h not in keep:
                self.content.delete(Kind.OPTIMIZER, h, OPTIMIZER_GROUP)
        self._publish_optimizer()
        base = self.view.step(n).base_model_hash
        current = self.view.run().global_model_hash
        for h in self.globals.prune(self._models_to_keep([base, current])):
            self.catalog.withdraw(Kind.MODEL, h)
            self._gm_cache.pop(h, None)

    def _own_pending_optimizers(self, n: int) -> set[str]:
        """Overlapped runs: the final optimizer states of this host's later steps (records on disk),
        not yet finalized (the step after the newest too: it may have been trained ahead): each
        becomes a start state two steps on if it is accepted."""
        if not self.overlapped:
            return set()
        out = set()
        for m in range(n + 1, self.view.run().current_step + 2):
            try:  # the record alone (not its Δ payload): it names the optimizer state
                out.add(json.loads(self._record_path(m).read_bytes())["final_optimizer_hash"])
            except (OSError, ValueError, KeyError):
                continue
        return out
