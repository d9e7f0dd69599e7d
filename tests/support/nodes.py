"""The shared harness of the node tests: `LockstepChain` produces a block only when every node
thread is blocked on the chain, so phases advance exactly as fast as the nodes work (no
wall-clock block timer, no sleeps); runs, host and verifier configs and nodes to put on it; a
node whose worker threads count as chain actors (`counted`, `host`); a host crashed at a logged
event (`crash_on`) and its commits counted (`commit_count`); and runs of named (honest or
adversarial) hosts and verifiers with what a test reads back (`start`, `nodes`, `stakes`,
`diagnosis`).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from chain.client import ChainTimeout
from chain.inprocess import InProcessChain
from gonka_diloco.adversaries import resolve_host, resolve_verifier
from nodekit.globalmodel import GlobalModel, GlobalStore
from nodekit.runtime import Patience
from nodekit.store import ContentStore
from protocol.chunks import DEFAULT_CHUNK_BYTES
from protocol.config import Codec, ModelSpec, Phases, RunConfig, Stake, tolerance_moments
from protocol.keys import test_wallet
from protocol.messages import MsgCreateRun
from replay.data import Corpus, shakespeare_files
from replay.spec import build_model
from trainer.node import HostNode
from trainer.node_config import HostConfig, KeySource
from verifier.behaviour import VerifierBehaviour
from verifier.node import VerifierNode
from verifier.node_config import VerifierConfig

TINY = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32}
SPEC = ModelSpec(factory="trainer.model:small_gpt", config=TINY)


# ---------------------------------------------------------------- harness


class LockstepChain(InProcessChain):
    """Produces the next block only when every registered actor waits on the chain for
    something that is not there yet: the run advances as fast as its slowest node works."""

    def __init__(self, max_height: int = 3000) -> None:
        super().__init__(auto=False)
        self._actors = 0
        self._blocked: dict[object, Callable[[], Any]] = {}
        self.max_height = max_height
        self._pause_at: int | None = None

    def hold(self) -> None:
        """Count one more actor that never waits: no block is produced until `release`."""
        with self._cond:
            self._actors += 1

    def release(self) -> None:
        with self._cond:
            self._actors -= 1
            self._maybe_produce()

    def run_until(self, height: int, timeout: float = 60.0) -> None:
        """Give up one held slot until the others, in lockstep, reach `height`; then hold again."""
        with self._cond:
            self._pause_at = height
            self._actors -= 1
            try:
                self._maybe_produce()
                while self.app.height < height:
                    if not self._cond.wait(timeout):
                        raise ChainTimeout(f"height {height} not reached within {timeout}s")
            finally:
                self._actors += 1
                self._pause_at = None

    def _maybe_produce(self) -> None:
        while (
            self._blocked
            and len(self._blocked) >= self._actors
            and all(r() is None for r in self._blocked.values())
            and self.app.height < self.max_height
            and (self._pause_at is None or self.app.height < self._pause_at)
        ):
            self.produce_block()

    def _wait(self, ready: Any, timeout: float, what: str) -> Any:
        key = object()
        deadline = time.monotonic() + timeout
        with self._cond:
            try:
                while (value := ready()) is None:
                    self._blocked[key] = ready
                    self._maybe_produce()
                    if ready() is not None:
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._cond.wait(remaining):
                        raise ChainTimeout(f"{what} within {timeout}s")
                return value
            finally:
                self._blocked.pop(key, None)

QUICK_HOST = Patience(poll_timeout=0.5)
"""A test host polls the in-process chain every half second (a real node waits up to 10 s)."""
QUICK_VERIFIER = Patience(poll_timeout=0.5, blob_retries=2)
"""A test verifier likewise, with the verifier's own retries."""
IMPATIENT = Patience(poll_timeout=0.5, blob_retries=0, blob_backoff=0)
"""Nodes beside adversaries that withhold or stall: one try per blob, so a test sees the outcome soon."""
IMPATIENT_VERIFIER = Patience(poll_timeout=0.5, blob_timeout=5, blob_retries=0, blob_backoff=0)
"""Their verifiers: also a short fixed deadline per transfer."""


def tiny_corpus() -> Corpus:
    """60 kB of one play: structured enough that a tiny GPT's loss visibly falls in a few steps."""
    _, files = shakespeare_files()
    data = files[0].read_bytes()[:60_000]
    cut = 54_000
    as_t = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8)  # noqa: E731
    return Corpus(as_t(data[:cut]), as_t(data[cut:]), hashlib.sha256(data).hexdigest())


