"""The README's by-hand recipe, as an operator runs it: every step a separate process.

`init` writes matching configs and keys, `chain start --authority/--fund` makes a local chain that
funds them, `run create` creates the run, two hosts and one verifier run it to the end and exit,
`status` shows it finished, and `report` — run after every node has exited — still has the
validation loss table, read from the result votes on chain; `model export` still reads the final
model from a host's disk by the chain's hash, and `model sample` loads it. Tiny model, two outer
steps, 0.2 s blocks, early-closing windows.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from gonka_diloco.procs import NodeProcess, python_cli

BLOCK = "0.2"


TIMES: dict[str, float] = {}


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    t = time.monotonic()
    out = subprocess.run(python_cli(*args), capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    TIMES[" ".join(args[:2])] = time.monotonic() - t
    assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    return out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_readme_recipe_runs_as_separate_processes(tmp_path: Path) -> None:
    started = time.monotonic()
    env = {**os.environ, "GONKA_KEYRING_DIR": str(tmp_path / "keys"), "PYTHONUNBUFFERED": "1"}
    # 1. configs that fit, and the keys they name
    init = _cli("init", "--dir", "mine", "--hosts", "2", "--verifiers", "1", "--model", "gpt-tiny",
                "-H", "10", "-k", "5", "-s", "1", "--outer-steps", "2", "--step-seconds", "0.5",
                "--block-seconds", BLOCK, env=env, cwd=tmp_path)  # fmt: skip
    assert init.returncode == 0, init.stderr
    start_line = next(line.strip() for line in init.stdout.splitlines() if "chain start" in line)
    funds = re.findall(r"--fund (\S+)", start_line)
    assert funds == ["host-0:11GNK", "host-1:11GNK", "verifier-0:2GNK"]
    # 2. a local chain: key `authority` (created now) may create runs, the nodes' keys are funded
    argv = python_cli("chain", "start", "--home", "mine/chain", "--port", "0", "--block-interval", BLOCK,
                      "--authority", "authority", *(a for f in funds for a in ("--fund", f)))  # fmt: skip
    chain = NodeProcess("chain", argv, tmp_path / "chain.log", env=env, cwd=tmp_path)
    nodes: list[NodeProcess] = []
    chain.start()
    try:
        url = chain.wait_listening(60)
        env["GONKA_CHAIN_URL"] = url  # what every command's --chain-url reads
        for name in ("mine/host-0.toml", "mine/host-1.toml", "mine/verifier-0.toml"):
            path = tmp_path / name
            path.write_text(path.read_text().replace("http://127.0.0.1:26657", url))
        balance = _cli("keys", "balance", "host-0", env=env, cwd=tmp_path)
        assert json.loads(balance.stdout)["gnk"] == "11GNK", balance.stdout + balance.stderr
        # 3. the run (init sized its train phase generously: windows close once every host committed)
        created = _cli("run", "create", "mine/run.toml", "--key", "authority", env=env, cwd=tmp_path)
        assert created.returncode == 0, created.stdout + created.stderr
        assert json.loads(created.stdout)["run_id"] == 1
        # 4. two hosts and a verifier, each its own process; they leave when the run ends
        for name in ("host-0", "host-1", "verifier-0"):
            role = name.split("-")[0]
            node = NodeProcess(name, python_cli(role, "run", "--config", f"mine/{name}.toml"),
                               tmp_path / f"{name}.log", env=env, cwd=tmp_path)  # fmt: skip
            node.start()
            nodes.append(node)
        t = time.monotonic()
        for node in nodes:
            assert node.proc is not None
            code = node.proc.wait(timeout=180)
            assert code == 0, f"{node.name} exited {code}: {node.log_path.read_text()[-3000:]}"
        TIMES["nodes (start to exit)"] = time.monotonic() - t
        # 5. status and report after every node has exited
        status = _cli("status", "--run-id", "1", env=env, cwd=tmp_path)
        assert status.returncode == 0 and "finished" in status.stdout, status.stdout + status.stderr
        report = _cli("report", url, "--run-id", "1", "--out", "report", env=env, cwd=tmp_path)
        assert report.returncode == 0, report.stdout + report.stderr
        text = (tmp_path / "report" / "report.md").read_text()
        # 6. the trained model out, after the nodes exited: nobody serves it any more, but it is on
        # the hosts' disks, read there by the hash the chain adopted
        chain_run = ("--chain", url, "--run", "1")
        gone = _cli("model", "export", *chain_run, "--out", "fetched", env=env, cwd=tmp_path)
        assert gone.returncode == 1
        assert gone.stderr.startswith("error: no node of run 1 serves its final model"), gone.stderr
        exported = _cli("model", "export", "mine/host-0", *chain_run, "--out", "model", env=env, cwd=tmp_path)
        assert exported.returncode == 0, exported.stdout + exported.stderr
        sample = ("model", "sample", "model", "--prompt", "To be", "--tokens", "20")
        sampled = _cli(*sample, env=env, cwd=tmp_path)
        assert sampled.returncode == 0 and sampled.stdout.startswith("To be"), sampled.stdout + sampled.stderr
    finally:
        for node in nodes:
            node.stop()
        chain.stop()
    table = re.findall(r"^\| ([01]) \| [\d,]+ \| (\d+\.\d{4}) \| [\d.]+ \|$", text, re.M)
    assert [step for step, _ in table] == ["0", "1"], text  # the loss table, from chain data alone
    assert float(table[1][1]) < float(table[0][1])  # it learns
    assert "| contributions accepted / rejected | 4 / 0 |" in text and "| sit-outs | 0 |" in text
    assert "| host-1 | 1 | accepted | verifier-0: ACCEPT |" in text  # named by the local keyring
    for devnet_word in ("adversarial", "PASS", "FAIL"):
        assert devnet_word not in text
    assert "did not answer /status" in report.stdout  # the nodes are gone, and the report says so
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in TIMES.items())
    print(f"recipe: {time.monotonic() - started:.1f} s; {steps}")
