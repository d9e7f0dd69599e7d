"""Chaos in the devnet (issue 22): random SIGKILLs of hosts, verifiers and the chain, each
restarted on its own disk and ports, and the run still completes on one model with every store
intact. The seed is in the failure message: `python -m bench.chaos --seed N` reruns its plan."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from gonka_diloco.devnet_chaos import Chaos, ChaosResult, Kill, chaos_run, corruption_seen, store_failures
from nodekit.objects import Kind
from nodekit.store import ContentStore
from tests.support.procs import leftover_processes

SEED = int(os.environ.get("CHAOS_SEED", "22"))


@pytest.mark.slow
def test_random_kills_and_restarts_end_on_one_model_with_intact_stores(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    result = chaos_run(SEED, folder, log=print)
    assert leftover_processes(str(folder)) == []
    assert result.ok, result.summary()
    assert len(result.kills) >= 2, result.summary()  # the chaos happened, mid-run
    assert all(k.outer_step < 7 for k in result.kills), result.summary()


class FakeDevnet:
    """What `Chaos` uses of a `Devnet`: rows, the config's step count, watch, kill, restart.
    Each watch call is one more outer step, so the run ends after `steps` of them."""

    def __init__(self, steps: int) -> None:
        self.rows = {n: None for n in ["chain", "host-0", "host-1", "verifier-0", "verifier-1"]}
        self.cfg = type("Cfg", (), {"outer_steps": steps})()
        self.live = type("Live", (), {"phase": "TRAIN"})()
        self.step = -1
        self.trace: list[str] = []

    def watch(self, until: Any = None) -> dict[str, Any]:
        self.step = min(self.step + 1, self.cfg.outer_steps - 1)
        run = {"current_step": self.step, "status": "active"}
        while until is not None and not until(run):
            time.sleep(0.001)
        return {**run, "status": "finished"} if until is None else run

    def kill(self, name: str) -> None:
        self.trace.append(f"kill {name}")

    def restart(self, name: str) -> None:
        self.trace.append(f"restart {name}")


def test_the_seed_decides_the_plan_one_victim_at_a_time_none_in_the_last_step() -> None:
    def plan(seed: int, steps: int = 10) -> tuple[list[str], list[Kill]]:
        dn = FakeDevnet(steps)
        rng = random.Random(seed)
        chaos = Chaos(dn, rng, kills=4, gap_s=(0.0, 0.01), down_s=(0.0, 0.01))  # type: ignore[arg-type]
        chaos.run()
        return dn.trace, chaos.kills

    trace, kills = plan(5)
    assert trace == plan(5)[0] and trace != plan(6)[0]
    assert len(kills) == 4 and [k.victim for k in kills] == [t.split()[1] for t in trace[::2]]
    # never two down at once: each kill is followed by that victim's restart before the next kill
    assert trace == [f"{op} {k.victim}" for k in kills for op in ("kill", "restart")]
    _, short = plan(5, steps=3)  # the run reaches its last step after two kills: no more
    assert [k.outer_step for k in short] == [0, 1]


def test_the_store_check_finds_a_corrupt_chunk_and_a_stale_file(tmp_path: Path) -> None:
    store = ContentStore(tmp_path / "store", 1024)
    h = store.put_bytes(Kind.DELTA, bytes(range(256)) * 20, "delta-0")  # five chunks
    assert store_failures("n", store.root, 1024) == []
    path = store.find(Kind.DELTA, h, "delta-0")
    assert path is not None
    data = bytearray(path.read_bytes())
    data[3000] ^= 1  # chunk 2
    path.write_bytes(bytes(data))
    (store.root / "delta-0" / ".tmp-x.delta").write_bytes(b"half")
    found = store_failures("n", store.root, 1024)
    assert any("stale" in f and ".tmp-x.delta" in f for f in found), found
    assert any("corrupt" in f and "chunk 2" in f for f in found), found


def test_a_failure_message_names_the_seed_and_every_kill() -> None:
    r = ChaosResult(seed=7, kills=[Kill("host-1", 3.2, 1, "TRAIN", 0.5, 2.0)], failures=["boom"])
    text = r.summary()
    assert "seed 7" in text and "host-1 at 3.2s (step 1 TRAIN" in text and "boom" in text
    assert not r.ok and r.to_json()["ok"] is False


def test_a_corrupt_read_during_the_run_is_a_failure_even_if_refetched(tmp_path: Path) -> None:
    log = tmp_path / "host-0.log"
    log.write_text(
        'not json\n{"event": "fetched", "outer_step": 5}\n'
        '{"event": "delta_unusable", "outer_step": 5, "error": "StoreError: x.delta: stored chunk digests '
        'do not match its hash"}\n{"event": "delta_unavailable", "error": "BlobInvalid: peer garbage"}\n'
    )
    found = corruption_seen("host-0", log)
    assert len(found) == 1 and "delta_unusable at outer step 5" in found[0]
