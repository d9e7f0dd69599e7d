"""Bad input at the command line, as an operator meets it: the real `gonka-diloco` executable in a
subprocess, and for each mistake exactly one line on stderr that names the setting or address at
fault, never a traceback (issue 27: unreachable chains, busy ports, a shared chain home, a run that
does not exist yet, non-UTF-8 corpora, configs checked before torch is imported)."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gonka_diloco.procs import NodeProcess, python_cli

BIN = Path(sys.executable).parent / "gonka-diloco"


def cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def one_line_error(r: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """stderr is a single `error: …` line holding every fragment; no traceback anywhere."""
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: "), lines[0]
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_toml(
    path: Path, chain_url: str, run_id: int = 1, listen: str = "127.0.0.1:0", index: int = 1
) -> Path:
    path.write_text(
        f'chain_url = "{chain_url}"\nrun_id = {run_id}\ndata_dir = "{path.stem}-data"\nlisten = "{listen}"\n'
        f"[key]\ntest_index = {index}\n"
    )
    return path


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[str]:
    node = NodeProcess(
        "chain",
        python_cli(
            "chain", "start", "--home", str(tmp_path / "chain"), "--port", "0", "--block-interval", "0.1"
        ),
        tmp_path / "chain.log",
    )
    node.start()
    try:
        yield node.wait_listening(60)
    finally:
        node.stop()


# ---------------------------------------------------------------- an unreachable chain


@pytest.mark.parametrize("role", ["host", "verifier"])
def test_a_node_whose_chain_does_not_answer_waits_then_names_the_url(tmp_path: Path, role: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    config = node_toml(tmp_path / f"{role}.toml", url)
    r = cli(role, "run", "-c", str(config), "--chain-wait", "1")
    assert r.returncode == 1
    one_line_error(r, f"cannot reach the chain at {url} (chain_url) within 1 s", "Connection refused")
    waited = [json.loads(x) for x in r.stdout.splitlines() if '"waiting_for_chain"' in x]
    assert waited and waited[0]["url"] == url  # the wait said where it was looking, once


# ---------------------------------------------------------------- a run that does not exist yet


def test_a_node_started_before_its_run_fails_in_one_line_or_waits_for_it(tmp_path: Path, chain: str) -> None:
    host = node_toml(tmp_path / "host.toml", chain, run_id=1)
    r = cli("host", "run", "-c", str(host))
    assert r.returncode == 1
    one_line_error(r, "run 1 (run_id) does not exist", chain, "--wait")

    verifier = node_toml(tmp_path / "verifier.toml", chain, run_id=1, index=2)
    proc = subprocess.Popen(
        [str(BIN), "verifier", "run", "-c", str(verifier), "--wait"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert _wait_for_event(proc, "waiting_for_run", 90)["run_id"] == 1
        run = tmp_path / "run.toml"
        run.write_text(
            'name = "later"\ninner_steps = 10\nsegment_len = 5\nsampled_segments = 1\n[model]\n'
            'factory = "trainer.model:small_gpt"\nconfig = { n_layer = 1, n_head = 2, n_embd = 16 }\n'
            "[phases]\njoin_blocks = 100000\n"
        )
        created = cli("run", "create", str(run), "--chain-url", chain, "--test-index", "0")
        assert created.returncode == 0, created.stderr
        assert _wait_for_event(proc, "environment", 90)  # past the wait: setting up for the run
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)


def _wait_for_event(proc: subprocess.Popen[str], event: str, timeout: float) -> dict:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            break
        if f'"{event}"' in line:
            return json.loads(line)
    raise AssertionError(f"no {event} event; stderr: {proc.stderr.read() if proc.poll() is not None else ''}")


# ---------------------------------------------------------------- ports and homes


def test_a_host_whose_listen_address_is_taken_names_listen(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        config = node_toml(tmp_path / "host.toml", "http://127.0.0.1:9", listen=address)
        r = cli("host", "run", "-c", str(config))
    assert r.returncode == 2
    one_line_error(r, f"listen = '{address}'", "Address already in use")


def test_chain_start_on_a_busy_port_names_the_port(tmp_path: Path, chain: str) -> None:
    port = chain.rsplit(":", 1)[1]
    r = cli("chain", "start", "--home", str(tmp_path / "other"), "--port", port)
    assert r.returncode == 2
    one_line_error(r, f"127.0.0.1:{port} (--host/--port)", "Address already in use")


def test_a_second_chain_on_the_same_home_is_refused(tmp_path: Path, chain: str) -> None:
    r = cli("chain", "start", "--home", str(tmp_path / "chain"), "--port", "0")
    assert r.returncode == 2
    one_line_error(r, f"--home {tmp_path / 'chain'} is in use by another chain node (pid ")


# ---------------------------------------------------------------- configs: checked before torch loads

CHECK_BEFORE_TORCH = """
import sys
from typer.testing import CliRunner
from gonka_diloco.cli import app
r = CliRunner().invoke(app, sys.argv[1:])
print("EXIT", r.exit_code, "TORCH", "torch" in sys.modules)
print(r.output)
"""


COMMANDS = [["run", "create", "{config}", "--dry-run"], ["host", "run", "-c", "{config}"],
            ["verifier", "run", "-c", "{config}"]]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_config_is_reported_before_torch_is_imported(tmp_path: Path, command: list[str]) -> None:
    """What the file alone decides is an error in about a second: torch (and transformers) are
    imported only once the TOML parsed and validated."""
    if command[0] == "run":
        (config := tmp_path / "run.toml").write_text(
            'inner_steps = 10\nsegment_len = 3\n[model]\nfactory = "trainer.model:small_gpt"\n'
        )
        expected = "multiple of segment_len"
    else:
        (config := tmp_path / "node.toml").write_text(
            'chain_url = "http://127.0.0.1:9"\nrun_id = 1\ndata_dir = "d"\nlistne = "x"\n'
            "[key]\ntest_index = 1\n"
        )
        expected = "listne"
    args = [a.replace("{config}", str(config)) for a in command]
    out = subprocess.run([sys.executable, "-c", CHECK_BEFORE_TORCH, *args], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "EXIT 2 TORCH False" in out.stdout and expected in out.stdout, out.stdout


# ---------------------------------------------------------------- data prepare


def test_data_prepare_on_a_non_utf8_file(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "good.txt").write_text("to be or not to be " * 500)
    (corpus / "bad.txt").write_bytes(b"fair is foul " * 200 + b"\xff\xfe" + b" and foul is fair" * 50)
    strict = cli("data", "prepare", str(corpus), "--out", str(tmp_path / "strict"))
    assert strict.returncode == 2
    one_line_error(strict, f"{corpus / 'bad.txt'}: not UTF-8 text at byte 2600", "--errors replace")
    assert not (tmp_path / "strict").exists()  # nothing half-written is left behind

    skip = cli("data", "prepare", str(corpus), "--out", str(tmp_path / "skip"), "--errors", "skip")
    assert skip.returncode == 0, skip.stderr
    assert f"skipped {corpus / 'bad.txt'}: not UTF-8 text at byte 2600" in skip.stderr
    skipped = json.loads(skip.stdout)
    assert skipped["skipped"] == [str(corpus / "bad.txt")]

    replace = cli("data", "prepare", str(corpus), "--out", str(tmp_path / "replace"), "--errors", "replace")
    assert replace.returncode == 0, replace.stderr
    replaced = json.loads(replace.stdout)
    assert "skipped" not in replaced
    # every byte of both files, the two bad ones decoded as U+FFFD (3 bytes each in the byte tokenizer)
    total = (corpus / "good.txt").stat().st_size + (corpus / "bad.txt").stat().st_size - 2 + 2 * 3
    assert replaced["train_tokens"] + replaced["val_tokens"] == total
    assert skipped["train_tokens"] + skipped["val_tokens"] == (corpus / "good.txt").stat().st_size


# ---------------------------------------------------------------- small things


def test_version_and_the_verifier_flags() -> None:
    from importlib.metadata import version

    r = cli("--version")
    assert r.returncode == 0 and r.stdout.startswith(f"gonka-diloco {version('gonka-diloco')} (torch ")
    helped = cli("verifier", "run", "--help")
    assert helped.returncode == 0
    for flag in ("-c", "--config", "--linger", "--wait", "--chain-wait"):
        assert flag in helped.stdout, flag


def test_block_seconds_and_the_chain_wait_have_one_source() -> None:
    import typer

    from chain.params import BLOCK_SECONDS
    from gonka_diloco import host_cli, run_cli, verifier_cli
    from nodekit.reach import DEFAULT_CHAIN_WAIT

    def default(app: typer.Typer, command: str, param: str) -> object:
        cmd = typer.main.get_command(app)
        sub = cmd.commands[command] if hasattr(cmd, "commands") else cmd  # type: ignore[attr-defined]
        return next(p.default for p in sub.params if p.name == param)

    from chain import cli as chain_cli

    assert default(chain_cli.app, "start", "block_interval") == BLOCK_SECONDS
    assert default(run_cli.app, "create", "block_seconds") == BLOCK_SECONDS
    assert host_cli.DEFAULT_CHAIN_WAIT == verifier_cli.DEFAULT_CHAIN_WAIT == DEFAULT_CHAIN_WAIT
