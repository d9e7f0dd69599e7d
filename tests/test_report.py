"""Report rendering and the devnet's pass/fail verdict, from a recorded snapshot (no nodes needed)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gonka_diloco.cli import app
from gonka_diloco.devnet import _honest_work
from gonka_diloco.report import (
    SNAPSHOT_FILE,
    ReportError,
    Snapshot,
    evaluate,
    load_snapshot,
    summary_rows,
    write_report,
)

H0, H1, H2 = "gonka1" + "q" * 38, "gonka1" + "p" * 38, "gonka1" + "z" * 38


def recorded() -> dict:
    """A two-step run as a devnet records it: host-2 is a random-noise adversary."""
    contributions = []
    for step in (0, 1):
        for name, address, outcome, reason in (
            ("host-0", H0, "accepted", "ACCEPT"),
            ("host-1", H1, "accepted", "ACCEPT"),
            ("host-2", H2, "rejected", "DELTA_MISMATCH"),
        ):
            contributions.append(
                {
                    "host": name,
                    "address": address,
                    "outer_step": step,
                    "outcome": outcome,
                    "reasons": [f"verifier-0: {reason}"],
                    "verifiers": ["verifier-0"],
                    "delta_bytes": 51234,
                    "tokens": 10240,
                    "reward": 5_000_000_000 if outcome == "accepted" else 0,
                    "slashed": 200_000_000 if outcome != "accepted" else 0,
                }
            )
    steps = [
        {
            "index": i,
            "phase": "DONE",
            "accepted": ["host-0", "host-1"],
            "base_model_hash": f"{i}" * 64,
            "result_hash": f"{i + 1}" * 64,
            "result_votes": {"host-0": f"{i + 1}" * 64, "host-1": f"{i + 1}" * 64},
            "done_height": 40 * (i + 1),
        }
        for i in (0, 1)
    ]
    host = {"role": "host", "val_loss": {"0": 5.5, "1": 4.9, "2": 4.1}}
    nodes = [
        {"name": "chain", "role": "chain", "log": "logs/chain.log"},
        {**host, "name": "host-0", "address": H0, "local_loss": {"0": 5.2, "1": 4.6}},
        {**host, "name": "host-1", "address": H1, "local_loss": {"0": 5.3, "1": 4.7}},
        {"name": "host-2", "role": "host", "address": H2, "behaviour": "noise", "local_loss": {"0": 5.6}},
        {"name": "verifier-0", "role": "verifier"},
    ]
    return {
        "run_id": 1,
        "chain_url": "http://127.0.0.1:1234",
        "run_status": "finished",
        "config": {"inner_steps": 20},
        "current_step": 1,
        "steps": steps,
        "contributions": contributions,
        "nodes": nodes,
        "chain": {
            "height": 85,
            "txs": 61,
            "host_slashed": 400_000_000,
            "verifier_slashed": 0,
            "rewards": 2 * 10**10,
        },
        "wall_s": 171.4,
    }


@pytest.fixture
def snap() -> Snapshot:
    return Snapshot.model_validate(recorded())


def test_a_clean_run_passes(snap: Snapshot) -> None:
    assert evaluate(snap) == []
    assert snap.val_loss() == {0: 5.5, 1: 4.9, 2: 4.1}


def test_each_failure_is_named(snap: Snapshot) -> None:
    snap.contributions[2].outcome = "accepted"  # the adversary at step 0
    snap.contributions[3].outcome = "rejected"  # honest host-0 at step 1
    snap.nodes[1].alive = False
    snap.nodes[1].val_loss = snap.nodes[2].val_loss = {0: 4.0, 1: 4.5}
    snap.steps[1].result_votes["host-1"] = "9" * 64
    snap.run_status = "active"
    failures = evaluate(snap)
    assert "adversary host-2 (noise) was accepted at outer step 0" in failures
    assert "honest host-0 was rejected at outer step 1" in failures
    assert "host-0 crashed" in failures
    assert any(f.startswith("global validation loss did not fall") for f in failures)
    assert any("accepted hosts computed another model: ['host-1']" in f for f in failures)
    assert any(f.startswith("run did not finish") for f in failures)


def test_an_honest_work_adversary_is_judged_by_the_result(snap: Snapshot) -> None:
    """forge_result trains honestly (accepted, rightly) and votes for a model it made up: the run
    passes while the honest majority's model is adopted, and fails if the forged one is."""
    snap.nodes[3].behaviour, snap.nodes[3].honest_work = "forge_result", True
    forged = "f" * 64
    for step in snap.steps:
        step.accepted.append("host-2")
        step.result_votes["host-2"] = forged
    for c in snap.contributions:
        if c.host == "host-2":
            c.outcome = "accepted"
    assert evaluate(snap) == []
    snap.nodes[3].honest_work = False  # the same acceptance of a faking adversary is a failure
    assert evaluate(snap)[0] == "adversary host-2 (forge_result) was accepted at outer step 0"
    snap.nodes[3].honest_work = True
    # the devnet marks exactly the library's honest-work adversaries
    assert [_honest_work(b) for b in ("forge_result", "withhold", "silent_after_accept")] == [True] * 3
    assert [_honest_work(b) for b in ("honest", "noise", "moment_steer", "teleport")] == [False] * 4
    snap.steps[1].result_hash = forged
    assert evaluate(snap) == [
        "outer step 1: accepted hosts computed another model: ['host-0', 'host-1']",
        f"outer step 1: adopted {forged[:12]}, voted for by adversaries only: ['host-2']",
    ]


