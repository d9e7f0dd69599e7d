"""The verifier node: follow the run, check every assigned contribution, submit verdicts.

Per outer step it (1) holds G_n (from its own outer step over the accepted Δs, or fetched from
hosts by the on-chain hash), (2) polls its assignments after every block, (3) builds a `Job` from
chain queries once the host revealed (or the reveal deadline passed), (4) runs `verify.verify`
on a bounded pool whose workers each own one replay model, and (5) signs `MsgSubmitVerdict`.
A blob that is missing before the reveal deadline is retried later, not held against the host.
Nothing a host sends can stop the loop: every failure becomes a reason code or a log line.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import httpx

from chain.client import ChainClient, ChainTimeout, TxFailed
from protocol.codecs import decode, delta_hash, from_blob
from protocol.config import RunConfig
from protocol.messages import EnvFingerprint, MsgSubmitVerdict, Reason, Role
from trainer.blobs import (
    BlobCatalog,
    BlobClient,
    BlobError,
    BlobInvalid,
    BlobUnavailable,
    ServerThread,
    build_app,
)
from trainer.data import Corpus, shakespeare_corpus
from trainer.globalmodel import GlobalModel, GlobalStore
from trainer.nodebase import NodeError, Stopped, host_endpoints, join_run, json_line, pin_device
from trainer.spec import DEFAULT_ALLOW_LIST, Factory, build
from trainer.step import State, env_fingerprint
from trainer.store import state_from_bytes
from verifier.behaviour import VerifierBehaviour
from verifier.metrics import VerifierMetrics
from verifier.node_config import VerifierConfig
from verifier.verify import (
    CannotVerify,
    Job,
    MalformedBlob,
    MissingData,
    OpeningData,
    Outcome,
    ReplayContext,
    check_verifier_env,
    verify,
)

DONE_PHASES = ("AWAITING_RESULT", "DONE")  # chain.params.Phase values after finalization
Pending = Future["Outcome | None"]
RECOVERABLE = (httpx.HTTPError, OSError, ChainTimeout, BlobError)
"""The chain or every host unreachable (cosmpy's requests errors are OSErrors): wait, then resume."""


class _Retry(Exception):
    """Data not served yet, before the reveal deadline: judge this host again after a block."""


class HttpSource:
    """`BlobSource` over a host's endpoint: bounded, hash-checked, retried; errors become reasons."""

    def __init__(self, client: BlobClient, endpoint: str, max_state_bytes: int, max_delta_bytes: int):
        self.client, self.endpoints = client, [endpoint]
        self.max_state_bytes, self.max_delta_bytes = max_state_bytes, max_delta_bytes

    def _get(self, kind: str, h: str, check: Callable[[bytes], None], limit: int) -> bytes:
        try:
            return self.client.get(kind, h, check, endpoints=self.endpoints, max_bytes=limit)
        except BlobUnavailable as e:
            raise MissingData(str(e)) from e
        except BlobInvalid as e:
            raise MalformedBlob(str(e)) from e

    def state(self, leaf_hash: str) -> State:
        parsed: list[State] = []

        def check(data: bytes) -> None:  # parse and hash once, keep the result
            parsed[:] = [state_from_bytes(data, leaf_hash, max_bytes=self.max_state_bytes)]

        self._get("state", leaf_hash, check, self.max_state_bytes)
        return parsed[0]

    def delta(self, delta_hash: str) -> bytes:
        return self._get("delta", delta_hash, lambda b: None, self.max_delta_bytes)  # verify.py decodes


class VerifierNode:
    """One verifier. `run()` blocks until the run finishes, `max_outer_steps` are done, or `stop()`."""

    def __init__(
        self,
        config: VerifierConfig,
        chain: ChainClient,
        *,
        behaviour: VerifierBehaviour | None = None,
        corpus: Corpus | None = None,
        allow_list: Mapping[str, Factory] = DEFAULT_ALLOW_LIST,
        log: Callable[[dict[str, Any]], None] = json_line,
        poll_timeout: float = 10.0,
        blob_timeout: float = 30.0,
        blob_retries: int = 2,
        blob_backoff: float = 0.5,
        retry_backoff: float = 0.5,
    ) -> None:
        if behaviour is None:  # adversaries live above verifier/: the CLI resolves them and passes one in
            if config.behaviour != "honest" or config.behaviour_params:
                raise NodeError(f"behaviour {config.behaviour!r} must be resolved by the caller")
            behaviour = VerifierBehaviour()
        self.config, self.chain, self.behaviour = config, chain, behaviour
        self.wallet = config.wallet()
        self.address = str(self.wallet.address())
        self.name = config.data_path.name or "verifier"
        self._corpus, self._allow_list, self._log = corpus, allow_list, log
        self.poll_timeout, self.retry_backoff = poll_timeout, retry_backoff
        self.dir = config.data_path
        self.dir.mkdir(parents=True, exist_ok=True)
        self.globals = GlobalStore(self.dir / "global")
        self.metrics = VerifierMetrics()
        self.catalog = BlobCatalog()
        self.blobs = BlobClient(
            [], blob_timeout, blob_retries, backoff=blob_backoff, on_bytes=self.metrics.bytes_fetched.inc
        )
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._gm: dict[str, GlobalModel] = {}
        self.status: dict[str, Any] = {
            "node": self.name, "role": "verifier", "address": self.address, "run_id": config.run_id,
            "outer_step": None, "phase": "STARTING", "verdicts": {}, "submitted": 0,
        }  # fmt: skip
        app = build_app(self.catalog, self.snapshot, self.metrics.registry)
        self.server = ServerThread(app, config.listen)

    # ---------------------------------------------------------------- plumbing

    @property
    def url(self) -> str:
        return self.config.public_url or self.server.url

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return json.loads(json.dumps(self.status, default=str))

    def _set(self, **fields: Any) -> None:
        with self._lock:
            self.status.update(fields)

    def log(self, event: str, **fields: Any) -> None:
        self._log({"ts": round(time.time(), 3), "node": self.name, "event": event, **fields})

    def stop(self) -> None:
        self._stop.set()

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise Stopped

    def _next_block(self, h: int) -> int:
        self._check_stop()
        try:
            return self.chain.wait_for_block(h, timeout=self.poll_timeout).height
        except ChainTimeout:
            return self.chain.height()

    def _step_info(self, n: int) -> dict[str, Any]:
        return self.chain.outer_step(self.config.run_id, n)

    # ---------------------------------------------------------------- start-up

    def _setup(self) -> None:
        run = self.chain.run(self.config.run_id)
        self.cfg = RunConfig.model_validate(run["config"])
        device = pin_device(self.config.threads, self.config.device)
        self.env: EnvFingerprint = env_fingerprint(self.config.threads)
        self.log("environment", device=str(device), replay_class=self.env.replay_class)
        self.corpus = self._corpus if self._corpus is not None else shakespeare_corpus()
        if self.corpus.manifest_hash != self.cfg.dataset_manifest_hash:
            raise NodeError(f"local dataset {self.corpus.manifest_hash[:12]} is not the run's")
        workers = self.config.workers
        self._contexts: queue.Queue[tuple[Any, Any]] = queue.Queue()
        for _ in range(workers):
            built = build(self.cfg.model, self._allow_list)
            self._contexts.put((built.module.to(device), built.loss_fn))
        model = self._contexts.queue[0][0]
        numel = sum(p.numel() for p in model.parameters())
        self.max_state_bytes = 3 * 4 * numel + (1 << 20)  # params + two moments, float32, + header
        self.max_delta_bytes = 4 * numel + (1 << 20)  # fp32 is the largest codec
        g0 = GlobalModel.from_module(model)
        if g0.hash == self.cfg.initial_model_hash:
            self.globals.save(g0)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix=f"{self.name}-verify")

    def _join(self) -> None:
        me = join_run(self.chain, self.wallet, self.config.run_id, Role.VERIFIER, self.url, self.config.stake)
        if me is None:
            self.log("joined", run_id=self.config.run_id, stake=self.config.stake, endpoint=self.url)

    def _host_endpoints(self) -> list[str]:
        return host_endpoints(self.chain, self.config.run_id)

    # ---------------------------------------------------------------- the loop

    def run(self, max_outer_steps: int | None = None) -> None:
        """Survives the chain or a host going away: the step is re-read and resumed when it is back."""
        self.server.start()
        self._log({"event": "listening", "url": self.server.url, "node": self.name})
        done = failures = 0
        ready = False
        try:
            while max_outer_steps is None or done < max_outer_steps:
                try:
                    if not ready:
                        self._setup()
                        ready = True
                    self._join()
                    run = self.chain.run(self.config.run_id)
                    if run["status"] != "active":
                        self.log("run_finished", outer_step=run["current_step"])
                        break
                    self.outer_step(run["current_step"])
                    done, failures = done + 1, 0
                except RECOVERABLE as e:  # resumable: assignments already judged are not listed again
                    failures += 1
                    self.log("interrupted", error=f"{type(e).__name__}: {e}", retry=failures)
                    if self._stop.wait(min(self.retry_backoff * 2 ** (failures - 1), 10.0)):
                        raise Stopped from None
            self._set(phase="DONE")
        except Stopped:
            self.log("stopped")
        finally:
            if hasattr(self, "pool"):
                self.pool.shutdown(wait=True, cancel_futures=True)
            self.server.stop()
            self.blobs.close()

    def outer_step(self, n: int) -> None:
        """Judge every contribution assigned to us in outer step n, then follow G to G_{n+1}."""
        self._set(outer_step=n, phase="WAITING")
        info = self._step_info(n)
        h = self.chain.height()
        while info["challenge_seed"] is None and info["phase"] not in DONE_PHASES:
            h = self._next_block(max(h, info["height"]))
            info = self._step_info(n)
        if self.behaviour.online() and info["phase"] not in DONE_PHASES:
            self._set(phase="VERIFYING")
            self._verify_step(n, info)
        self._set(phase="FOLLOWING")
        self._follow(n)

    def _verify_step(self, n: int, info: dict[str, Any]) -> None:
        gm = self._global(info["base_model_hash"])
        settled: set[str] = set()
        deferred: dict[str, int] = {}  # host -> height at which its data was not yet served
        running: dict[Pending, tuple[str, float]] = {}
        h = info["height"]
        while True:
            info = self._step_info(n)
            if info["finalized_height"] is not None or info["phase"] in DONE_PHASES:
                break
            me, rid = self.address, self.config.run_id
            assigned = self.chain.query("assignments", run_id=rid, verifier=me, step=n)["hosts"]
            busy = {host for host, _ in running.values()}
            for host in assigned:
                if host in settled or host in busy or deferred.get(host, -1) >= info["height"]:
                    continue
                job = self._job(n, host, info)
                if job is not None:
                    running[self.pool.submit(self._judge, job, gm)] = (host, time.perf_counter())
            if running:  # wait for work, not for blocks: the chain may be waiting on us
                finished, _ = wait(list(running), timeout=self.poll_timeout, return_when=FIRST_COMPLETED)
                ready: list[tuple[str, Outcome, float]] = []
                for fut in finished:
                    host, t0 = running.pop(fut)
                    try:
                        out = self._outcome(n, host, fut, info)
                    except _Retry:
                        deferred[host] = info["height"]
                        continue
                    settled.add(host)
                    if out is not None:
                        ready.append((host, out, time.perf_counter() - t0))
                if ready:
                    self._submit(n, ready)
            else:
                h = self._next_block(max(h, info["height"]))

    def _job(self, n: int, host: str, info: dict[str, Any]) -> Job | None:
        """The job once the host revealed; after the reveal deadline, a job with nothing opened."""
        rid = self.config.run_id
        c = self.chain.query("commitment", run_id=rid, host=host, step=n)
        if c is None:
            return None
        reveals = self.chain.query("reveals", run_id=rid, step=n)["reveals"]
        reveal = next((r for r in reveals if r["host"] == host), None)
        if reveal is None and info["height"] <= info["reveal_deadline"]:
            return None
        challenges = self.chain.query("challenges", run_id=rid, step=n)["challenges"]
        segments = next(x["segments"] for x in challenges if x["host"] == host)
        opened = tuple(  # the chain checked each pair proof at reveal and keeps only the leaves
            OpeningData(o["segment"], o["start_leaf"], o["end_leaf"], tuple(o.get("proof") or ()) or None)
            for o in (reveal["openings"] if reveal else [])
        )
        return Job(
            run_id=rid, outer_step=n, host=host, cfg=self.cfg, trajectory_root=c["trajectory_root"],
            leaf_count=c["leaf_count"], delta_hash=c["delta_hash"],
            final_optimizer_hash=c["final_optimizer_hash"], tokens=c["tokens"],
            env=EnvFingerprint.model_validate(c["env"]), sampled=tuple(segments), openings=opened,
            prev_optimizer_hash=self.chain.query("prev_optimizer_hash", run_id=rid, host=host),
        )  # fmt: skip

    def _judge(self, job: Job, gm: GlobalModel) -> Outcome | None:
        """Runs on a pool worker with that worker's own model; the behaviour decides what to report."""
        model, loss_fn = self._contexts.get()
        try:
            endpoint = next(
                (p["endpoint"] for p in self.chain.query("participants", run_id=job.run_id)["participants"]
                 if p["address"] == job.host), "",
            )  # fmt: skip
            source = HttpSource(self.blobs, endpoint, self.max_state_bytes, self.max_delta_bytes)
            ctx = ReplayContext(model, loss_fn, self.corpus, gm.params, self.metrics.replay_steps.inc)

            def check() -> Outcome:
                check_verifier_env(job, self.env)
                return verify(job, source, ctx)

            with self.metrics.in_flight.track_inprogress():
                return self.behaviour.decide(job, check)
        finally:
            self._contexts.put((model, loss_fn))

    def _outcome(self, n: int, host: str, fut: Pending, info: dict[str, Any]) -> Outcome | None:
        """A finished verification's verdict, None if there is nothing to submit; raises `_Retry`
        when the data is missing but the reveal deadline has not passed (it may still come)."""
        try:
            out = fut.result()
        except CannotVerify as e:
            self.metrics.errors.labels("cannot_verify").inc()
            self.log("abstain", outer_step=n, host=host, reason=str(e))
            return None
        except Exception as e:  # a bug of ours must not take the node down; nothing is submitted
            self.metrics.errors.labels(type(e).__name__).inc()
            self.log("verify_error", outer_step=n, host=host, error=f"{type(e).__name__}: {e}")
            return None
        early = self.chain.height() <= info["reveal_deadline"]
        if out is not None and out.reason is Reason.MISSING_DATA and early:
            self.log("data_not_yet_served", outer_step=n, host=host, detail=out.detail)
            raise _Retry
        return out

    def _submit(self, n: int, ready: list[tuple[str, Outcome, float]]) -> None:
        """All finished verdicts in one tx (one block, one fee); one by one if the batch is refused,
        so a contribution decided meanwhile does not cost the others their verdicts."""
        msgs = [
            MsgSubmitVerdict(creator=self.address, run_id=self.config.run_id, outer_step=n, host=host,
                             reason=out.reason, evidence_hash=out.evidence_hash, detail=out.detail)
            for host, out, _ in ready
        ]  # fmt: skip
        try:
            self.chain.broadcast(self.wallet, msgs)
            sent = ready
        except TxFailed as e:
            if len(msgs) == 1:
                self.log("verdict_refused", outer_step=n, host=ready[0][0], error=e.log)
                return
            sent = []
            for item, msg in zip(ready, msgs, strict=True):
                try:
                    self.chain.broadcast(self.wallet, [msg])
                    sent.append(item)
                except TxFailed as e1:
                    self.log("verdict_refused", outer_step=n, host=item[0], error=e1.log)
        for host, out, seconds in sent:
            self.metrics.verifications.inc()
            self.metrics.verify_seconds.observe(seconds)
            self.metrics.verdicts.labels(out.reason.name).inc()
            if out.replay_steps and out.replay_seconds > 0:  # host's time ≈ H steps at our replay speed
                host_seconds = out.replay_seconds / out.replay_steps * self.cfg.inner_steps
                self.metrics.cost_fraction.set(seconds / host_seconds)
            with self._lock:
                self.status["verdicts"][f"{n}:{host}"] = out.reason.name
                self.status["submitted"] += 1
            self.log("verdict", outer_step=n, host=host, reason=out.reason.name, detail=out.detail,
                     evidence=out.evidence_hash, seconds=round(seconds, 3))  # fmt: skip

    # ---------------------------------------------------------------- following G

    def _global(self, h: str) -> GlobalModel:
        """G by hash: memory, own disk (verified on read), else any host (verified)."""
        if h not in self._gm:
            if self.globals.has(h):
                self._gm[h] = self.globals.load(h)
            else:
                self._gm[h] = self.globals.fetch(h, self.blobs, endpoints=self._host_endpoints())
            self.catalog.publish("model", h, lambda: self.globals.get_bytes(h))
        return self._gm[h]

    def _follow(self, n: int) -> None:
        """Compute G_{n+1} ourselves from the accepted Δs once step n is done (fetch it if that fails)."""
        info = self._step_info(n)
        h = self.chain.height()
        while info["phase"] != "DONE":
            h = self._next_block(max(h, info["height"]))
            info = self._step_info(n)
        target = info["result_hash"] or info["base_model_hash"]
        if target in self._gm or self.globals.has(target):
            return
        try:
            gm = self._global(info["base_model_hash"])
            acc = self.chain.query("accepted", run_id=self.config.run_id, step=n)["accepted"]
            deltas = [(a["host"], a["tokens"], decode(self._fetch_delta(gm, a), gm.layout)) for a in acc]
            new = gm.apply(deltas, self.cfg.outer)
            if new.hash == target:
                self.globals.save(new)
                self._gm[new.hash] = new
                self.catalog.publish("model", new.hash, lambda: self.globals.get_bytes(new.hash))
                self.log("outer_step_applied", outer_step=n, model_hash=new.hash)
                return
            self.log("outer_step_differs", outer_step=n, mine=new.hash, chain=target)
        except (BlobUnavailable, BlobInvalid, ValueError, OSError) as e:
            self.log("outer_step_unavailable", outer_step=n, error=f"{type(e).__name__}: {e}")
        self._global(target)

    def _fetch_delta(self, gm: GlobalModel, a: dict[str, Any]) -> bytes:
        limit = self.max_delta_bytes

        def payload_of(blob: bytes) -> bytes:
            payload = from_blob(blob, gm.layout, max_payload_bytes=limit, codec=self.cfg.codec)
            if delta_hash(payload) != a["delta_hash"]:
                raise ValueError("Δ payload hash mismatch")
            return payload

        endpoints = [e for e in [a["endpoint"], *self._host_endpoints()] if e]
        blob = self.blobs.get("delta", a["delta_hash"], payload_of, endpoints=endpoints, max_bytes=2 * limit)
        return payload_of(blob)
