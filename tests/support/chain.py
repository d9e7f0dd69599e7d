"""The chain tests' harness: named accounts, a run config, a genesis state, `Sim` (a chain state
driven message by message and block by block), builders for the protocol's messages, a run with a
sealed step and a live one (`history`) and every one-field change to a state's JSON (`mutations`,
`apply_mutation`) for the app-hash and persistence tests and, for the overlapped schedule's two
steps in flight, helpers that name the outer step they act on."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cosmpy.crypto.address import Address

from chain import queries
from chain.errors import ChainError
from chain.genesis import Genesis, genesis_state
from chain.module import BlockContext, Event, TxContext, begin_block, end_block, process_msg
from chain.params import ZERO_HASH, ModuleParams, Phase
from chain.state import ChainState, app_hash, state_to_json
from protocol import merkle
from protocol.config import Codec, ModelSpec, Phases, RunConfig, Stake, tolerance_moments
from protocol.messages import (
    EnvFingerprint,
    MsgCommitPseudoGradient,
    MsgCreateRun,
    MsgJoinRun,
    MsgRevealContribution,
    MsgSubmitOuterResult,
    MsgSubmitVerdict,
    Reason,
    Role,
    SegmentOpening,
)

GNK = 1_000_000_000


def addr(name: str) -> str:
    return str(Address(hashlib.sha256(name.encode()).digest()[:20], prefix="gonka"))


def h32(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


AUTH = addr("authority")
HOSTS = [addr(f"host{i}") for i in range(4)]
VERIFIERS = sorted(addr(f"verifier{i}") for i in range(4))
STRANGER = addr("stranger")
POOR = addr("poor")


def make_config(**overrides: object) -> RunConfig:
    phases = {
        "join_blocks": 1,
        "train_blocks": 3,
        "reveal_blocks": 6,
        "verify_blocks": 6,
        "escalation_blocks": 4,
        "max_escalations": 1,
        "result_blocks": 5,
        "epoch_length": 1000,
        "poc_window": 0,
    }
    phases.update(overrides.pop("phases", {}))  # type: ignore[arg-type]
    base = {
        "model": ModelSpec(factory="trainer.model:tiny", config={"param_count": 1000}),  # declared (§2.4)
        "dataset_manifest_hash": h32("data"),
        "initial_model_hash": h32("g0"),
        "inner_steps": 4,
        "segment_len": 2,
        "sampled_segments": 1,
        "verifiers_per_contribution": 1,
        "audit_bps": 0,  # tests of the audit set it
        "audit_verifiers": 1,
        "batch_size": 2,
        "seq_len": 8,
        "phases": Phases(**phases),
        "stake": Stake(min_host_stake=10 * GNK, min_verifier_stake=5 * GNK, reward_per_outer_step=100 * GNK),
    }
    base.update(overrides)
    # tolerance mode: fp32 moments unless the test names them (the default, int8, is refused there)
    return RunConfig(**tolerance_moments(base))  # type: ignore[arg-type]


def make_state(params: ModuleParams | None = None) -> ChainState:
    funded = {a: 1000 * GNK for a in [AUTH, *HOSTS, *VERIFIERS, STRANGER]} | {POOR: GNK}
    return genesis_state(
        Genesis(authority=AUTH, accounts=funded, reward_pool=10_000 * GNK, params=params or ModuleParams())
    )


@dataclass
class Sim:
    """A block driver: each `block` runs begin_block, the messages in order, end_block."""

    state: ChainState
    height: int = 0
    prev_hash: str = ZERO_HASH
    events: list[Event] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)  # block hashes, block 1 first

    def block(self, *msgs: object) -> list[list[Event] | ChainError]:
        h = self.height + 1
        bctx = BlockContext(height=h, time_ns=h, prev_block_hash=self.prev_hash)
        self.events += begin_block(self.state, bctx)
        results: list[list[Event] | ChainError] = []
        for i, msg in enumerate(msgs):
            ctx = TxContext(height=h, time_ns=h, tx_hash=h32("tx", h, i), signer=msg.creator)  # type: ignore[attr-defined]
            before = state_to_json(self.state)
            try:
                results.append(process_msg(self.state, msg, ctx))
            except ChainError as e:
                assert state_to_json(self.state) == before, f"{e.name} wrote to the state"
                results.append(e)
        self.events += end_block(self.state, bctx)
        self.height = h
        digest = app_hash(self.state)
        assert digest == app_hash(self.state, cached=False), "a write to the state skipped `touched`"
        self.prev_hash = h32("block", h, digest.hex())
        self.hashes.append(self.prev_hash)
        return results

    def ok(self, msg: object) -> list[Event]:
        (result,) = self.block(msg)
        assert not isinstance(result, ChainError), str(result)
        return result

    def fails(self, msg: object, error: type[ChainError]) -> ChainError:
        (result,) = self.block(msg)
        assert isinstance(result, error), f"expected {error.__name__}, got {result}"
        return result

    def until(self, height: int) -> None:
        """Run empty blocks so that the next `block` call is at `height`."""
        while self.height < height - 1:
            self.block()

    def step(self, run_id: int = 1) -> dict:
        return queries.outer_step(self.state, run_id)


# ---------------------------------------------------------------- message builders


def leaves_of(host: str, step: int, n: int = 3, salt: str = "") -> list[bytes]:
    return [hashlib.sha256(f"{host}:{step}:{i}:{salt}".encode()).digest() for i in range(n)]


def commit_msg(host: str, step: int = 0, base: str | None = None, salt: str = "", **kw: object):
    config = make_config()
    fields = {
        "creator": host,
        "run_id": 1,
        "outer_step": step,
        "base_model_hash": base or h32("g0"),
        "trajectory_root": merkle.merkle_root(leaves_of(host, step, salt=salt)).hex(),
        "leaf_count": 3,
        "delta_hash": h32("delta", host, step, salt),
        "final_optimizer_hash": h32("opt", host, step),
        "codec": Codec.INT8,
        "tokens": config.tokens_per_outer_step,
        "env": EnvFingerprint(torch_version="2.13.0", threads=1),
    }
    fields.update(kw)
    return MsgCommitPseudoGradient(**fields)  # type: ignore[arg-type]


def reveal_msg(sim: Sim, host: str, step: int = 0, segments: list[int] | None = None, salt: str = ""):
    leaves = leaves_of(host, step, salt=salt)
    if segments is None:
        segments = queries.commitment(sim.state, 1, host) and next(
            c["segments"] for c in queries.challenges(sim.state, 1)["challenges"] if c["host"] == host
        )
    openings = [
        SegmentOpening(
            segment=j,
            start_leaf=leaves[j].hex(),
            end_leaf=leaves[j + 1].hex(),
            proof=[p.hex() for p in merkle.pair_proof(leaves, j)],
        )
        for j in segments  # type: ignore[union-attr]
    ]
    return MsgRevealContribution(creator=host, run_id=1, outer_step=step, openings=openings)


def verdict_msg(verifier: str, host: str, reason: Reason = Reason.ACCEPT, step: int = 0):
    return MsgSubmitVerdict(
        creator=verifier,
        run_id=1,
        outer_step=step,
        host=host,
        reason=reason,
        evidence_hash=h32("ev", verifier),
    )


def join(role: Role, who: str, stake: int | None = None, run_id: int = 1) -> MsgJoinRun:
    default = 10 * GNK if role is Role.HOST else 5 * GNK
    return MsgJoinRun(
        creator=who, run_id=run_id, role=role, endpoint=f"http://127.0.0.1/{who[-6:]}", stake=stake or default
    )


def started(
    config: RunConfig | None = None, hosts: list[str] = HOSTS[:2], verifiers: list[str] = VERIFIERS[:3]
) -> Sim:
    """A run with bonded hosts and verifiers, at the first block of the training phase (never before
    height 3). They bond in the block that creates the run, so their stake has served the bonding
    delay (specs §2.3) by the earliest challenge, height 5 (an early-closed one-block train window)."""
    sim = Sim(make_state())
    joins = [join(Role.HOST, h) for h in hosts] + [join(Role.VERIFIER, v) for v in verifiers]
    results = sim.block(MsgCreateRun(creator=AUTH, config=config or make_config()), *joins)
    assert not any(isinstance(r, ChainError) for r in results)
    sim.until(max(3, sim.step()["train_start"]))
    return sim


def to_reveal(sim: Sim, hosts: list[str]) -> None:
    """Commit for `hosts` now, then run to the challenge block."""
    assert all(not isinstance(r, ChainError) for r in sim.block(*[commit_msg(h) for h in hosts]))
    sim.until(sim.step()["challenge_height"] + 1)
    assert sim.step()["phase"] == Phase.REVEAL


def to_verify_deadline(sim: Sim) -> None:
    sim.until(sim.step()["round_deadline"] + 1)


def assigned(sim: Sim, host: str) -> list[str]:
    return next(c["verifiers"] for c in queries.challenges(sim.state, 1)["challenges"] if c["host"] == host)


def stake_of(sim: Sim, who: str) -> int:
    return queries.stakes(sim.state, who)["total"]


def balance(sim: Sim, who: str) -> int:
    return queries.balance(sim.state, who)["amount"]


def vote(host: str, model: str, step: int = 0) -> MsgSubmitOuterResult:
    return MsgSubmitOuterResult(creator=host, run_id=1, outer_step=step, model_hash=h32(model))


# ---------------------------------------------------------------- a state to hash, and its every mutation


def history() -> Sim:
    """Outer step 0 finished (sealed), step 1 live with commits, a reveal and a verdict: the state
    the app-hash and row-persistence tests both mutate, so each sees cached and live digests alike."""
    sim = started()
    to_reveal(sim, HOSTS[:2])
    for host in HOSTS[:2]:
        sim.ok(reveal_msg(sim, host))
        sim.ok(verdict_msg(assigned(sim, host)[0], host))
    to_verify_deadline(sim)
    for host in HOSTS[:2]:
        sim.ok(MsgSubmitOuterResult(creator=host, run_id=1, outer_step=0, model_hash=h32("g1")))
    assert sim.state.runs[1].steps[0].phase == Phase.DONE
    sim.until(sim.step()["train_start"])
    sim.block(*[commit_msg(h, step=1, base=h32("g1")) for h in HOSTS[:2]])
    sim.until(sim.step()["challenge_height"] + 1)
    sim.ok(reveal_msg(sim, HOSTS[0], step=1))
    sim.ok(verdict_msg(assigned(sim, HOSTS[0])[0], HOSTS[0], step=1))
    return sim


def mutations(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str, Any]]:
    """Every leaf value and every dict key of the state JSON, with a changed value of the same kind:
    shared so the app hash and the persisted rows are held to the same set of changes."""
    if isinstance(node, dict):
        for key, value in node.items():
            new_key = str(int(key) + 100) if key.isdigit() else key + "x"
            yield path, "key", (key, new_key)
            yield from mutations(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from mutations(value, (*path, i))
    elif isinstance(node, bool):
        yield path, "value", not node
    elif isinstance(node, int):
        yield path, "value", node + 1
    elif isinstance(node, str):
        yield path, "value", node + "0"
    elif node is None:
        yield path, "value", 7


def apply_mutation(tree: Any, path: tuple[Any, ...], kind: str, change: Any) -> Any:
    """A copy of `tree` with one change from `mutations` made: shared with it, as its inverse reader."""
    tree = json.loads(json.dumps(tree))
    parent = tree
    for part in path[:-1] if kind == "value" else path:
        parent = parent[part]
    if kind == "value":
        parent[path[-1]] = change
    else:
        old, new = change
        parent[new] = parent.pop(old)
    return tree


# ---------------------------------------------------------------- overlapped steps (one step by index)


def step_of(sim: Sim, index: int) -> dict:
    return queries.outer_step(sim.state, 1, index)


def ok_block(sim: Sim, *msgs: object) -> None:
    results = sim.block(*msgs)
    bad = [r for r in results if isinstance(r, ChainError)]
    assert not bad, bad


def reveal_for(sim: Sim, host: str, step: int) -> object:
    segs = next(
        c["segments"] for c in queries.challenges(sim.state, 1, step)["challenges"] if c["host"] == host
    )
    return reveal_msg(sim, host, step=step, segments=segs)


def verdicts_for(sim: Sim, step: int, reasons: dict[str, Reason] | None = None) -> list[object]:
    """Every assigned verifier's verdict on every contribution of `step` (ACCEPT unless told)."""
    reasons = reasons or {}
    msgs = []
    for v in VERIFIERS:
        for host in queries.assignments(sim.state, 1, v, step)["hosts"]:
            msgs.append(verdict_msg(v, host, reasons.get(host, Reason.ACCEPT), step=step))
    return msgs


def until_phase(sim: Sim, step: int, phase: Phase, limit: int = 80) -> None:
    for _ in range(limit):
        if step_of(sim, step)["phase"] == phase:
            return
        sim.block()
    raise AssertionError(f"step {step} never reached {phase}: {step_of(sim, step)['phase']}")
