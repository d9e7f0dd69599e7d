"""The host node: follow the chain's phases and train, commit, reveal, aggregate, report, repeat.

The chain is the source of truth for *where* the run is; the node's own disk (`data_dir`) is the
source of truth for *what it did*. Every step is idempotent against both, so a node killed at
any point and restarted on the same `data_dir` re-derives where it stands: it never commits a
second, different contribution for one outer step, reveals what it committed, and sits out an
outer step whose deadline it missed. Only Δs the chain finalized as accepted reach the model.

Under torchrun this is rank 0, and the only rank that talks to the chain, serves and writes
`data_dir`; its `team` (`trainer.ddp.Team`) makes the other ranks train each batch with it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from chain.client import ChainClient, ChainTimeout, TxFailed
from protocol.codecs import CodecError, decode, delta_hash, from_blob, to_blob
from protocol.config import Codec, RunConfig
from protocol.messages import EnvFingerprint, MsgRevealContribution, MsgSubmitOuterResult, Role
from protocol.tensors import StateKind
from trainer.behaviour import AcceptedDelta, HostBehaviour, OuterContext, resolve
from trainer.blobs import BlobCatalog, BlobClient, BlobError, ServerThread, build_app, parse_listen
from trainer.commit import Contribution, openings
from trainer.data import Corpus, eval_loss, shakespeare_corpus
from trainer.ddp import Team
from trainer.globalmodel import GlobalModel, GlobalStore
from trainer.metrics import HostMetrics
from trainer.node_config import HostConfig
from trainer.nodebase import NodeError, Stopped, host_endpoints, join_run, json_line, pin_device
from trainer.spec import DEFAULT_ALLOW_LIST, Factory, build
from trainer.step import (
    load_training_state,
    make_optimizer,
    optimizer_state,
    training_state,
)
from trainer.store import StateStore, atomic_write

VAL_BATCHES = 4
DONE = "DONE"  # the chain's phase of a finished outer step (chain.params.Phase; trainer sees only the client)
ERR_DUPLICATE_COMMIT = "ErrDuplicateCommit"


@dataclass
class Record:
    """What the node committed in one outer step, on disk before the commit is broadcast."""

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

    @classmethod
    def of(cls, c: Contribution) -> Record:
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
        self.poll_timeout = poll_timeout
        self.dir = config.data_path
        self.dir.mkdir(parents=True, exist_ok=True)
        self.store = StateStore(self.dir / "states")
        self.optim_store = StateStore(self.dir / "optimizer")
        self.globals = GlobalStore(self.dir / "global")
        self.metrics = HostMetrics()
        self.catalog = BlobCatalog()
        self.blobs = BlobClient(
            [], blob_timeout, blob_retries, backoff=blob_backoff, on_bytes=self.metrics.bytes_received.inc
        )
        self.state = self._load_state()
        self._stop = threading.Event()
        self._gm_cache: dict[str, GlobalModel] = {}
        self._opt: torch.optim.Optimizer | None = None
        self._published_deltas: dict[int, str] = {}
        self._lock = threading.Lock()
        self.status: dict[str, Any] = {
            "node": self.name,
            "role": "host",
            "address": self.address,
            "run_id": config.run_id,
            "outer_step": None,
            "phase": "STARTING",
            "loss": None,
            "val_loss": dict(self.state.get("val_loss", {})),
            "commits": self.state.get("commits", 0),
            "accepted": self.state.get("accepted", 0),
            "rejected": self.state.get("rejected", 0),
        }
        self.server = self._bind_server()

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

    def _save_state(self) -> None:
        atomic_write(self.dir / "node.json", json.dumps(self.state, sort_keys=True, indent=1).encode())

    def _record_path(self, n: int) -> Path:
        return self.dir / "commits" / f"{n}.json"

    def _save_record(self, c: Contribution) -> None:
        atomic_write(self.dir / "commits" / f"{c.outer_step}.payload", c.payload)
        atomic_write(self._record_path(c.outer_step), json.dumps(asdict(Record.of(c))).encode())

    def _load_record(self, n: int) -> Contribution | None:
        try:
            record = Record(**json.loads(self._record_path(n).read_bytes()))
            payload = (self.dir / "commits" / f"{n}.payload").read_bytes()
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:
            self.log("record_unreadable", outer_step=n, error=str(e))
            return None
        if delta_hash(payload) != record.delta_hash:
            self.log("record_unreadable", outer_step=n, error="payload does not match its hash")
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

        app = build_app(
            self.catalog,
            self.snapshot,
            self.metrics.registry,
            serve_filter=self.behaviour.serve_blob,
            on_sent=sent,
        )
        return ServerThread(app, listen)

    @property
    def url(self) -> str:
        return self.config.public_url or self.server.url

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return json.loads(json.dumps(self.status, default=str))

    def _set(self, **fields: Any) -> None:
        with self._lock:
            self.status.update(fields)
        if "phase" in fields:
            self.metrics.phase.state(fields["phase"])
        if fields.get("outer_step") is not None:
            self.metrics.outer_step.set(fields["outer_step"])

    def log(self, event: str, **fields: Any) -> None:
        self._log({"ts": round(time.time(), 3), "node": self.name, "event": event, **fields})

    # ---------------------------------------------------------------- chain following

    def stop(self) -> None:
        self._stop.set()

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise Stopped

    def _wait_height(self, target: int) -> int:
        """Block until the chain is at `target` or beyond, one long-poll per block."""
        h = self.chain.height()
        while h < target:
            self._check_stop()
            try:
                h = self.chain.wait_for_block(h, timeout=self.poll_timeout).height
            except ChainTimeout:
                h = self.chain.height()
        self._check_stop()
        return h

    def _wait_step(
        self, n: int, done: Callable[[dict[str, Any]], bool], from_height: int = 0
    ) -> dict[str, Any]:
        """Re-read outer step n after every block until `done` holds."""
        h = self._wait_height(from_height)
        while True:
            info = self._step_info(n)
            if done(info):
                return info
            h = self._wait_height(max(h, info["height"]) + 1)

    def _broadcast(self, msgs: list[Any]) -> None:
        self.chain.broadcast(self.wallet, msgs)

    # ---------------------------------------------------------------- start-up

    def _setup(self) -> None:
        run = self.chain.run(self.config.run_id)
        self.cfg = RunConfig.model_validate(run["config"])
        if self.cfg.threads != self.config.threads:
            raise NodeError(
                f"host.toml threads={self.config.threads}, the run replays with {self.cfg.threads}"
            )
        device = pin_device(self.cfg.threads, self.config.device)
        built = build(self.cfg.model, self._allow_list)
        self.model: nn.Module = built.module.to(device)
        self.loss_fn = built.loss_fn
        self.corpus = self._corpus if self._corpus is not None else shakespeare_corpus()
        if self.corpus.manifest_hash != self.cfg.dataset_manifest_hash:
            raise NodeError(
                f"local dataset {self.corpus.manifest_hash[:12]} is not the run's "
                f"{self.cfg.dataset_manifest_hash[:12]}"
            )
        g0 = GlobalModel.from_module(self.model)
        if g0.hash == self.cfg.initial_model_hash:
            self.globals.save(g0)
        for h in self.globals.hashes():
            self.catalog.publish("model", h, lambda h=h: self.globals.get_bytes(h))

    def _join(self) -> None:
        me = join_run(self.chain, self.wallet, self.config.run_id, Role.HOST, self.url, self.config.stake)
        if me is None:
            self.log("joined", run_id=self.config.run_id, stake=self.config.stake, endpoint=self.url)
        elif me["endpoint"] != self.url:
            self.log("endpoint_changed", on_chain=me["endpoint"], now=self.url)

    def _peers(self) -> list[str]:
        return host_endpoints(self.chain, self.config.run_id, exclude=self.address)

    # ---------------------------------------------------------------- the loop

    def run(self, max_outer_steps: int | None = None, *, linger: bool = False) -> None:
        """With `linger`, keep serving (the final G, the last Δs) after the run ends, until `stop()`:
        late peers and verifiers still fetch from us, and we keep following blocks meanwhile."""
        self.server.start()
        self._log({"event": "listening", "url": self.server.url, "node": self.name})
        done = 0
        try:
            self._setup()
            self._join()
            while max_outer_steps is None or done < max_outer_steps:
                run = self.chain.run(self.config.run_id)
                if run["status"] != "active":
                    self.log("run_finished", outer_step=run["current_step"])
                    break
                try:
                    self.outer_step(run["current_step"])
                except (BlobError, ValueError, OSError) as e:  # peers down, a bad G on offer, disk trouble
                    self.log(
                        "outer_step_failed", outer_step=run["current_step"], error=f"{type(e).__name__}: {e}"
                    )
                    self._wait_step(run["current_step"], lambda i: i["phase"] == DONE)
                done += 1
            self._set(phase="DONE")
            if self.team is not None:
                self.team.close()  # no more training: the other ranks exit
            if linger:
                self.log("lingering", url=self.url)
                self._wait_height(sys.maxsize)
        except Stopped:
            self.log("stopped")
        finally:
            self.server.stop()
            self.blobs.close()

    def outer_step(self, n: int) -> None:
        """One outer step, resumable at every point from the chain and the disk."""
        self._set(outer_step=n, phase="WAITING")
        info = self._step_info(n)
        mine = self.chain.query("commitment", run_id=self.config.run_id, host=self.address, step=n)
        contribution = self._train_and_commit(n, info) if mine is None else self._recover(n, mine)
        if contribution is not None:
            self._reveal(n, contribution)
        self._aggregate(n, contribution)

    def _step_info(self, n: int) -> dict[str, Any]:
        return self.chain.query("outer_step", run_id=self.config.run_id, step=n)

    def _global(self, h: str) -> GlobalModel:
        """G by hash: memory, else own disk (verified), else peers (verified), then kept on disk."""
        if h not in self._gm_cache:
            if not self.globals.has(h):
                self.log("fetching_global", model_hash=h)
            self._gm_cache[h] = self.globals.fetch(h, self.blobs, endpoints=self._peers())
            self.catalog.publish("model", h, lambda: self.globals.get_bytes(h))
        return self._gm_cache[h]

    def _start_optimizer(self, gm: GlobalModel) -> torch.optim.Optimizer:
        """The optimizer state the chain says this step starts from: last accepted, or fresh."""
        opt = make_optimizer(self.model, self.cfg.inner)
        prev = self.chain.query("prev_optimizer_hash", run_id=self.config.run_id, host=self.address)
        gm.load_into(self.model)
        if prev:
            try:
                saved = self.optim_store.get(prev, kind=StateKind.OPTIMIZER)
            except ValueError as e:
                raise NodeError(f"own optimizer state {prev[:12]} is lost ({e}); leave and rejoin") from e
            params = {f"param/{n}": p.detach() for n, p in self.model.named_parameters()}
            load_training_state(self.model, opt, {**params, **saved})
        return opt

    def _train_and_commit(self, n: int, info: dict[str, Any]) -> Contribution | None:
        h = self._wait_height(info["train_start"])
        if h > info["commit_deadline"]:
            return self._sit_out(n, "commit deadline passed before training")
        gm = self._global(info["base_model_hash"])
        contribution = self._load_record(n)
        if contribution is None or contribution.base_model_hash != gm.hash:
            self._set(phase="TRAINING")
            opt = self._opt = self._start_optimizer(gm)
            ctx = self._context(n, gm, opt)
            t0 = time.perf_counter()
            contribution = self.behaviour.make_contribution(ctx)
            seconds = time.perf_counter() - t0
            self.metrics.trained(self.cfg.inner_steps, contribution.tokens, seconds, contribution.mean_loss)
            self.optim_store.put(
                optimizer_state(training_state(self.model, opt, copy=True)), n, StateKind.OPTIMIZER
            )
            self._save_record(contribution)
            self._set(loss=contribution.mean_loss)
            self.log(
                "trained",
                outer_step=n,
                loss=round(contribution.mean_loss, 4),
                seconds=round(seconds, 3),
                tokens_per_s=round(contribution.tokens / max(seconds, 1e-9)),
            )
        ctx = self._context(n, gm, self._opt)
        try:
            for msg in self.behaviour.commit_messages(contribution, ctx):
                self._broadcast([msg])
                self.metrics.commits.inc()
        except TxFailed as e:
            if ERR_DUPLICATE_COMMIT not in e.log:
                return self._sit_out(n, f"commit refused: {e.log}")
        self._count("commits")
        self._set(phase="COMMITTED")
        self.log("committed", outer_step=n, root=contribution.trajectory_root, delta=contribution.delta_hash)
        return contribution

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
            acc = self.chain.query("accepted", run_id=self.config.run_id, step=n - 1)["accepted"]
            previous = [AcceptedDelta(a["host"], a["delta_hash"], a["tokens"], a["endpoint"]) for a in acc]
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
        self.state[key] = self.state.get(key, 0) + 1
        self._save_state()
        self._set(**{key: self.state[key]})

    # ---------------------------------------------------------------- reveal

    def _reveal(self, n: int, c: Contribution) -> None:
        info = self._wait_step(n, lambda i: i["challenge_seed"] is not None or i["phase"] == DONE)
        if info["challenge_seed"] is None:
            return
        ch = self.chain.query("challenges", run_id=self.config.run_id, step=n)["challenges"]
        segments = next((x["segments"] for x in ch if x["host"] == self.address), None)
        if segments is None:
            return
        revealed = self.chain.query("reveals", run_id=self.config.run_id, step=n)["reveals"]
        already = any(r["host"] == self.address for r in revealed)
        ctx = self._context(n, self._global(c.base_model_hash), self._opt)
        if not already and not self.behaviour.should_reveal(c, ctx):
            self.log("not_revealing", outer_step=n)
            return
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

    def _publish(self, n: int, c: Contribution, segments: list[int]) -> None:
        for s in segments:
            for leaf in (c.leaves[s], c.leaves[s + 1]):
                self.catalog.publish("state", leaf, lambda leaf=leaf: self.store.get_bytes(leaf, n))
        try:
            blob = to_blob(c.payload)
        except CodecError:
            blob = c.payload  # a deliberately malformed payload: serve it as it is
        self.catalog.publish("delta", c.delta_hash, lambda: blob)
        self._published_deltas[n] = c.delta_hash

    # ---------------------------------------------------------------- outer step

    def _aggregate(self, n: int, mine: Contribution | None) -> None:
        info = self._step_info(n)
        info = self._wait_step(n, lambda i: i["finalized_height"] is not None, info["verify_deadline"])
        self._set(phase="AGGREGATING")
        acc = self.chain.query("accepted", run_id=self.config.run_id, step=n)
        accepted = acc["accepted"]
        if mine is not None:
            ok = any(a["host"] == self.address for a in accepted)
            self._count("accepted" if ok else "rejected")
            (self.metrics.accepted if ok else self.metrics.rejected).inc()
            self.log("outcome", outer_step=n, outcome=info["outcomes"].get(self.address))
        try:
            new = self._apply(self._global(acc["base_model_hash"]), accepted, mine)
        except (BlobError, ValueError, OSError) as e:  # G_n itself unavailable: take the chain's G_{n+1}
            self.log("outer_step_unavailable", outer_step=n, error=f"{type(e).__name__}: {e}")
            new = None
        voted = self.address in info["result_votes"]
        if new is not None:
            self._adopt(n, new)
            if any(a["host"] == self.address for a in accepted) and not voted and info["phase"] != DONE:
                try:
                    self._broadcast(
                        [
                            MsgSubmitOuterResult(
                                creator=self.address,
                                run_id=self.config.run_id,
                                outer_step=n,
                                model_hash=new.hash,
                            )
                        ]
                    )
                except TxFailed as e:
                    self.log("result_refused", outer_step=n, error=e.log)
        done = self._wait_step(n, lambda i: i["phase"] == DONE)
        if done["result_hash"] and (new is None or new.hash != done["result_hash"]):
            self.log(
                "result_differs", outer_step=n, chain=done["result_hash"], mine=new.hash if new else None
            )
            self._adopt(n, self._global(done["result_hash"]))
        self._prune(n)

    def _apply(
        self, gm: GlobalModel, accepted: list[dict[str, Any]], mine: Contribution | None
    ) -> GlobalModel | None:
        """G_{n+1} from the accepted Δs only, each decoded from its verified payload."""
        deltas = []
        for a in accepted:
            try:
                if mine is not None and a["host"] == self.address and a["delta_hash"] == mine.delta_hash:
                    payload = mine.payload
                else:
                    payload = self._fetch_delta(gm, a)
                deltas.append((a["host"], a["tokens"], decode(payload, gm.layout)))
            except (BlobError, ValueError, OSError) as e:
                self.log("delta_unavailable", host=a["host"], error=f"{type(e).__name__}: {e}")
                return None
        return gm.apply(deltas, self.cfg.outer)

    def _fetch_delta(self, gm: GlobalModel, a: dict[str, Any]) -> bytes:
        limit = 8 * gm.numel() + (1 << 20)

        def payload_of(blob: bytes) -> bytes:
            payload = from_blob(blob, gm.layout, max_payload_bytes=limit, codec=self.cfg.codec)
            if delta_hash(payload) != a["delta_hash"]:
                raise ValueError("Δ payload hash mismatch")
            return payload

        endpoints = [e for e in [a["endpoint"], *self._peers()] if e and e != self.url]
        got: list[bytes] = []
        self.blobs.get(
            "delta",
            a["delta_hash"],
            lambda b: got.append(payload_of(b)),
            endpoints=endpoints,
            max_bytes=2 * limit,
        )
        return got[-1]

    def _adopt(self, n: int, gm: GlobalModel) -> None:
        self.globals.save(gm)
        self._gm_cache[gm.hash] = gm
        self.catalog.publish("model", gm.hash, lambda h=gm.hash: self.globals.get_bytes(h))
        gm.load_into(self.model)
        loss = eval_loss(
            self.model,
            self.corpus.val,
            VAL_BATCHES,
            self.cfg.seed,
            batch_size=self.cfg.batch_size,
            seq_len=self.cfg.seq_len,
            loss_fn=self.loss_fn,
        )
        self.state.setdefault("val_loss", {})[str(n)] = loss
        self._save_state()
        self.metrics.val_loss.set(loss)
        with self._lock:
            self.status["val_loss"] = dict(self.state["val_loss"])
        self.log("outer_step_applied", outer_step=n, model_hash=gm.hash, val_loss=round(loss, 4))

    def _prune(self, n: int) -> None:
        """Finalized states go; Δs stay one step longer (late peers, copycats download them like
        anyone); only the optimizer state the chain chains on and the last two models stay."""
        for _, h in self.catalog.served("state"):
            self.catalog.withdraw("state", h)
        self.store.prune(n + 1)
        for m, h in list(self._published_deltas.items()):
            if m < n:
                self.catalog.withdraw("delta", h)
                del self._published_deltas[m]
                for suffix in ("json", "payload"):
                    (self.dir / "commits" / f"{m}.{suffix}").unlink(missing_ok=True)
        keep = self.chain.query("prev_optimizer_hash", run_id=self.config.run_id, host=self.address)
        for path in self.optim_store.root.glob("*/*.safetensors"):
            if path.stem != keep:
                path.unlink(missing_ok=True)
        base = self._step_info(n)["base_model_hash"]
        current = self.chain.run(self.config.run_id)["global_model_hash"]
        for h in self.globals.prune([base, current]):
            self.catalog.withdraw("model", h)
            self._gm_cache.pop(h, None)