def test_a_missing_honest_commit_fails_only_when_expected(snap: Snapshot) -> None:
    snap.contributions = [c for c in snap.contributions if not (c.host == "host-1" and c.outer_step == 1)]
    assert evaluate(snap) == ["honest hosts made no contribution at outer step 1: ['host-1']"]
    assert evaluate(snap, expect_all_honest=False) == []


def test_a_late_join_is_named_as_the_cause(snap: Snapshot) -> None:
    snap.contributions = [c for c in snap.contributions if not (c.host == "host-0" and c.outer_step == 0)]
    snap.steps[0].train_start = 20
    snap.nodes[1].joined_height = 23
    assert evaluate(snap) == [
        "honest hosts made no contribution at outer step 0: ['host-0'] "
        "(host-0 joined after training began at block 20: lengthen phases.join)"
    ]


def test_report_files(snap: Snapshot, tmp_path: Path) -> None:
    report = write_report(snap, tmp_path)
    text = report.read_text()
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![loss](loss.png)" in text
    row = (
        "| host-2 | 0 | rejected | verifier-0: DELTA_MISMATCH | verifier-0 | 51234 | 10240 | - | 0.200 GNK |"
    )
    assert row in text
    assert "| contributions accepted / rejected | 4 / 2 |" in text
    assert "| global validation loss | 5.5000 → 4.1000 |" in text
    assert "| validation perplexity | 244.69 → 60.34 |" in text
    # per outer step and per token seen: two accepted hosts × 10240 tokens at steps 0 and 1
    assert "| 0 | 20,480 | 5.5000 | 244.69 |" in text and "| 1 | 40,960 | 4.9000 | 134.29 |" in text
    assert "| transactions of the run | 61 |" in text
    assert load_snapshot(tmp_path) == snap  # the snapshot round-trips through the folder


def test_summary_marks_failures(snap: Snapshot) -> None:
    snap.failures = ["something broke"]
    assert dict(summary_rows(snap))["result"] == "FAIL"


def test_load_snapshot_errors(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"no snapshot\.json"):
        load_snapshot(tmp_path)
    (tmp_path / SNAPSHOT_FILE).write_text(json.dumps({"run_id": "one"}))
    with pytest.raises(ReportError, match="not a valid snapshot"):
        load_snapshot(tmp_path)
    (tmp_path / SNAPSHOT_FILE).write_text("{not json")
    with pytest.raises(ReportError, match="not a valid snapshot"):
        load_snapshot(tmp_path)


