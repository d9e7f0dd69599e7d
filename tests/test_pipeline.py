"""The state pipeline end to end, at a chunk size small enough that every object is many chunks:
two hosts (sparse checkpoints) and a verifier over real HTTP, one host behind a proxy that cuts
its first transfers mid-response. The verifier resumes them, downloads only the one start state
it cannot rebuild, derives both Δs itself; the other host pulls the cut host's Δ from the author
and the verifier at once; everyone lands on the same G_1."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path
from typing import Any

from nodekit.objects import Kind, ObjectPolicy
from replay.spec import build_model
from tests.support.nodes import (
    QUICK_HOST,
    LockstepChain,
    create_run,
    host_config,
    run_config,
    running,
    then_stop,
    tiny_corpus,
    verifier_node,
)
from trainer.node import HostNode
from trainer.recompute import needed_boundaries

CHUNK = 4096


class CuttingProxy:
    """TCP proxy to `target` that closes the first `cuts` connections carrying a blob body after
    `after` bytes of response: what a flaky link does to a long transfer."""

    def __init__(self, target: tuple[str, int], cuts: int, after: int) -> None:
        self.target, self.cuts, self.after = target, cuts, after
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.cut = 0
        self._lock = threading.Lock()
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.target)
        state = {"blob": False, "sent": 0}

        def up() -> None:
            try:
                while data := client.recv(65536):
                    if b"GET /blobs/" in data and b"/chunks " not in data:
                        state["blob"] = True
                    upstream.sendall(data)
            except OSError:
                pass
            finally:
                upstream.close()

        threading.Thread(target=up, daemon=True).start()
        try:
            while data := upstream.recv(65536):
                if state["blob"]:
                    with self._lock:
                        cutting = self.cut < self.cuts and state["sent"] + len(data) > self.after
                        if cutting:
                            self.cut += 1
                    if cutting:
                        client.sendall(data[: max(0, self.after - state["sent"])])
                        break
                    state["sent"] += len(data)
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):  # shutdown first: it wakes the other thread's recv
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def test_multi_chunk_states_resume_and_multi_source_fetch(tmp_path: Path) -> None:
    corpus = tiny_corpus()
    chain = LockstepChain()
    # three windows of one segment: the verifier fetches a start and, short of θ_H, the committed Δ,
    # through the proxy that cuts host 1's transfers, whichever window is drawn
    cfg = run_config(corpus, max_outer_steps=1, inner_steps=15, window_segments=1, state_chunk_bytes=CHUNK)
    run_id = create_run(chain, cfg)
    objects = ObjectPolicy.of(build_model(cfg.model), cfg)
    state_len = objects.length(Kind.STATE)
    assert state_len > 20 * CHUNK and objects.length(Kind.DELTA) > 3 * CHUNK  # many chunks each

    logs: list[dict[str, Any]] = []
    port = socket.create_server(("127.0.0.1", 0))  # host 1's real port, reserved for it
    real = port.getsockname()[1]
    port.close()
    proxy = CuttingProxy(("127.0.0.1", real), cuts=3, after=3 * CHUNK // 2)
    hosts = [
        HostNode(host_config(tmp_path, 1, run_id, listen=f"127.0.0.1:{real}", public_url=proxy.url,
                             checkpoint_every=2), chain, corpus=corpus, log=logs.append, patience=QUICK_HOST),
        HostNode(host_config(tmp_path, 2, run_id, checkpoint_every=2), chain, corpus=corpus, log=logs.append,
                 patience=QUICK_HOST),
    ]  # fmt: skip
    verifier = verifier_node(tmp_path, 9, run_id, corpus)
    verifier.rt.sink = logs.append
    try:
        targets = [lambda h=h: h.run(linger=True) for h in hosts] + [then_stop(verifier.run, hosts)]
        with running(targets, chain):
            pass
    finally:
        proxy.close()

    step = chain.query("outer_step", run_id=run_id, step=0)
    assert step["accepted"] == sorted(h.address for h in hosts) and step["phase"] == "DONE"
    g1 = step["result_hash"]
    applied = {e["node"] for e in logs if e["event"] == "outer_step_applied" and e["model_hash"] == g1}
    assert applied == {"host-1", "host-2", "verifier-9"}

    fetched = [e for e in logs if e["event"] == "fetched"]
    by_verifier = [e for e in fetched if e["node"] == "verifier-9"]
    # per host one window of one segment: its start (none for segment 0: rebuilt from G_n and a fresh
    # optimizer) and, short of the last segment, the committed Δ to keep (no θ_H: specs §6)
    states = [e for e in by_verifier if e["kind"] == "state"]
    assert len(states) <= 2 and all(0 < e["bytes"] <= state_len for e in states)
    mine = {c["host"]: c["windows"][c["slots"][verifier.address]]
            for c in chain.query("challenges", run_id=run_id, step=0)["challenges"]}  # fmt: skip
    short = sorted(h for h, start in mine.items() if not cfg.window_reaches_end(start))
    deltas = [e for e in by_verifier if e["kind"] == "delta"]  # at θ_H derived from its own replay
    assert sorted(e["host"] for e in deltas) == short, (mine, deltas)  # and never fetched again
    assert sum(e["resumed"] for e in fetched) >= 1  # the proxy cut transfers; they resumed
    # host 2 aggregated host 1's Δ: from the cut author and from the verifier that derived it
    delta = [e for e in fetched if e["node"] == "host-2" and e["kind"] == "delta"]
    assert len(delta) == 1 and len(delta[0]["chunks_from"]) == 2, delta
    # sparse checkpoints (every 2nd boundary and θ_H persisted): a boundary a checker may fetch that
    # was not persisted is recomputed, bit for bit (a bitwise host keeps no claimed end), and only then
    # (which windows are drawn is the chain's draw)
    challenges = chain.query("challenges", run_id=run_id, step=0)["challenges"]
    names = {h.address: f"host-{i}" for i, h in zip((1, 2), hosts, strict=True)}
    n = cfg.n_segments
    needed = {c["host"]: needed_boundaries(c["segments"], cfg.replay_mode, c.get("windows") or ())
              for c in challenges}  # fmt: skip
    must = {names[a] for a, js in needed.items() if any(j % 2 and j != n for j in js)}
    assert {e["node"] for e in logs if e["event"] == "recomputed"} == must
    assert not [e for e in logs if e["event"] in ("recompute_failed", "delta_unavailable", "verify_error")]
