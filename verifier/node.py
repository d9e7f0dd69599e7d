"""The verifier node: follow the run, check every assigned contribution, submit verdicts.

Per outer step it (1) holds G_n (from its own outer step over the accepted Δs, or fetched from
holders by the on-chain hash), (2) polls its assignments after every block, (3) builds a `Job` from
chain queries once the host revealed (or the reveal deadline passed), (4) runs `verify.verify`
on a bounded pool whose workers each own one replay model, and (5) signs `MsgSubmitVerdict`.
It fetches only what it cannot rebuild: segment 0's start comes from G_n and the host's carried
optimizer state (fetched at most once per host, then derived from its own replays), and in bitwise
mode the Δ comes from its own replay of the last segment; it keeps and serves the Δs it derived.
A blob that is missing before the reveal deadline is retried later, not held against the host.
Nothing a host sends can stop the loop: every failure becomes a reason code or a log line.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import httpx

from chain.client import ChainClient, ChainTimeout, TxFailed
from nodekit.blobs import BlobCatalog, BlobError, build_app
from nodekit.board import NodePhase
from nodekit.chainview import Phase, StepInfo, Stopped
from nodekit.coding import StateCoder, StateCoding
from nodekit.errorfeedback import sparse_codec
from nodekit.globalmodel import GlobalModel
from nodekit.holdings import Holdings
from nodekit.memory import release, tune_allocator
from nodekit.nextmodel import GlobalModels
from nodekit.node import NodeError, join_run, json_line
from nodekit.objects import Kind, ObjectPolicy
from nodekit.reach import Reach, reach
from nodekit.runtime import NodeRuntime, Patience
from nodekit.serve import bind_kept_port
from nodekit.store import (
    EF_GROUP,
    OPTIMIZER_GROUP,
    ContentStore,
    delta_group,
    delta_group_step,
    state_group_step,
)
from protocol.codecs import CodecError
from protocol.config import RunConfig
from protocol.messages import EnvFingerprint, MsgSubmitVerdict, Reason, Role
from replay.checkpoint import node_initial_global
from replay.data import Corpus, node_corpus
from replay.spec import DEFAULT_ALLOW_LIST, Factory, Holder, build, check_fits
from replay.step import DeviceError, State, env_fingerprint, optimizer_state, pin_device
from verifier.behaviour import VerifierBehaviour
from verifier.job import CannotVerify, Job, Judgement, OpeningData, ReplayContext
from verifier.metrics import VerifierMetrics
from verifier.node_config import VerifierConfig
from verifier.source import HttpSource
from verifier.starts import CarriedStarts
from verifier.verify import check_verifier_env, verify

__all__ = ["NodeError", "VerifierNode"]

Pending = Future["Judgement | None"]
RECOVERABLE = (httpx.HTTPError, OSError, ChainTimeout, BlobError)
"""The chain or every host unreachable (cosmpy's requests errors are OSErrors): wait, then resume."""


class _Retry(Exception):
    """Data not served yet, before the reveal deadline: judge this host again after a block."""


class VerifierNode:
    """One verifier. `run()` blocks until the run finishes, `max_outer_steps` are done, or `stop()`."""

    reach: Reach = Reach()
    """How `run()` waits for the chain and the run at start-up (`nodekit.reach`; the CLI sets it)."""

    def __init__(
        self,
        config: VerifierConfig,
        chain: ChainClient,
        *,
        behaviour: VerifierBehaviour | None = None,
        corpus: Corpus | None = None,
        allow_list: Mapping[str, Factory] = DEFAULT_ALLOW_LIST,
        log: Callable[[dict[str, Any]], None] = json_line,
        patience: Patience = Patience(blob_retries=2),
        retry_backoff: float = 0.5,
    ) -> None:
        if behaviour is None:  # adversaries live above verifier/: the CLI resolves them and passes one in
            if config.behaviour != "honest" or config.behaviour_params:
                raise NodeError(f"behaviour {config.behaviour!r} must be resolved by the caller")
            behaviour = VerifierBehaviour()
        self.config, self.chain, self.behaviour = config, chain, behaviour
        self.rt = rt = NodeRuntime(
            role="verifier", config=config, chain=chain, log=log, patience=patience, verdicts={}, submitted=0
        )
        self.name, self.address, self.dir, self.view = rt.name, rt.address, rt.dir, rt.view
        self.log, self.snapshot, self.stop = rt.log, rt.board.snapshot, rt.stop
        self.metrics = VerifierMetrics(rt.board.registry)
        rt.on_bytes = self.metrics.bytes_fetched.inc
        self._corpus, self._allow_list = corpus, allow_list
        self.retry_backoff = retry_backoff
        self.catalog = BlobCatalog()
        self._taken: set[int] = set()  # overlapped runs: steps handed to a worker
        self._workers: list[threading.Thread] = []  # ... one per step in flight
        self._lock = threading.Lock()  # pruning and following, between the loop and the follower
        rt.sweep(self.dir)  # a listen.json write a kill cut short
        app = build_app(self.catalog, rt.board.snapshot, rt.board.registry, on_sent=rt.sent)
        rt.server = self.server = bind_kept_port(app, config.listen, self.dir / "listen.json", rt.log)

    @property
    def status(self) -> dict[str, Any]:
        return self.rt.board.status

    @property
    def url(self) -> str:
        return self.rt.url

    # ---------------------------------------------------------------- start-up

    def _setup(self) -> None:
        run = self.view.run()
        self.cfg = RunConfig.model_validate(run.config)
        try:
            device = pin_device(self.config.threads, self.config.device)
        except DeviceError as e:
            raise NodeError(str(e)) from e
        self.env: EnvFingerprint = env_fingerprint(self.config.threads)
        self.log("environment", device=str(device), replay_class=self.env.replay_class)
        check_fits(  # before any allocation: a model this machine cannot hold is refused in one line
            self.cfg, device, Holder.VERIFIER, workers=self.config.workers, allow_list=self._allow_list
        )
        self.corpus = (
            self._corpus
            if self._corpus is not None
            else node_corpus(self.cfg, self.config.dataset_source, self.dir)
        )
        if self.corpus.manifest_hash != self.cfg.dataset_manifest_hash:
            raise NodeError(f"local dataset {self.corpus.manifest_hash[:12]} is not the run's")
        workers = self.config.workers
        # Replay models are built when a worker first needs one (at most `workers`): a verifier
        # judging one host at a time holds one model, not `max_concurrent` of them.
        self._contexts: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self._device = device
        self._built = 1
        self._build_lock = threading.Lock()
        first = self._replay_model()
        self._contexts.put(first)
        model = first[0]
        c = self.cfg.state_chunk_bytes
        self.objects = ObjectPolicy.of(model, self.cfg)  # exact sizes of everything we fetch
        self.content = ContentStore(self.dir / "store", c)
        self.rt.swept(self.content.sweep())  # what a kill left half-written (part files), before any fetch
        self.catalog.chunk_bytes = c
        self.holdings = Holdings(self.content, self.catalog, self.log)
        self.starts = CarriedStarts(self.view, self.cfg, self.content, self.holdings, self._serve)
        layout = {n: tuple(p.shape) for n, p in model.named_parameters()}
        self.layout = layout
        self.catalog.coder = StateCoder(self.content, self.objects.specs[Kind.STATE], layout)  # specs §8.2
        self.models = GlobalModels(
            self.rt, self.holdings, layout, self.objects, self.cfg.outer, self._holders,
            sparse=sparse_codec(self.cfg),
        )
        g0 = node_initial_global(self.cfg.initial_model_hash, model, self.config.init_checkpoint_source, c)
        if g0.hash == self.cfg.initial_model_hash:
            self.models.keep(g0, read_from_disk=True)  # held as its file: G_0 in memory goes with _setup
        self._serve_held()
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix=f"{self.name}-verify")

    def _replay_model(self) -> tuple[Any, Any]:
        built = build(self.cfg.model, self._allow_list)
        return built.module.to(self._device), built.loss_fn

    def _take_model(self) -> tuple[Any, Any]:
        """An idle replay model, or a new one while fewer than `workers` exist (else wait)."""
        try:
            return self._contexts.get_nowait()
        except queue.Empty:
            pass
        with self._build_lock:
            room = self._built < self.config.workers
            self._built += room
        return self._replay_model() if room else self._contexts.get()

    def _serve_held(self) -> None:
        """After a restart: serve again what is on disk (carried optimizer states, the opened states
        and Δs of steps not yet pruned); `_prune` and `_drop_states` withdraw them in time."""
        for h in self.content.hashes(Kind.OPTIMIZER, OPTIMIZER_GROUP):
            self._serve(Kind.OPTIMIZER, h, OPTIMIZER_GROUP)
        for h in self.content.hashes(Kind.ERROR_FEEDBACK, EF_GROUP):
            self._serve(Kind.ERROR_FEEDBACK, h, EF_GROUP)
        for group in self.content.groups():
            if state_group_step(group) is not None:  # whole states, and θ_H's parameter chunks
                for h in self.content.hashes(Kind.STATE, group) + self.content.partials(Kind.STATE, group):
                    self._serve(Kind.STATE, h, group)
            elif delta_group_step(group) is not None:
                for h in self.content.hashes(Kind.DELTA, group):
                    self._serve(Kind.DELTA, h, group)

    def _serve(self, kind: Kind, h: str, group: str) -> None:
        """Serve what we hold of a contribution (its author may go silent): opened states until the
        step is finalized (audit and dispute voters fetch them), Δs until the step after it is done,
        optimizer states while the chain names them."""
        step = state_group_step(group) if kind is Kind.STATE else delta_group_step(group)
        self.holdings.keep(kind, h, group, step)

    def _join(self) -> None:
        mine = self.behaviour.declared_class(self.env)
        me = join_run(
            self.chain, self.rt.wallet, self.config.run_id, Role.VERIFIER, self.url, self.config.stake, mine
        )
        if me is None:
            self.log("joined", run_id=self.config.run_id, stake=self.config.stake, endpoint=self.url)
        elif me.get("replay_class", "") != mine:  # the machine changed since it joined: drawn for the
            self.log("class_changed", declared=me.get("replay_class", ""), now=mine)  # old class

    def _holders(self) -> list[str]:
        """Who may hold a run object besides its author: every host, then the other verifiers."""
        return self.view.endpoints(Role.HOST) + self.view.endpoints(Role.VERIFIER, exclude=self.address)

    # ---------------------------------------------------------------- the loop

    def run(self, max_outer_steps: int | None = None, *, linger: bool = False) -> None:
        """Survives the chain or a host going away: the step is re-read and resumed when it is back.
        With `linger`, keep serving (the Δs and states it holds) after the run ends, until `stop()`."""
        tune_allocator()  # freed tensors go back to the OS: peak RSS is the peak, not the sum of phases
        self.rt.start()
        done = failures = 0
        ready = False
        try:
            reach(self.chain, self.config.run_id, self.reach, log=self.log, stop=self.view.stop)
            while max_outer_steps is None or done < max_outer_steps:
                try:
                    if not ready:
                        self._setup()
                        ready = True
                    self._join()
                    run = self.view.run()
                    if not run.active:
                        self.log("run_finished", outer_step=run.current_step)
                        break
                    if run.overlapped:
                        done, failures = done + self._overlapped_step(run), 0
                        continue
                    self.outer_step(run.current_step)
                    done, failures = done + 1, 0
                except RECOVERABLE as e:  # resumable: assignments already judged are not listed again
                    failures += 1
                    self.log("interrupted", error=f"{type(e).__name__}: {e}", retry=failures)
                    if self.view.stop.wait(min(self.retry_backoff * 2 ** (failures - 1), 10.0)):
                        raise Stopped from None
            self.rt.set(phase=NodePhase.DONE)
            for worker in self._workers:
                worker.join()
            if linger:
                self.log("lingering", url=self.url)
                self.view.wait_height(sys.maxsize)
        except Stopped:
            self.log("stopped")
        finally:
            self.view.stop.set()
            for worker in self._workers:
                worker.join()
            if hasattr(self, "pool"):
                self.pool.shutdown(wait=True, cancel_futures=True)
            self.rt.close()

    def outer_step(self, n: int) -> None:
        """The protocol script for outer step n: (fetch → check → replay → verdict) for every
        contribution assigned to us, then follow G to G_{n+1}."""
        self._verify_phase(n)
        self.rt.set(phase=NodePhase.FOLLOWING)
        self._follow(n)

    def _overlapped_step(self, run: Any) -> int:
        """Overlapped runs (specs §2.2.1): each step in flight gets a worker of its own that verifies
        it (as soon as it is challenged) and follows its result, so step n+1's reveals are judged
        while step n is still in its escalation, audit or result rounds. Returns 1 once a step was
        taken, 0 after waiting for the next one to open."""
        for n in run.steps_in_flight:
            if n in self._taken:
                continue
            self._taken.add(n)

            def work(n: int = n) -> None:
                failures = 0
                while True:
                    try:
                        self.outer_step(n)
                        return
                    except Stopped:
                        return
                    except RECOVERABLE as e:  # as the sequential loop: wait, then resume the step
                        failures += 1
                        error = f"{type(e).__name__}: {e}"
                        self.log("interrupted", outer_step=n, error=error, retry=failures)
                        if self.view.stop.wait(min(self.retry_backoff * 2 ** (failures - 1), 10.0)):
                            return

            self._workers = [t for t in self._workers if t.is_alive()]
            self._workers.append(self.rt.spawn(f"{self.name}-step-{n}", work))
            return 1
        newest = max(self._taken, default=-1)
        self.view.wait_run(lambda r: not r.active or r.current_step > newest)
        return 0

    def _verify_phase(self, n: int) -> None:
        """Wait for step n's challenge, then judge every contribution assigned to us."""
        self.rt.set(outer_step=n, phase=NodePhase.WAITING)
        info = self.view.step(n)
        h = self.chain.height()
        while info.challenge_seed is None and not info.phase.finalized:
            h = self.view.next_block(max(h, info.height))
            info = self.view.step(n)
        if self.behaviour.online() and not info.phase.finalized:
            self.rt.set(phase=NodePhase.VERIFYING)
            self._verify_step(n, info)
            self._drop_states(n)  # finalized: no audit or dispute can ask for them any more

    def _verify_step(self, n: int, info: StepInfo) -> None:
        gm = self.models.get(info.base_model_hash)
        settled: set[tuple[str, bool]] = set()  # (host, a revote: a windowed dispute's second check)
        deferred: dict[str, int] = {}  # host -> height at which its data was not yet served
        running: dict[Pending, tuple[str, float, bool]] = {}  # -> (host, started, a revote)
        h = info.height
        while True:
            info = self.view.step(n)
            if info.finalized_height is not None or info.phase.finalized:
                break
            assigned = self.view.assignments(self.address, n)
            busy = {host for host, _, _ in running.values()}
            owed = self.view.revotes_owed(n, self.address) if assigned else set()
            for host in assigned:
                if (host, host in owed) in settled or host in busy or deferred.get(host, -1) >= info.height:
                    continue
                job = self._job(n, host, info)
                if job is not None:
                    started = (host, time.perf_counter(), host in owed)
                    running[self.pool.submit(self._judge, job, gm)] = started
            if running:  # wait for work, not for blocks: the chain may be waiting on us
                finished, _ = wait(list(running), timeout=self.view.poll_timeout, return_when=FIRST_COMPLETED)
                ready: list[tuple[str, Judgement, float]] = []
                for fut in finished:
                    host, t0, revote = running.pop(fut)
                    try:
                        out = self._outcome(n, host, fut, info)
                    except _Retry:
                        deferred[host] = info.height
                        continue
                    settled.add((host, revote))
                    if out is not None:
                        ready.append((host, out, time.perf_counter() - t0))
                if ready:
                    self._submit(n, ready)
            else:
                h = self.view.next_block(max(h, info.height))

    def _job(self, n: int, host: str, info: StepInfo) -> Job | None:
        """The job once the host revealed; once reveals close (deadline and grace), a job with
        nothing opened."""
        c = self.view.commitment(host, n)
        if c is None:
            return None
        reveal = self.view.reveal(host, n)
        if reveal is None and info.height <= info.reveal_closes:
            return None
        segments = self.view.segments(host, n) or []
        checks = self.view.checks(host, n, self.address, self.cfg)
        opened = tuple(  # the chain checked each pair proof at reveal and keeps only the leaves
            OpeningData(o["segment"], o["start_leaf"], o["end_leaf"], tuple(o.get("proof") or ()) or None)
            for o in (reveal["openings"] if reveal else [])
        )
        start = self.starts.names(host, n)
        return Job(
            run_id=self.config.run_id, outer_step=n, host=host, cfg=self.cfg,
            trajectory_root=c["trajectory_root"], leaf_count=c["leaf_count"], delta_hash=c["delta_hash"],
            final_optimizer_hash=c["final_optimizer_hash"], tokens=c["tokens"],
            env=EnvFingerprint.model_validate(c["env"]), sampled=tuple(segments), openings=opened,
            prev_optimizer_hash=start.optimizer_hash, parent_delta_hash=start.parent_delta_hash,
            final_ef_hash=c.get("final_ef_hash"), start_ef_hash=start.ef_hash,
            window=None if checks is None else tuple(checks.segments),
            delta_first=checks is not None and checks.panel,
        )  # fmt: skip

    def _judge(self, job: Job, gm: GlobalModel) -> Judgement | None:
        """Runs on a pool worker with that worker's own model; the behaviour decides what to report."""
        model, loss_fn = self._take_model()
        try:
            holders = self.view.holders(job.outer_step, exclude=self.address).get(job.host, [])

            def fetched(report: Any) -> None:
                self.log("fetched", outer_step=job.outer_step, host=job.host, **self.rt.board.fetched(report))

            # the author first, then the verifiers that checked it before us: a host that goes silent
            # after its first verdicts cannot keep its auditors and dispute panel from the data
            keep_deltas = {}
            if job.parent_delta_hash is not None:  # eager: the parent Δ's holders are step n − 1's
                parents = self.view.holders(job.outer_step - 1, exclude=self.address).get(job.host, [])
                holders = list(dict.fromkeys([*holders, *parents]))
                keep_deltas[job.parent_delta_hash] = delta_group(job.outer_step - 1)
            # its author is spared: a dispute panel fetches θ_H's parameters from each other, so
            # it uploads them about once (specs §8.1)
            author = self.view.participant(job.host)
            # and states come coded against G_n where a holder codes (specs §8.2)
            coding = StateCoding.of(self.content, gm.hash, self.objects.specs[Kind.STATE], self.layout)
            source = HttpSource(self.rt.blobs, holders, self.objects, self.content, on_fetched=fetched,
                                group=str(job.outer_step), keep=self._serve, keep_deltas=keep_deltas,
                                spare=[author.endpoint] if author is not None else [],
                                coding=coding)  # fmt: skip

            def derived(final: State | None, payload: bytes) -> None:
                self._keep_derived(job, final, payload)

            ctx = ReplayContext(
                model, loss_fn, self.corpus, gm.params, self._replayed, on_derived=derived,
                global_momentum=gm.momentum, ef_sink=self.starts.ef_sink,
            )  # fmt: skip

            def check() -> Judgement:
                check_verifier_env(job, self.env)
                return verify(job, source, ctx)

            with self.metrics.in_flight.track_inprogress():
                return self.behaviour.decide(job, check)
        finally:
            for p in model.parameters():  # an idle replay model keeps its weights, not its last
                p.grad = None  # gradients (4 B/param beside aggregation; the next replay makes new ones)
            self._contexts.put((model, loss_fn))

    def _replayed(self, steps: int) -> None:
        """Inner steps replayed (the metric, and `/status` `replayed_steps` for the traffic table)."""
        self.metrics.replay_steps.inc(steps)
        self.rt.board.update("replayed_steps", lambda x: (x or 0) + steps)

    def _keep_derived(self, job: Job, final: State | None, payload: bytes) -> None:
        """What an accepting check leaves us (bitwise: our own replay; tolerance: the claimed end and
        the Δ we downloaded, both checked): the host's next start optimizer state when we replayed
        its last segment (so next step we need not fetch it, and anyone rebuilding its segment 0
        can fetch it from us) and its Δ payload, which we serve to everyone who aggregates,
        whatever its author does."""
        if final is not None:
            self.holdings.put_tensors(Kind.OPTIMIZER, optimizer_state(final), OPTIMIZER_GROUP)
        self.holdings.put_bytes(Kind.DELTA, payload, delta_group(job.outer_step), job.outer_step)

    def _outcome(self, n: int, host: str, fut: Pending, info: StepInfo) -> Judgement | None:
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
        early = self.chain.height() <= info.reveal_closes
        if out is not None and out.reason is Reason.MISSING_DATA and early:
            self.log("data_not_yet_served", outer_step=n, host=host, detail=out.detail)
            raise _Retry
        return out

    def _submit(self, n: int, ready: list[tuple[str, Judgement, float]]) -> None:
        """All finished verdicts in one tx (one block, one fee); one by one if the batch is refused,
        so a contribution decided meanwhile does not cost the others their verdicts."""
        msgs = [
            MsgSubmitVerdict(creator=self.address, run_id=self.config.run_id, outer_step=n, host=host,
                             reason=out.reason, evidence_hash=out.evidence_hash, detail=out.detail)
            for host, out, _ in ready
        ]  # fmt: skip
        try:
            self.rt.broadcast(msgs)
            sent = ready
        except TxFailed as e:
            if len(msgs) == 1:
                self.log("verdict_refused", outer_step=n, host=ready[0][0], error=e.log)
                return
            sent = []
            for item, msg in zip(ready, msgs, strict=True):
                try:
                    self.rt.broadcast([msg])
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
            self.rt.board.update("verdicts", lambda v, k=f"{n}:{host}", r=out.reason.name: {**v, k: r})
            self.rt.board.update("submitted", lambda x: x + 1)
            self.log("verdict", outer_step=n, host=host, reason=out.reason.name, detail=out.detail,
                     replay_steps=out.replay_steps,
                     evidence=out.evidence_hash, seconds=round(seconds, 3))  # fmt: skip

    # ---------------------------------------------------------------- following G

    def _follow(self, n: int) -> None:
        """Compute G_{n+1} ourselves from the accepted Δs once step n is done (fetch it if that fails)."""
        info = self.view.step(n)
        h = self.chain.height()
        while info.phase is not Phase.DONE:
            h = self.view.next_block(max(h, info.height))
            info = self.view.step(n)
        base = info.apply_to_hash or info.base_model_hash  # overlapped runs: the previous result
        target = info.result_hash or base
        if not self.models.has(target):
            try:
                _, accepted = self.view.accepted(n)
                new = self.models.next_model(n, self.models.get(base), accepted)
                if new is not None and new.hash == target:
                    self.models.keep(new, read_from_disk=True)
                    del new  # G_{n+1}'s 8 B/param go now: read from disk when used
                    release()
                    self.log("outer_step_applied", outer_step=n, model_hash=target)
                else:
                    if new is not None:
                        self.log("outer_step_differs", outer_step=n, mine=new.hash, chain=target)
                    self.models.get(target)
            except (BlobError, CodecError, ValueError, OSError) as e:
                self.log("outer_step_unavailable", outer_step=n, error=f"{type(e).__name__}: {e}")
                self.models.get(target)
        with self._lock:
            self._prune(n)

    def _drop_states(self, before: int) -> None:
        """The opened states of finalized steps (< `before` + 1) go: only audits and disputes need them."""
        self.holdings.withdraw_before(Kind.STATE, before + 1)
        self.holdings.drop_groups(state_group_step, before + 1)

    def _prune(self, n: int) -> None:
        """Keep the Δs of steps n and n−1 (late aggregators fetch them from us), the optimizer states
        the chain still names, and the last two global models; no opened state of step n or before."""
        self._drop_states(n)
        self.holdings.withdraw_before(Kind.DELTA, n - 1)
        self.holdings.drop_groups(delta_group_step, n - 1)
        hosts = [p.address for p in self.view.participants() if p.role == Role.HOST.value]
        run = self.view.run()
        self.starts.prune(hosts, n, run.overlapped)
        keep = [self.view.step(n).base_model_hash, run.global_model_hash]
        keep += [self.view.step(m).base_model_hash for m in run.steps_in_flight]
        self.models.prune(keep)