def run_config(corpus: Corpus, **kw: Any) -> RunConfig:
    g0 = GlobalModel.from_module(build_model(SPEC), kw.get("state_chunk_bytes", DEFAULT_CHUNK_BYTES))
    base: dict[str, Any] = dict(
        model=SPEC,
        dataset_manifest_hash=corpus.manifest_hash,
        initial_model_hash=g0.hash,
        batch_size=4,
        seq_len=32,
        inner_steps=10,
        segment_len=5,
        sampled_segments=1,
        verifiers_per_contribution=1,  # one replay per contribution; the security tests raise both
        audit_bps=0,
        data_shards=3,
        codec=Codec.INT8,
        inner={"lr": 1e-3},
        threads=1,
        phases=Phases(
            join_blocks=3,
            train_blocks=3,
            reveal_blocks=3,
            verify_blocks=3,
            escalation_blocks=2,
            result_blocks=3,
            epoch_length=1000,
            poc_window=0,
        ),
        stake=Stake(min_host_stake=10, min_verifier_stake=10),
    )
    # tolerance mode: fp32 moments unless the test names them (the default, int8, is refused there)
    return RunConfig(**tolerance_moments({**base, **kw}))


chain_of: dict[int, InProcessChain] = {}
"""run id -> the chain of the test that created it (tests create one run per chain)."""


def create_run(chain: InProcessChain, cfg: RunConfig) -> int:
    authority = test_wallet(0)
    chain.broadcast(authority, [MsgCreateRun(creator=str(authority.address()), config=cfg)])
    run_id = max(chain.state.runs)
    chain_of[run_id] = chain
    return run_id


def host_config(tmp: Path, index: int, run_id: int, **kw: Any) -> HostConfig:
    return HostConfig(
        chain_url="http://in-process",
        run_id=run_id,
        data_dir=str(tmp / f"host-{index}"),
        stake=1000,
        key=KeySource(test_index=index),
        **kw,
    )


def verifier_node(tmp: Path, index: int, run_id: int, corpus: Corpus) -> VerifierNode:
    """The real verifier node (fetch, proofs, start state, bitwise replay, Δ), honest."""
    cfg = VerifierConfig(
        chain_url="http://in-process",
        run_id=run_id,
        data_dir=str(tmp / f"verifier-{index}"),
        stake=1000,
        key={"test_index": index},
        max_concurrent=1,
    )
    return VerifierNode(
        cfg,
        chain_of[run_id],
        behaviour=VerifierBehaviour(),
        corpus=corpus,
        log=lambda e: None,
        patience=QUICK_VERIFIER,
    )


def verdicts(chain: InProcessChain, run_id: int, steps: int) -> list[tuple[int, str, int]]:
    """(outer step, host, reason) of every verdict on chain."""
    out = []
    for n in range(steps):
        for v in chain.query("verdicts", run_id=run_id, step=n)["verdicts"]:
            out.append((n, v["host"], v["reason"]))
    return sorted(out)


def then_stop(fn: Callable[[], None], nodes: list[Any]) -> Callable[[], None]:
    """Run `fn` (a verifier), then stop `nodes` (hosts lingering so it can still fetch from them)."""

    def go() -> None:
        try:
            fn()
        finally:
            for node in nodes:
                node.stop()

    return go


@contextmanager
def running(targets: list[Callable[[], None]], chain: LockstepChain) -> Iterator[list[threading.Thread]]:
    """Run each target in a thread that counts as a chain actor from before it starts (so no
    block slips past it) until it ends; always joined, and its exception re-raised here."""
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def go() -> None:
            try:
                fn()
            except BaseException as e:  # surfaced in the test thread below
                errors.append(e)
            finally:
                chain.release()

        return go

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for t in threads:
        chain.hold()
        t.start()
    try:
        yield threads
    finally:
        for t in threads:
            t.join(120)
    assert not [t for t in threads if t.is_alive()], "a node thread did not stop"
    if errors:
        raise errors[0]


def node_globals(node_dir: Path) -> GlobalStore:
    """A node's global models, as `HostNode`/`VerifierNode` keep them (default chunk size)."""
    return GlobalStore(ContentStore(node_dir / "store"))


STAKE = 1000
"""A verifier's bond in the node tests (ngonka)."""


def verifier_config(tmp: Path, index: int, run_id: int, **kw: Any) -> VerifierConfig:
    return VerifierConfig(
        chain_url="http://in-process", run_id=run_id, data_dir=str(tmp / f"verifier-{index}"), stake=STAKE,
        key=KeySource(test_index=index), **kw,
    )  # fmt: skip


# ---------------------------------------------------------------- worker threads, crashes


def counted(chain: LockstepChain, node: Any) -> Any:
    """Make the node's worker threads chain actors too: no block while one of them works."""
    spawn = node.rt.spawn

    def _spawn(name: str, fn: Callable[[], None]) -> Any:
        chain.hold()

        def go() -> None:
            try:
                fn()
            finally:
                chain.release()

        return spawn(name, go)

    node.rt.spawn = _spawn
    return node