def test_report_command_on_a_run_folder(tmp_path: Path) -> None:
    (tmp_path / SNAPSHOT_FILE).write_text(json.dumps(recorded()))
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"report: {tmp_path / 'report.md'}" in result.output
    assert (tmp_path / "loss.png").exists()


def test_report_command_on_the_snapshot_file_itself(tmp_path: Path) -> None:
    (tmp_path / SNAPSHOT_FILE).write_text(json.dumps(recorded()))
    result = CliRunner().invoke(app, ["report", str(tmp_path / SNAPSHOT_FILE)])
    assert result.exit_code == 0, result.output
    assert "run 1 summary" in result.output and (tmp_path / "report.md").exists()


def test_report_command_on_a_bad_folder(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "no snapshot.json" in result.output


def test_live_view_renders_every_node() -> None:
    from rich.console import Console

    from gonka_diloco.live import LiveState, NodeView, render

    state = LiveState(
        run_id=1, height=42, outer_step=2, outer_steps=5, phase="VERIFY", val_loss={0: 5.1, 1: 4.2}
    )
    state.nodes = [
        NodeView("host-0", "host", status={"phase": "REVEALED", "outer_step": 2, "commits": 3, "loss": 4.5}),
        NodeView("host-3", "host", "noise", alive=False),
    ]
    state.outcomes = {"host-0": "accepted"}
    state.events.append("host-0: committed outer_step=2")
    console = Console(record=True, width=120)
    console.print(render(state))
    text = console.export_text()
    assert "block 42" in text and "outer step 2/5" in text and "VERIFY" in text
    assert "0:5.100  1:4.200" in text
    assert "host-0" in text and "REVEALED" in text and "4.5000" in text and "accepted" in text
    assert "host-3" in text and "noise" in text and "down" in text
    assert "host-0: committed outer_step=2" in text


class FakeChain:
    """Answers the module queries `collect` makes, for one finished two-host outer step."""

    url = "http://chain"

    def __init__(self) -> None:
        step = {
            "phase": "DONE",
            "accepted": [H0],
            "base_model_hash": "0" * 64,
            "result_hash": "1" * 64,
            "result_votes": {H0: "1" * 64},
            "outcomes": {H0: "accepted", H1: "rejected"},
            "open_height": 3,
            "done_height": 30,
        }
        commits = [{"host": h, "delta_hash": "d" * 64, "tokens": 640} for h in (H0, H1)]
        self.answers = {
            "run": {"status": "finished", "current_step": 0, "config": {"inner_steps": 10}},
            "participants": {
                "participants": [
                    {"address": H0, "role": "host", "endpoint": "http://h0"},
                    {"address": H1, "role": "host", "endpoint": "http://h1"},
                    {"address": H2, "role": "verifier", "endpoint": "http://v0"},
                ]
            },
            "outer_step": step,
            "commitments": {"commitments": commits},
            "challenges": {"challenges": [{"host": h, "verifiers": [H2]} for h in (H0, H1)]},
            "verdicts": {
                "verdicts": [
                    {"host": H0, "verifier": H2, "reason": 0},
                    {"host": H1, "verifier": H2, "reason": 3},
                ]
            },
        }

    def query(self, name: str, **params: object) -> object:
        return self.answers[name]

    def height(self) -> int:
        return 31


def test_collect_names_known_nodes_and_keeps_the_rest_by_address() -> None:
    from gonka_diloco.collect import BlockTally, collect
    from gonka_diloco.report import UNKNOWN, NodeRow

    tally = BlockTally()
    tally.add_block(
        1, 30, 2, [("contribution_finalized", {"run_id": "1", "outer_step": "0", "host": H1, "slashed": "7"})]
    )  # rewards come later, when the result is adopted (and only for Δs in it)
    tally.add_block(1, 31, 0, [("reward", {"run_id": "1", "outer_step": "0", "host": H0, "amount": "5"})])
    known = [NodeRow(name="chain", role="chain"), NodeRow(name="host-0", role="host", address=H0)]
    snap = collect(FakeChain(), 1, known, tally=tally)
    assert [n.name for n in snap.nodes][:2] == ["chain", "host-0"]
    stranger = next(n for n in snap.nodes if n.address == H1)
    assert stranger.behaviour == UNKNOWN and stranger.name.startswith("gonka1pppp")
    rows = {c.address: c for c in snap.contributions}
    assert rows[H0].outcome == "accepted" and rows[H0].reasons == [f"{snap.nodes[-1].name}: ACCEPT"]
    assert rows[H1].reasons[0].endswith("REPLAY_MISMATCH") and rows[H1].slashed == 7
    assert snap.chain.txs == 2 and snap.chain.host_slashed == 7
    assert rows[H0].reward == 5 and snap.chain.rewards == 5
    assert snap.steps[0].accepted == ["host-0"] and snap.steps[0].result_votes == {"host-0": "1" * 64}
    assert evaluate(snap, expect_finished=True, expect_all_honest=False) == [
        "fewer than two global validation losses were reported"
    ]  # an unknown host's rejection is not judged; a known honest one would be


@pytest.fixture
def http_url() -> Iterator[str]:
    """A loopback HTTP server answering a few fixed paths (stopped after the test)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    bodies = {
        "/ok/status": b'{"phase": "TRAINING", "outer_step": 2, "loss": 4.5, "val_loss": {"0": 5.0, "x": 1}}',
        "/list/status": b"[1, 2]",
        "/huge/status": b"{" + b" " * (2 << 20) + b"}",
        "/ok/blobs/delta/" + "d" * 64: b"z" * 1234,
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = bodies.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_node_reads_are_bounded_and_never_raise(http_url: str) -> None:
    from gonka_diloco.collect import delta_bytes, fetch_status, update_from_status
    from gonka_diloco.report import NodeRow

    status = fetch_status(f"{http_url}/ok")
    assert status is not None and status["phase"] == "TRAINING"
    row = update_from_status(NodeRow(name="host-0", role="host"), status)
    assert (row.state, row.local_loss, row.val_loss) == ("TRAINING", {2: 4.5}, {0: 5.0})  # "x" skipped
    assert fetch_status(f"{http_url}/list") is None  # JSON, but not an object
    assert fetch_status(f"{http_url}/huge") is None  # over the 1 MiB bound
    assert fetch_status(f"{http_url}/missing") is None
    assert fetch_status("http://127.0.0.1:9") is None  # nobody listening
    assert delta_bytes(f"{http_url}/ok", "d" * 64) == 1234
    assert delta_bytes(f"{http_url}/ok", "e" * 64) is None
    assert delta_bytes(None, "d" * 64) is None


# ---------------------------------------------------------------- reports of runs on a chain (not a devnet)


def _chain_step(**kw: object) -> dict:
    step = {
        "outer_step": 0, "phase": "DONE", "accepted": [H0, H1], "base_model_hash": "0" * 64,
        "result_hash": "1" * 64, "result_votes": {H0: "1" * 64, H1: "1" * 64}, "committed": [H0, H1],
        "outcomes": {H0: "accepted", H1: "accepted"}, "open_height": 3, "commit_deadline": 12,
        "done_height": 30,
    }  # fmt: skip
    return {**step, **kw}


class ChainOfThree(FakeChain):
    """Three hosts (H2 joined in time but committed nothing), one verifier; votes carry losses."""

    def __init__(self, losses: dict[str, int]) -> None:
        super().__init__()
        V = "gonka1" + "x" * 38
        self.answers["participants"] = {
            "participants": [
                {"address": a, "role": "host", "endpoint": "", "joined_height": 2} for a in (H0, H1, H2)
            ] + [{"address": V, "role": "verifier", "endpoint": "", "joined_height": 2}]
        }  # fmt: skip
        self.answers["run"] = {**self.answers["run"], "created_height": 1}
        votes = dict.fromkeys(losses, "1" * 64)
        self.answers["outer_step"] = _chain_step(result_votes=votes, result_losses=losses)
        commits = [{"host": h, "delta_hash": "d" * 64, "tokens": 640} for h in (H0, H1)]
        self.answers["commitments"] = {"commitments": commits}


def test_a_chain_run_reads_its_loss_from_the_votes_and_lists_sit_outs(tmp_path: Path) -> None:
    from gonka_diloco.collect import collect

    snap = collect(ChainOfThree({H0: 2_461_234, H1: 2_461_234}), 1)
    snap.source = "chain"
    assert snap.steps[0].val_loss == pytest.approx(2.461234)
    assert snap.val_loss() == {0: pytest.approx(2.461234)}
    assert [(o.address, o.outer_step, o.joined_height) for o in snap.sit_outs] == [(H2, 0, 2)]
    assert snap.notes == []  # the honest voters agree exactly
    text = write_report(snap, tmp_path).read_text()
    assert "| 0 | 1,280 | 2.4612 |" in text  # the loss table, from chain data alone
    assert "## Sit-outs" in text and "| gonka1zzzz…zzzz | 0 | 2 |" in text
    assert "| sit-outs | 1 |" in text and "| blocks / txs of the run | 30 / n/a |" in text
    # described, not judged: no devnet wording
    for devnet_word in ("adversarial", "PASS", "FAIL", "## Failures", "unknown"):
        assert devnet_word not in text, devnet_word


def test_a_loss_liar_is_named_and_does_not_move_the_reported_loss() -> None:
    """`loss_liar` (the adversary library): honest work, a vote whose loss is bent. Next to two honest
    voters it is named and the median stays the honest value; the honest ones are not named."""
    from gonka_diloco.adversaries import resolve_host
    from gonka_diloco.collect import collect

    honest = 2_461_234
    lie = resolve_host("loss_liar").result_loss(honest, None)  # type: ignore[arg-type]
    assert lie != honest
    snap = collect(ChainOfThree({H0: honest, H1: honest, H2: lie}), 1)
    assert snap.steps[0].val_loss == pytest.approx(honest / 1e6)
    assert len(snap.notes) == 1 and "disagree" in snap.notes[0]
    assert "gonka1zzzz" in snap.notes[0]
    assert "gonka1qqqq" not in snap.notes[0] and "gonka1pppp" not in snap.notes[0]
    # votes for another model and zero (absent) losses are not counted
    other = collect(ChainOfThree({H0: honest, H1: 0}), 1)
    assert other.steps[0].loss_votes == {other.nodes[0].name: honest / 1e6}


def test_counts_cover_the_run_only() -> None:
    from chain.client import Block, Event, TxResult
    from gonka_diloco.collect import BlockTally, scan_blocks

    def tx(run: str | None) -> TxResult:
        events = (Event("join_run", {"run_id": run}),) if run else (Event("transfer", {"amount": "5"}),)
        return TxResult("h", 0, 0, "", "", 1, 1, events)

    class Blocks:
        def block(self, height: int) -> Block:
            txs = (tx("1"), tx("2"), tx(None)) if height % 2 else (tx("1"),)
            return Block(height, "x", float(height), "a", "p", txs)

    tally = scan_blocks(Blocks(), 1, BlockTally(), 20, from_height=11)
    assert tally.scanned_to == 20 and tally.txs == 10  # run 1's only, blocks 11..20
    assert (tally.first_time, tally.last_time) == (11.0, 20.0)
    huge = scan_blocks(Blocks(), 1, BlockTally(), 10**6, from_height=1)
    assert huge.skipped == 10**6 and huge.txs == 0


def test_report_command_on_a_chain_it_cannot_read() -> None:
    result = CliRunner().invoke(app, ["report", "http://127.0.0.1:9", "--run-id", "1"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "cannot reach the chain at http://127.0.0.1:9" in lines[0]
