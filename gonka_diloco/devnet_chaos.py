"""Chaos in the devnet (issue 22): SIGKILL a random host, verifier or chain process at random
moments, restart it on the same disk and ports, and hold the finished run to what a crash must
never break — the run completes, every honest node ends on the chain's model, and nothing any
node stored is corrupt or left half-written.

Every random choice (victim, when, how long it stays down) is drawn from one seeded
`random.Random`, so a failing seed reruns the same plan of kills; the moments in the run those
kills land on (outer step, phase) still depend on the machine's speed, which is why each kill is
logged with where the run stood. One victim at a time: the next kill waits until the last one is
listening again.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gonka_diloco.devnet import CHAIN_ROLES, Devnet
from gonka_diloco.devnet_config import TINY_DEVNET, DevnetConfig, make_config
from nodekit.objects import Kind
from nodekit.store import ContentStore, StoreError, stale_files
from protocol.config import RunConfig


@dataclass
class Kill:
    """One fault: who, when (seconds since the chaos began), where the run stood, how long down."""

    victim: str
    at_s: float
    outer_step: int
    phase: str
    down_s: float
    back_s: float = 0.0
    """Seconds from the kill until the victim was listening again (start-up included)."""


@dataclass
class ChaosResult:
    """A chaos run's outcome: the seed that reproduces its plan, the kills, what broke."""

    seed: int
    kills: list[Kill] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    folder: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        """One paragraph for a failure message: the seed, every kill, every failure."""
        kills = "; ".join(
            f"{k.victim} at {k.at_s:.1f}s (step {k.outer_step} {k.phase}, "
            f"down {k.down_s:.1f}s, back {k.back_s:.1f}s)"
            for k in self.kills
        )
        fails = "\n  ".join(self.failures) or "none"
        return f"chaos seed {self.seed} in {self.folder}\n kills: {kills or 'none'}\n failures:\n  {fails}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


CHAOS_DEVNET: dict[str, Any] = {
    **TINY_DEVNET,
    "hosts": 2,
    "verifiers": 2,
    "adversaries": [],
    "outer_steps": 8,
    "timeout": 240.0,
}
"""Small enough for two cores (the fault tests' 1-layer GPT, H=10, 0.2 s blocks), honest nodes
only, and long enough (eight outer steps, ~4 s each) for a few kills and restarts to land mid-run."""