def host(tmp: Path, i: int, run_id: int, chain: LockstepChain, corpus: Any, **kw: Any) -> HostNode:
    kw.setdefault("log", lambda e: None)
    """A test host (quick, silent unless `log` is given) whose worker threads are chain actors."""
    return counted(
        chain, HostNode(host_config(tmp, i, run_id), chain, corpus=corpus, patience=QUICK_HOST, **kw)
    )


def commit_count(chain: LockstepChain, address: str) -> int:
    """Commit messages from `address` that made it into blocks (successful or not): a restarted
    host's tests count them to show it did not commit again."""
    return sum(
        1
        for b in chain.blocks
        for tx in b.txs
        for e in tx.events
        if e.type == "commit" and e.attributes.get("host") == address
    )


def crash_on(node: HostNode, chain: LockstepChain, event: str, step: int) -> Any:
    """A log sink that, at `event` of outer step `step`, holds the chain and stops the node: the
    restart tests' crash, at an exact point of the step with the chain still while it is down."""

    def sink(e: dict[str, Any]) -> None:
        node_logs.append(e)
        if e["event"] == event and e.get("outer_step") == step and not crashed.is_set():
            crashed.set()
            chain.hold()
            node.stop()

    node_logs: list[dict[str, Any]] = []
    crashed = threading.Event()
    sink.logs = node_logs  # type: ignore[attr-defined]
    return sink


# ---------------------------------------------------------------- named hosts and verifiers


def start(
    tmp: Path, chain: LockstepChain, cfg: RunConfig, hosts: dict[int, str], verifiers: dict[int, str],
    logs: list[dict[str, Any]], host_kwargs: dict[str, Any] | None = None,
) -> tuple[int, dict[int, HostNode], dict[int, VerifierNode]]:  # fmt: skip
    """Create the run and, by index, hosts and verifiers of the named behaviours (impatient,
    logging to `logs`); nothing runs yet (`nodes` gives their run loops)."""
    run_id = create_run(chain, cfg)
    kwargs = {"patience": IMPATIENT, **(host_kwargs or {})}
    corpus = tiny_corpus()
    h = {
        i: HostNode(host_config(tmp, i, run_id), chain, corpus=corpus, behaviour=resolve_host(name),
                    log=logs.append, **kwargs)
        for i, name in hosts.items()
    }  # fmt: skip
    v = {
        i: VerifierNode(verifier_config(tmp, i, run_id), chain, corpus=corpus,
                        behaviour=resolve_verifier(name), log=logs.append, patience=IMPATIENT_VERIFIER)
        for i, name in verifiers.items()
    }  # fmt: skip
    return run_id, h, v


def nodes(hosts: dict[int, HostNode], verifiers: dict[int, VerifierNode]) -> list[Callable[[], None]]:
    """The nodes' run loops: the hosts linger (serving the Δs and G they hold) until the last
    verifier has followed the step, so a node slowed by the machine's load still finds every
    holder of a Δ up (the run ending does not race the fetches the test counts)."""
    left = [len(verifiers)]
    lock = threading.Lock()

    def verifier(v: VerifierNode) -> Callable[[], None]:
        def go() -> None:
            try:
                v.run()
            finally:
                with lock:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    for h in hosts.values():
                        h.stop()

        return go

    return [lambda h=h: h.run(linger=True) for h in hosts.values()] + [
        verifier(v) for v in verifiers.values()
    ]


def stakes(chain: InProcessChain, run_id: int) -> dict[str, int]:
    """Each participant's bond now (ngonka), by address."""
    return {p["address"]: p["stake"] for p in chain.query("participants", run_id=run_id)["participants"]}


def diagnosis(step: dict[str, Any], addr: dict[int, str], logs: list[dict[str, Any]]) -> str:
    """What the verifiers did about, and the nodes themselves logged, for each host whose outcome
    is not the expected one (a failure in CI is read from this message alone)."""
    who = {a: i for i, a in addr.items()}
    odd = {a for a, o in step["outcomes"].items() if o != "accepted"}
    nodes = {f"host-{who[a]}" for a in odd}
    kinds = {"verdict", "abstain", "verify_error", "data_not_yet_served", "verdict_refused", "interrupted"}
    about = [e for e in logs if e["event"] in kinds and e.get("host") in odd]
    own = [e for e in logs if e.get("node") in nodes and e["event"] != "fetched"]
    outcomes = {who[a]: o for a, o in step["outcomes"].items()}
    mine = [e for e in logs if e.get("node", "").startswith("verifier") and e["event"] != "fetched"]
    return f"outcomes {outcomes}, verifiers {about}, own {own}, step {step}, verifier logs {mine}"
