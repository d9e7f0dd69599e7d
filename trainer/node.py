"""The host node: follow the chain's phases and train, commit, reveal, aggregate, report, repeat.

The chain is the source of truth for *where* the run is; the node's own disk (`data_dir`) is the
source of truth for *what it did*. Every step is idempotent against both, so a node killed at
any point and restarted on the same `data_dir` re-derives where it stands: it never commits a
second, different contribution for one outer step, reveals what it committed, and sits out an
outer step whose deadline it missed. Only Δs the chain finalized as accepted reach the model.

The node is its protocol script (`outer_step`: train → commit → reveal → aggregate), each phase
its own module (`trainer.train`, `trainer.reveal`, `trainer.aggregate`; what stays on disk across
steps is `trainer.retention`'s). In a run with the overlapped schedule (specs §2.2.1) the same
script runs with its tail (reveal → aggregate) on a thread of its own, so the node trains step
n+1, as soon as the chain opens it, while step n is revealed, verified and aggregated. The parts
it is built from are `nodekit`'s (runtime, chain view, holdings, global models, server, board),
shared with the verifier. Under torchrun this is rank 0, the only rank that talks to the chain, serves and
writes `data_dir`; its `team` (`trainer.ddp.Team`) makes the other ranks train each batch with it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from chain.client import ChainClient, ChainTimeout
from nodekit.blobs import BlobCatalog, BlobError, ServerThread, build_app, parse_listen
from nodekit.board import NodePhase
from nodekit.chainview import Phase, Stopped
from nodekit.coding import StateCoder
from nodekit.errorfeedback import sparse_codec
from nodekit.globalmodel import GlobalModel
from nodekit.holdings import Holdings
from nodekit.memory import tune_allocator
from nodekit.nextmodel import GlobalModels
from nodekit.node import NodeError, join_run, json_line
from nodekit.objects import Kind, ObjectPolicy
from nodekit.reach import Reach, reach
from nodekit.runtime import NodeRuntime, Patience
from nodekit.statestore import StateStore
from nodekit.store import ContentStore, atomic_write, sweep_temps
from protocol.config import Codec, Overlap, RunConfig
from protocol.messages import Role
from replay.checkpoint import node_initial_global
from replay.data import Corpus, node_corpus
from replay.spec import DEFAULT_ALLOW_LIST, Factory, Holder, build, check_fits
from replay.step import DeviceError, pin_device
from trainer.aggregate import VAL_BATCHES, AggregatePhase
from trainer.behaviour import AcceptedDelta, HostBehaviour, OuterContext
from trainer.commit import TrainedStep
from trainer.ddp import Team
from trainer.metrics import HostMetrics
from trainer.node_config import HostConfig, checkpoint_every_for
from trainer.records import Record, Records
from trainer.retention import Retention
from trainer.reveal import RevealPhase
from trainer.train import TrainPhase

__all__ = ["VAL_BATCHES", "HostNode", "NodeError", "Record"]


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
        patience: Patience = Patience(),
        team: Team | None = None,
    ) -> None:
        self.config = config
        self.chain = chain
        self.team = team
        if behaviour is None:  # adversaries live above trainer/: the CLI resolves them and passes one in
            if config.behaviour != HostBehaviour.name or config.behaviour_params:
                raise NodeError(f"behaviour {config.behaviour!r} must be resolved by the caller")
            behaviour = HostBehaviour()
        self.behaviour = behaviour
        self._corpus = corpus
        self._allow_list = allow_list
        wallet = config.wallet()
        self.dir = config.data_path
        self.dir.mkdir(parents=True, exist_ok=True)
        self.address = str(wallet.address())
        gone = sweep_temps(self.dir) + sweep_temps(self.dir / "commits")  # before node.json is read
        self.state = self._load_state()  # node.json: who this folder belongs to, its port, its counters
        self.rt = rt = NodeRuntime(
            role="host", config=config, chain=chain, log=log, patience=patience, data_dir=self.dir,
            wallet=wallet, loss=None, val_loss=dict(self.state.get("val_loss", {})),
            commits=self.state.get("commits", 0), accepted=self.state.get("accepted", 0),
            rejected=self.state.get("rejected", 0),
        )  # fmt: skip
        self.name, self.view, self.log, self.snapshot, self.stop = (
            rt.name,
            rt.view,
            rt.log,
            rt.board.snapshot,
            rt.stop,
        )
        self.metrics = HostMetrics(rt.board.registry)
        rt.on_bytes = self.metrics.bytes_received.inc
        rt.on_set = self._gauges
        rt.swept(gone)
        self.catalog = BlobCatalog()
        self.train, self.reveal, self.aggregate = TrainPhase(self), RevealPhase(self), AggregatePhase(self)
        self.retention = Retention(self)
        self.opts: dict[int, torch.optim.Optimizer] = {}  # per outer step, until its reveal
        # Overlapped runs: one step's tail (reveal → aggregate) runs beside the next step's training.
        self.lock = threading.RLock()  # node.json, counters, the optimizer states on disk, pruning
        self.replica_lock = threading.Lock()  # the second model: recomputed openings, evaluation
        self._replica: nn.Module | None = None
        self._tails: dict[int, threading.Thread] = {}
        self.overlapped = False  # the eager schedule, the only overlapped one
        rt.server = self.server = self._bind_server()

    @property
    def status(self) -> dict[str, Any]:
        return self.rt.board.status

    @property
    def url(self) -> str:
        return self.rt.url

    def _gauges(self, fields: dict[str, Any]) -> None:
        if "phase" in fields:
            self.metrics.phase.state(fields["phase"])
        if fields.get("outer_step") is not None:
            self.metrics.outer_step.set(fields["outer_step"])

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

    def save_state(self) -> None:
        with self.lock:
            text = json.dumps(self.state, sort_keys=True, indent=1).encode()
            atomic_write(self.dir / "node.json", text)

    # ---------------------------------------------------------------- server

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
        self.save_state()
        return server

    def _make_server(self, listen: str) -> ServerThread:
        def sent(kind: str, n: int) -> None:
            self.metrics.bytes_sent.labels(kind).inc(n)
            self.rt.sent(kind, n)

        # an honest host streams from disk; a behaviour that tampers with what it serves sees whole objects
        tampers = type(self.behaviour).serve_blob is not HostBehaviour.serve_blob
        paces = type(self.behaviour).serve_bytes_per_s is not HostBehaviour.serve_bytes_per_s
        app = build_app(
            self.catalog,
            self.snapshot,
            self.rt.board.registry,
            serve_filter=self.behaviour.serve_blob if tampers else None,
            serve_rate=self.behaviour.serve_bytes_per_s if paces else None,
            on_sent=sent,
        )
        return ServerThread(app, listen)

    # ---------------------------------------------------------------- start-up

    def _setup(self) -> None:
        run = self.view.run()
        self.cfg = RunConfig.model_validate(run.config)
        if self.cfg.threads != self.config.threads:
            raise NodeError(
                f"host.toml threads={self.config.threads}, the run replays with {self.cfg.threads}"
            )
        if self.cfg.codec is Codec.SPARSE and self.team is not None:  # before anything is built
            raise NodeError("codec sparse (error feedback) is not supported with a torchrun team yet")
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
        self.rt.swept(self.content.sweep())  # what a kill left half-written, before anything writes
        every = checkpoint_every_for(self.cfg, self.config.checkpoint_every)
        self.store = StateStore(self.dir / "store", chunk_bytes=c, checkpoint_every=every)
        self.catalog.chunk_bytes = c
        self.holdings = Holdings(self.content, self.catalog, self.log)
        self.records = Records(self.dir / "commits", self.content, self.log)
        layout = {n: tuple(p.shape) for n, p in self.model.named_parameters()}
        self.catalog.coder = StateCoder(self.content, self.objects.specs[Kind.STATE], layout)  # specs §8.2
        self.models = GlobalModels(
            self.rt, self.holdings, layout, self.objects, self.cfg.outer, self.peers,
            sparse=sparse_codec(self.cfg),
        )
        g0 = node_initial_global(
            self.cfg.initial_model_hash, self.model, self.config.init_checkpoint_source, c
        )
        if g0.hash == self.cfg.initial_model_hash:
            self.models.keep(g0, read_from_disk=True)  # held as its file: G_0 in memory goes with _setup
        self.models.serve_stored()
        self.retention.publish_optimizer()

    def _join(self) -> None:
        me = join_run(self.chain, self.rt.wallet, self.config.run_id, Role.HOST, self.url, self.config.stake)
        if me is None:
            self.log("joined", run_id=self.config.run_id, stake=self.config.stake, endpoint=self.url)
        elif me["endpoint"] != self.url:
            self.log("endpoint_changed", on_chain=me["endpoint"], now=self.url)

    def peers(self) -> list[str]:
        """Everyone who may hold a run object: the other hosts, then the verifiers."""
        hosts = self.view.endpoints(Role.HOST, exclude=self.address)
        return hosts + self.view.endpoints(Role.VERIFIER)

    # ---------------------------------------------------------------- the loop

    def run(self, max_outer_steps: int | None = None, *, linger: bool = False) -> None:
        """With `linger`, keep serving (the final G, the last Δs) after the run ends, until `stop()`:
        late peers and verifiers still fetch from us, and we keep following blocks meanwhile."""
        tune_allocator()  # freed tensors go back to the OS: peak RSS is the peak, not the sum of phases
        self.rt.start()
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
            self.rt.set(phase=NodePhase.DONE)
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
            self.rt.close()

    def _failed(self, n: int, e: Exception) -> None:
        """Peers down, a bad G on offer, disk trouble: log, and wait for the step to close."""
        self.log("outer_step_failed", outer_step=n, error=f"{type(e).__name__}: {e}")
        self.view.wait_step(n, lambda i: i.phase is Phase.DONE)

    def outer_step(self, n: int) -> None:
        """The protocol script, resumable at every point from the chain and the disk:
        train → commit → reveal → aggregate."""
        contribution = self.train.phase(n)
        self._tail(n, contribution)

    def _tail(self, n: int, contribution: TrainedStep | None) -> None:
        """After the commit: reveal what was committed, then aggregate the accepted Δs."""
        if contribution is not None:
            self.reveal.phase(n, contribution)
        self.aggregate.phase(n, contribution)

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
                    contribution = self.train.phase(n)
                except (BlobError, ValueError, OSError) as e:
                    contribution = None
                    self.log("outer_step_failed", outer_step=n, error=f"{type(e).__name__}: {e}")
            self._spawn_tail(n, contribution)
            # one process only: a data-parallel team's ranks are not driven ahead (not exercised)
            if contribution is not None and self.behaviour.trains_ahead and self.team is None:
                try:
                    self.train.train_ahead(n + 1)
                except (BlobError, ValueError, OSError) as e:  # trained again when the step opens
                    self.log("train_ahead_failed", outer_step=n + 1, error=f"{type(e).__name__}: {e}")
            return 1
        newest = max(self._tails, default=-1)
        self.view.wait_run(lambda r: not r.active or r.current_step > newest)
        return 0

    def _spawn_tail(self, n: int, contribution: TrainedStep | None) -> None:
        def tail() -> None:
            try:
                self._tail(n, contribution)
            except Stopped:
                pass
            except (BlobError, ValueError, OSError, ChainTimeout) as e:  # the training loop goes on
                with contextlib.suppress(Stopped, ChainTimeout):
                    self._failed(n, e)

        self._tails[n] = self.rt.spawn(f"{self.name}-tail-{n}", tail)
        for m in [m for m, t in self._tails.items() if m < n - 1 and not t.is_alive()]:
            del self._tails[m]  # keep the recent ones: they mark steps already taken

    # ---------------------------------------------------------------- what the phases share

    def replica_model(self) -> nn.Module:
        """A second copy of the model for work beside training (overlapped runs): recomputing opened
        boundaries and evaluating adopted models. Built on first use, on the training device."""
        if self._replica is None:
            self._replica = build(self.cfg.model, self._allow_list).module.to(self.device)
        return self._replica

    @property
    def sharded(self) -> bool:
        return self.team is not None and self.team.shard_state

    def context(self, n: int, gm: GlobalModel, opt: torch.optim.Optimizer | None) -> OuterContext:
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
            blobs=self.rt.blobs,
            chain=self.chain,
            previous_accepted=previous,
            peers=self.peers(),
            team=self.team,
        )

    def count(self, key: str) -> None:
        with self.lock:
            self.state[key] = self.state.get(key, 0) + 1
            self.save_state()
            self.rt.set(**{key: self.state[key]})

    def sit_out(self, n: int, why: str) -> None:
        self.rt.set(phase=NodePhase.SITTING_OUT)
        self.log("sitting_out", outer_step=n, reason=why)
        return None