class Chaos:
    """Kills and restarts `dn`'s processes while it runs; `run()` returns once the run finished.

    `kills` faults, each `gap_s` (uniform) after the previous victim was back, each victim down for
    `down_s` (uniform) before its restart. No kill lands in the last outer step: a node killed then
    would come back to a finished run that nobody serves any more (nodes leave once it ends)."""

    def __init__(
        self,
        dn: Devnet,
        rng: random.Random,
        *,
        kills: int = 4,
        gap_s: tuple[float, float] = (1.0, 5.0),
        down_s: tuple[float, float] = (0.2, 3.0),
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.dn, self.rng, self.n_kills = dn, rng, kills
        self.gap_s, self.down_s, self.log = gap_s, down_s, log
        self.kills: list[Kill] = []
        self.t0 = time.monotonic()

    def victims(self) -> list[str]:
        """Every host, verifier and chain process, in a fixed order (the seed picks among them)."""
        return sorted(self.dn.rows)

    def run(self) -> dict[str, Any]:
        """Watch the run, killing and restarting at the drawn moments; the finished run's summary."""
        self.t0 = time.monotonic()
        last = self.dn.cfg.outer_steps - 1
        for _ in range(self.n_kills):
            victim = self.rng.choice(self.victims())
            at = time.monotonic() + self.rng.uniform(*self.gap_s)
            down = self.rng.uniform(*self.down_s)

            def due(r: dict[str, Any], at: float = at) -> bool:
                return time.monotonic() >= at or r["current_step"] >= last

            run = self.dn.watch(until=due)
            if run["current_step"] >= last or run["status"] == "finished":
                self.log(f"chaos: the last outer step began; {len(self.kills)} kills done")
                break
            self.kill(victim, run, down)
        return self.dn.watch()

    def kill(self, victim: str, run: dict[str, Any], down: float) -> Kill:
        """SIGKILL `victim`, wait `down` seconds, restart it where it was; logged."""
        t = time.monotonic()
        k = Kill(victim, round(t - self.t0, 2), run["current_step"], self.dn.live.phase, round(down, 2))
        self.log(f"chaos: SIGKILL {victim} at {k.at_s:.1f}s (outer step {k.outer_step}, {k.phase})")
        self.dn.kill(victim)
        time.sleep(down)
        self.dn.restart(victim)
        k.back_s = round(time.monotonic() - t, 2)
        self.log(f"chaos: {victim} back after {k.back_s:.1f}s")
        self.kills.append(k)
        return k


# ---------------------------------------------------------------- the checks after the run


def node_events(log: Path) -> Iterator[dict[str, Any]]:
    """A node's JSON log lines (every start appends to the same file)."""
    if not log.is_file():
        return
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                yield event


def store_failures(name: str, root: Path, chunk_bytes: int) -> list[str]:
    """Every object of a node's content store read back chunk by chunk against its hash
    (`ContentStore.verify`), and nothing left that the start-up sweep should have removed."""
    if not root.is_dir():
        return [f"{name}: no content store at {root}"]
    out = [f"{name}: stale {p.relative_to(root)} in its store" for p in stale_files(root)]
    store = ContentStore(root, chunk_bytes)
    for group in store.groups():
        for kind in Kind:
            for h in store.hashes(kind, group):
                try:
                    store.verify(kind, h, group)
                except (StoreError, OSError) as e:
                    out.append(f"{name}: {kind.value} {h[:12]} in {group} is corrupt: {e}")
    return out


def temp_failures(name: str, home: Path) -> list[str]:
    """Half-written files outside the store (node.json, commit records): `atomic_write` temps."""
    return [f"{name}: stale {p.relative_to(home)}" for p in home.rglob(".tmp-*") if "store" not in p.parts]


def wait_nodes_exit(dn: Devnet, timeout: float = 60.0) -> list[str]:
    """Hosts and verifiers leave once the run is over (exit 0): wait for that, so the stores are
    checked at rest. A node still running, or one that exited with an error, is a failure."""
    nodes = [n for n, r in dn.rows.items() if r.role not in CHAIN_ROLES]
    deadline = time.monotonic() + timeout
    while any(dn.procs[n].alive for n in nodes) and time.monotonic() < deadline:
        time.sleep(0.2)
    out = [f"{n}: still running {timeout:.0f}s after the run finished" for n in nodes if dn.procs[n].alive]
    out += [f"{p.name} exited with code {p.returncode}; see {p.log_path}" for p in dn.sup.crashed()]
    return out


LOCAL_CORRUPTION = ("StoreError", "corrupted on disk", "stored chunk digests")
"""What a node logs when its own disk gave back bad bytes (a peer's bad bytes are BlobInvalid)."""


def corruption_seen(name: str, log: Path) -> list[str]:
    """A store read that failed during the run, even if the node then deleted and refetched the
    object: a half-written or corrupted object was visible in a store, which must never happen."""
    return [
        f"{name}: {e.get('event')} at outer step {e.get('outer_step')}: {str(e['error'])[:160]}"
        for e in node_events(log)
        if any(s in str(e.get("error", "")) for s in LOCAL_CORRUPTION)
    ]


def check_run(dn: Devnet) -> list[str]:
    """What a chaos run must still give: every outer step DONE, every honest node's last applied
    model the chain's global model (and held in its store), every store intact and swept, no
    node ever read a corrupted object back from its own store, and every restarted node back at
    the endpoint the chain gives its peers."""
    failures: list[str] = []
    run = dn.chain.query("run", run_id=dn.run_id)
    last = dn.cfg.outer_steps - 1
    if run["status"] != "finished" or run["current_step"] != last:
        failures.append(f"run {run['status']} at outer step {run['current_step']}, not finished at {last}")
    for n in range(dn.cfg.outer_steps):
        phase = dn.chain.query("outer_step", run_id=dn.run_id, step=n)["phase"]
        if phase != "DONE":
            failures.append(f"outer step {n} is {phase}, not DONE")
    parts = dn.chain.query("participants", run_id=dn.run_id)["participants"]
    endpoints = {p["address"]: p["endpoint"] for p in parts}
    final = run["global_model_hash"]
    cfg = RunConfig.model_validate(run["config"])
    for row in dn.rows.values():
        if row.role in CHAIN_ROLES:
            continue
        home = dn.folder / row.name
        failures += store_failures(row.name, home / "store", cfg.state_chunk_bytes)
        failures += temp_failures(row.name, home)
        failures += corruption_seen(row.name, dn.folder / row.log)
        if row.address in endpoints and endpoints[row.address] != row.url:
            failures.append(f"{row.name}: back at {row.url}, the chain names {endpoints[row.address]}")
        if row.behaviour != "honest":
            continue
        applied = {
            e["outer_step"]: e.get("model_hash")
            for e in node_events(dn.folder / row.log)
            if e.get("event") == "outer_step_applied" and isinstance(e.get("outer_step"), int)
        }
        mine = applied.get(last)
        if mine != final:
            failures.append(
                f"{row.name}: applied {str(mine)[:12]} for the last step {last}, the chain has {final[:12]}"
            )
        if not ContentStore(home / "store", cfg.state_chunk_bytes).has(Kind.MODEL, final):
            failures.append(f"{row.name}: the final global model {final[:12]} is not in its store")
    return failures


def chaos_run(
    seed: int,
    folder: Path,
    *,
    overrides: dict[str, Any] | None = None,
    kills: int = 4,
    gap_s: tuple[float, float] = (1.0, 5.0),
    down_s: tuple[float, float] = (0.2, 3.0),
    log: Callable[[str], None] = lambda line: None,
) -> ChaosResult:
    """One seeded chaos devnet in `folder`: start, kill and restart `kills` times, check the end.
    A devnet error (a node crashed, the run stalled) is a failure like any other, not an exception."""
    from gonka_diloco.devnet import DevnetError

    cfg: DevnetConfig = make_config({**CHAOS_DEVNET, **(overrides or {})})
    result = ChaosResult(seed=seed, folder=str(folder))
    t0 = time.monotonic()
    with Devnet(cfg, folder) as dn:
        dn.echo = log
        chaos = Chaos(dn, random.Random(seed), kills=kills, gap_s=gap_s, down_s=down_s, log=log)
        try:
            dn.start()
            chaos.run()
            result.failures += wait_nodes_exit(dn)
            result.failures += check_run(dn)
        except DevnetError as e:
            result.failures.append(str(e))
        finally:
            result.kills = chaos.kills
    result.wall_s = round(time.monotonic() - t0, 1)
    (folder / "chaos.json").write_text(json.dumps(result.to_json(), indent=2))
    return result
