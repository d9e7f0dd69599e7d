"""The devnet: process supervision (no process left behind, Ctrl-C too), node configs, and the
end-to-end run over real processes and loopback HTTP (`issues show 6`, "Done when")."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gonka_diloco.devnet_config import make_config
from gonka_diloco.procs import NodeProcess, NodeStartError, Supervisor
from protocol.config import Moments
from tests.support.procs import QUICK, gone, leftover_processes

# A node stand-in: spawns a grandchild (as uvicorn or torchrun would), logs, announces itself, waits.
NODE = textwrap.dedent(
    """
    import json, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("not json: warming up", flush=True)
    print(json.dumps({"event": "commit", "outer_step": 0}), flush=True)
    line = {"event": "listening", "url": "http://127.0.0.1:5", "grandchild": child.pid}
    print(json.dumps(line), flush=True)
    mode = sys.argv[1] if len(sys.argv) > 1 else "wait"
    if mode == "exit":
        sys.exit(7)
    time.sleep(600)
    """
)


def node(tmp_path: Path, name: str = "n", *args: str, events: list | None = None) -> NodeProcess:
    script = tmp_path / "node.py"
    script.write_text(NODE)
    sink = (lambda n, e: events.append((n, e))) if events is not None else None
    return NodeProcess(name, [sys.executable, str(script), *args], tmp_path / f"{name}.log", on_event=sink)


def grandchild_pid(log: Path) -> int:
    import json

    line = next(x for x in log.read_text().splitlines() if '"listening"' in x)
    return int(json.loads(line)["grandchild"])


def test_listening_line_log_and_group_stop(tmp_path: Path) -> None:
    events: list = []
    proc = node(tmp_path, events=events)
    proc.start()
    try:
        assert proc.wait_listening(30) == "http://127.0.0.1:5"
        grandchild = grandchild_pid(proc.log_path)
    finally:
        proc.stop(grace=5)
    assert not proc.alive
    assert gone(grandchild), "the node's grandchild survived the group stop"
    log = proc.log_path.read_text()
    assert "not json: warming up" in log and '"event": "commit"' in log  # the whole stdout is kept
    assert ("n", {"event": "commit", "outer_step": 0}) in events


def test_a_node_that_dies_before_listening_is_a_named_error(tmp_path: Path) -> None:
    proc = NodeProcess("bad", [sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "bad.log")
    proc.start()
    with pytest.raises(NodeStartError, match=r"bad exited with code 3; see .*bad\.log"):
        proc.wait_listening(30)


def test_crashes_are_told_apart_from_stops(tmp_path: Path) -> None:
    sup = Supervisor(grace=5)
    crasher = sup.add(node(tmp_path, "crasher", "exit"))
    stopped = sup.add(node(tmp_path, "stopped"))
    for p in (crasher, stopped):
        p.start()
        p.wait_listening(30)
    assert crasher.proc is not None and crasher.proc.wait(30) == 7
    stopped.stop()
    assert [n.name for n in sup.crashed()] == ["crasher"]
    sup.close()
    with pytest.raises(ValueError, match="duplicate node name"):
        sup.add(node(tmp_path, "stopped"))


def test_kill_and_restart_appends_to_the_same_log(tmp_path: Path) -> None:
    proc = node(tmp_path)
    proc.start()
    proc.wait_listening(30)
    proc.kill()
    assert proc.returncode == -signal.SIGKILL and proc.expected_exit
    proc.start()
    try:
        proc.wait_listening(30)
        assert proc.log_path.read_text().count('"listening"') == 2
    finally:
        proc.stop()


ORCHESTRATOR = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from gonka_diloco.procs import NodeProcess, Supervisor
    sup = Supervisor(grace=5)
    sup.install_handlers()
    for i in range(2):
        p = sup.add(NodeProcess(f"n{i}", [sys.executable, sys.argv[1]], Path(sys.argv[2]) / f"n{i}.log"))
        p.start()
        p.wait_listening(60)
        print(p.pid, flush=True)
    print("ready", flush=True)
    sys.stdin.read()  # until a signal arrives
    """
)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_leaves_no_process_behind(tmp_path: Path, sig: signal.Signals) -> None:
    (tmp_path / "node.py").write_text(NODE)
    (tmp_path / "orch.py").write_text(ORCHESTRATOR)
    orch = subprocess.Popen(
        [sys.executable, str(tmp_path / "orch.py"), str(tmp_path / "node.py"), str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert orch.stdout is not None
        pids = [int(orch.stdout.readline()) for _ in range(2)]
        assert orch.stdout.readline().strip() == "ready"
        grandchildren = [grandchild_pid(tmp_path / f"n{i}.log") for i in range(2)]
        orch.send_signal(sig)
        assert orch.wait(30) != 0
    finally:
        if orch.poll() is None:
            orch.kill()
            orch.wait()
    for pid in pids + grandchildren:
        assert gone(pid), f"process {pid} outlived the orchestrator"


# ---------------------------------------------------------------- node configs and the run config


def test_node_tomls_are_what_the_nodes_accept(tmp_path: Path) -> None:
    """The TOML the devnet writes must validate against the nodes' own config models."""
    from gonka_diloco.devnet import node_toml

    trainer_cfg = pytest.importorskip("trainer.node_config")
    verifier_cfg = pytest.importorskip("verifier.node_config")
    fields = {
        "chain_url": "http://127.0.0.1:26657",
        "run_id": 1,
        "data_dir": str(tmp_path / "data"),
        "listen": "127.0.0.1:0",
        "stake": 2_000_000_000,
        "threads": 1,
        "behaviour": "lazy",
        "behaviour_params": {"fraction": 0.5, "note": 'a "quoted" \\ path'},
    }
    (tmp_path / "host.toml").write_text(node_toml(fields, {"test_index": 3}))
    host = trainer_cfg.load_host_config(tmp_path / "host.toml")
    assert host.behaviour_params == fields["behaviour_params"]
    assert host.key.test_index == 3 and host.data_path == tmp_path / "data"
    (tmp_path / "verifier.toml").write_text(node_toml({**fields, "behaviour": "honest"}, {"test_index": 4}))
    assert verifier_cfg.load_verifier_config(tmp_path / "verifier.toml").key.test_index == 4


def test_run_config_binds_the_seeded_model_and_the_corpus() -> None:
    from gonka_diloco.devnet import run_config
    from gonka_diloco.devnet_config import DevnetConfig
    from nodekit.globalmodel import GlobalModel
    from replay.data import shakespeare_manifest
    from replay.spec import build_model

    cfg = DevnetConfig(model_size="tiny", seed=5, block_interval=0.5, outer_steps=3)
    rc = run_config(cfg)
    assert rc.phases.train_blocks == cfg.blocks(cfg.phases.train) == 16  # 8 s of 0.5 s blocks
    assert rc.max_outer_steps == 3 and rc.model.config["seed"] == 5
    assert rc.initial_model_hash == GlobalModel.from_module(build_model(rc.model)).hash
    assert rc.dataset_manifest_hash == shakespeare_manifest()[1].manifest_hash()
    other = run_config(DevnetConfig(model_size="tiny", seed=6))
    assert other.initial_model_hash != rc.initial_model_hash  # the seed reaches the init
    # G_0's hash is over the run's chunk size, the one every node hashes it with (a devnet with
    # smaller chunks named a G_0 no node could build or fetch)
    chunked = run_config(DevnetConfig(model_size="tiny", seed=5, state_chunk_bytes=1 << 16))
    g0 = GlobalModel.from_module(build_model(chunked.model), 1 << 16)
    assert chunked.state_chunk_bytes == 1 << 16 and chunked.initial_model_hash == g0.hash
    windows = run_config(DevnetConfig(model_size="tiny", sampling="segments", window_segments=5))
    assert (windows.sampling.value, windows.window_segments) == ("segments", 5)


def test_every_tolerance_threshold_reaches_the_run_config() -> None:
    """Issue 36 (3): the devnet sets the update-space and summed-residual thresholds too."""
    from gonka_diloco.devnet import run_config
    from gonka_diloco.devnet_config import load_config
    from protocol.config import ReplayMode

    names = ("tolerance", "tolerance_exp_avg", "tolerance_exp_avg_sq", "tolerance_update",
             "tolerance_denominator", "tolerance_cumulative", "tolerance_cumulative_update")  # fmt: skip
    values = {n: 0.01 * (i + 1) for i, n in enumerate(names)}
    rc = run_config(load_config(None, {"model_size": "tiny", "replay_mode": "tolerance", **values}))
    assert rc.replay_mode is ReplayMode.TOLERANCE
    assert {n: getattr(rc, n) for n in names} == values
    assert rc.inner.moments is Moments.FP32  # tolerance mode's, the default being int8


def test_devnet_moments_default_to_int8_and_fp32_in_tolerance_mode() -> None:
    """`--moments`: unset, the run config's default (int8), fp32 in tolerance mode (which needs it);
    int8 with tolerance is refused in one line."""
    from gonka_diloco.devnet import run_config
    from gonka_diloco.devnet_config import DevnetConfigError, load_config

    tiny = {"model_size": "tiny"}
    assert run_config(load_config(None, tiny)).inner.moments is Moments.INT8
    assert run_config(load_config(None, {**tiny, "moments": "fp32"})).inner.moments is Moments.FP32
    tol = {**tiny, "replay_mode": "tolerance", "tolerance": 0.1, "tolerance_exp_avg": 0.1,
           "tolerance_exp_avg_sq": 0.1}  # fmt: skip
    with pytest.raises(DevnetConfigError, match="needs moments 'fp32'"):
        load_config(None, {**tol, "moments": "int8"})


def test_codec_sparse_gets_the_recommended_chunk_and_k() -> None:
    """`--codec sparse`: C = 4096, k = 64, β = 0.9, and its outer step (specs §4.1) unless set; the
    dense codecs keep theirs."""
    from gonka_diloco.devnet import run_config
    from gonka_diloco.devnet_config import DevnetConfig, DevnetConfigError, load_config
    from protocol.config import Codec, OuterRule, SparseMean

    rc = run_config(DevnetConfig(model_size="tiny", codec=Codec.SPARSE))
    assert (rc.codec, rc.codec_block_size, rc.codec_topk, rc.codec_ef_decay) == (Codec.SPARSE, 4096, 64, 0.9)
    # and the outer step that learned fastest on the devnet (issue 37): Nesterov, the contributors' mean
    outer = (rc.outer.rule, rc.outer.lr, rc.outer.momentum, rc.outer.sparse_mean)
    assert outer == (OuterRule.NESTEROV, 0.7, 0.9, SparseMean.CONTRIBUTORS)
    toml = {"codec": "sparse", "sparse_outer_rule": "average", "sparse_outer_lr": 1.0, "model_size": "tiny"}
    average = run_config(load_config(None, toml))
    assert (average.outer.rule, average.outer.lr) == (OuterRule.AVERAGE, 1.0)
    hosts = run_config(load_config(None, {"codec": "sparse", "sparse_mean": "hosts", "model_size": "tiny"}))
    assert hosts.outer.sparse_mean is SparseMean.HOSTS
    cfg = load_config(None, {"codec": "sparse", "sparse_chunk": 256, "sparse_topk": 8, "model_size": "tiny"})
    assert (run_config(cfg).codec_block_size, run_config(cfg).codec_topk) == (256, 8)
    dense = run_config(DevnetConfig(model_size="tiny"))
    assert dense.codec is Codec.INT8 and dense.codec_topk == 0 and dense.codec_block_size == 256
    assert (dense.outer.rule, dense.outer.lr) == (OuterRule.NESTEROV, 0.7)  # DiLoCo's
    with pytest.raises(DevnetConfigError, match="sparse_topk"):
        load_config(None, {"codec": "sparse", "sparse_chunk": 16, "sparse_topk": 32})


# ---------------------------------------------------------------- the end-to-end devnet

QUICK_TOML = """
hosts = 3
verifiers = 2
outer_steps = 3
inner_steps = 10
segment_len = 5
sampled_segments = 1
verifiers_per_contribution = 1
batch_size = 4
seq_len = 32
model_size = "tiny"
block_interval = 0.2
timeout = 150.0
live = false
[[adversaries]]
behaviour = "noise"
[phases]
join = 2.0
train = 4.0
reveal = 2.0
verify = 3.0
escalation = 2.0
result = 3.0
"""


@pytest.mark.slow
@pytest.mark.parametrize("overlap", ["none", "eager"])
def test_devnet_rejects_the_adversary_and_learns(tmp_path: Path, overlap: str) -> None:
    """The whole `gonka-diloco devnet --config devnet.toml` command, as `make devnet` runs it;
    `--overlap eager`: the eager schedule (specs §2.2.1), two steps in flight."""
    from typer.testing import CliRunner

    from gonka_diloco.cli import app
    from gonka_diloco.devnet_config import load_config
    from gonka_diloco.report import load_snapshot

    toml = tmp_path / "devnet.toml"
    toml.write_text(QUICK_TOML)
    cfg = load_config(toml, {})
    assert cfg.model_dump() == make_config(QUICK).model_dump()  # the TOML says what QUICK says
    args = ["devnet", "--config", str(toml), "--out-dir", str(tmp_path / "runs"), "--overlap", overlap]
    if overlap == "eager":  # and windows that close once all they wait for is in (specs §2.3.1)
        args.append("--early-close")
    result = CliRunner().invoke(app, args)
    [folder] = [p for p in (tmp_path / "runs").iterdir() if not p.is_symlink()]
    assert (tmp_path / "runs" / "latest").resolve() == folder  # runs/latest: the newest run folder
    assert leftover_processes(str(folder)) == []
    assert result.exit_code == 0, result.output + (folder / "logs").as_posix()
    assert f"devnet: report at {folder / 'report.md'}" in result.output and "PASS" in result.output
    snap = load_snapshot(folder)
    assert snap.failures == []

    steps = range(cfg.outer_steps)
    adversary = [c for c in snap.contributions if c.host == "host-2"]
    honest = [c for c in snap.contributions if c.host != "host-2"]
    assert sorted(c.outer_step for c in adversary) == list(steps)
    assert {c.outcome for c in adversary} == {"rejected"}
    assert all(c.slashed > 0 for c in adversary)
    assert len(honest) == 2 * cfg.outer_steps and {c.outcome for c in honest} == {"accepted"}

    val = snap.val_loss()
    assert sorted(val) == list(steps) and val[cfg.outer_steps - 1] < val[0]

    # The chain's accepted sets are exactly the honest hosts, and the model hash it recorded for each
    # outer step is the one every accepted host computed — and the next step builds on it.
    for step in snap.steps:
        assert step.phase == "DONE" and step.accepted == ["host-0", "host-1"]
        assert step.result_votes == dict.fromkeys(step.accepted, step.result_hash)
    lag = 2 if overlap == "eager" else 1  # overlapped: step n builds on step n − 2's result
    for prev, nxt in zip(snap.steps, snap.steps[lag:], strict=False):
        assert nxt.base_model_hash == prev.result_hash
    if overlap == "eager":  # every host committed before the deadline: the train windows closed early
        train_blocks = cfg.blocks(cfg.phases.train)
        assert any(s.commit_deadline < s.train_start + train_blocks for s in snap.steps)

    assert snap.chain.txs and snap.chain.rewards > 0 and snap.chain.host_slashed > 0
    text = (folder / "report.md").read_text()
    assert "| result | PASS |" in text and (folder / "loss.png").exists()
    # the finished run's final model, exported from the honest hosts' disks after the nodes stopped
    assert snap.final_model is not None and snap.final_model.model_hash == snap.steps[-1].result_hash
    assert set(snap.final_model.samples) == {"G_0", "final"} and "## Final model" in text
    assert {p.name for p in (folder / "model").iterdir()} >= {"model.safetensors", "config.json", "MODEL.md"}
    assert f"exported to {folder / 'model'} (read from host-0's disk)" in result.output
    assert {p.name for p in (folder / "logs").iterdir()} >= {"chain.log", "host-0.log", "verifier-1.log"}


def test_the_devnets_checks_cover_every_block_each_outer_step() -> None:
    """Only the check whose window ends at θ_H checks Δ (specs §6), so the default noise host meets
    a check only when its last block is drawn: the devnet's w makes its two checks (v = 1 and one
    auditor of two verifiers) cover every block, and an accepted adversary stays a failure."""
    from gonka_diloco.devnet import run_config
    from gonka_diloco.devnet_config import make_config
    from protocol.prf import window_blocks

    cfg = make_config({})
    rc = run_config(cfg)
    v = rc.verifiers_per_contribution
    checks = v + min(rc.audit_verifiers, cfg.verifiers - v)
    assert rc.windowed and window_blocks(rc.n_segments, rc.window_len) <= checks == 2


PERSIST_CASES = [({}, 5), ({"window_segments": 2}, 2), ({"checkpoint_every": 5}, 5),
                 ({"checkpoint_every": 4}, 4), ({"sampling": "segments"}, 4)]  # fmt: skip


@pytest.mark.parametrize(("settings", "want"), PERSIST_CASES)
def test_devnet_hosts_persist_every_window_start(tmp_path: Path, settings: dict, want: int) -> None:
    """Hosts persist every w-th boundary unless told otherwise (host.toml's default follows the
    run): with a fixed m = 4 beside w = 3 a host recomputed every window start inside the reveal
    phase, and a loaded 2-core machine missed the reveal deadline (ErrLateReveal)."""
    from gonka_diloco.devnet import Devnet, run_config
    from gonka_diloco.devnet_config import make_config
    from trainer.node_config import checkpoint_every_for, load_host_config

    cfg = make_config(settings)
    with Devnet(cfg, tmp_path / "run") as dn:
        dn.run_id = 1  # as after `create_run`
        dn._add_node("host-0", "host", 1, "honest", {}, "http://127.0.0.1:1")
    host = load_host_config(tmp_path / "run" / "host-0" / "host.toml")
    assert host.checkpoint_every == settings.get("checkpoint_every")  # unset unless the devnet sets it
    assert checkpoint_every_for(run_config(cfg), host.checkpoint_every) == want
