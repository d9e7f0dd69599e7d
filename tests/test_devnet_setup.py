"""The devnet on an operator's own data, and what it prints while it runs (issue 27).

`devnet --model llama-tiny --dataset data/mine` sizes the model's vocabulary to the dataset's
tokenizer and checks the dataset before it starts any process; without a terminal it prints plain
progress lines, and its live view uses the terminal's width.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from gonka_diloco.devnet import check_dataset, model_spec
from gonka_diloco.devnet_config import DevnetConfig, DevnetConfigError
from gonka_diloco.live import LiveState, NodeView, progress_line, render
from replay.prepare import PrepareOptions, prepare

BIN = Path(sys.executable).parent / "gonka-diloco"


@pytest.fixture(scope="module")
def bpe_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared dataset whose vocabulary (300) is larger than every preset's 256 bytes."""
    root = tmp_path_factory.mktemp("data")
    text = root / "corpus.txt"
    words = " ".join(f"word{i % 97} thing{i % 31}" for i in range(20_000))
    text.write_text(words)
    out = root / "mine"
    prepare([str(text)], out, PrepareOptions(name="mine", train_bpe=300))
    return out


@pytest.mark.parametrize("model", ["gpt", "llama-tiny"])
def test_the_model_vocabulary_is_sized_to_the_dataset(bpe_dataset: Path, model: str) -> None:
    cfg = DevnetConfig(model=model, dataset=str(bpe_dataset), hosts=2, verifiers=1, adversaries=[])
    assert model_spec(cfg).config["vocab_size"] == 300
    check_dataset(cfg)  # fits: nothing to say
    plain = DevnetConfig(model=model, hosts=2, verifiers=1, adversaries=[])
    assert model_spec(plain).config.get("vocab_size", 256) == 256  # Shakespeare bytes: unchanged


def test_a_dataset_too_small_for_the_run_is_one_line_before_any_process(tmp_path: Path) -> None:
    text = tmp_path / "tiny.txt"
    text.write_text("a few words only " * 4)
    prepare([str(text)], tmp_path / "tiny", PrepareOptions(name="tiny", val_fraction=0.5))
    cfg = DevnetConfig(dataset=str(tmp_path / "tiny"), hosts=2, verifiers=1, adversaries=[], seq_len=32)
    with pytest.raises(DevnetConfigError, match="fewer than seq_len \\+ 1 = 33"):
        check_dataset(cfg)
    runs = tmp_path / "runs"
    r = subprocess.run(
        [str(BIN), "devnet", "--dataset", str(tmp_path / "nowhere"), "--out-dir", str(runs), "--no-live"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and str(tmp_path / "nowhere") in line
    assert not runs.exists()  # refused before a folder, a chain or a node


def _state() -> LiveState:
    state = LiveState(run_id=1, height=42, outer_step=2, outer_steps=6, phase="VERIFY",
                      run_status="active", elapsed_s=31.0, committed=3, accepted=["host-0"],
                      val_loss={0: 3.5, 1: 3.1})  # fmt: skip
    state.nodes = [NodeView("host-0", "host"), NodeView("verifier-0", "verifier", alive=False)]
    state.events.append("host-0: committed outer_step=2 delta_hash=" + "ab" * 32 + " tokens=12800 end-marker")
    return state


def test_the_live_view_uses_the_terminal_width() -> None:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render(_state()))
    line = next(x for x in out.getvalue().splitlines() if "host-0: committed" in x)
    assert "end-marker" in line  # a 200-column terminal shows the whole 130-column event
    narrow = io.StringIO()
    Console(file=narrow, width=80, color_system=None).print(render(_state()))
    assert all(len(x) <= 80 for x in narrow.getvalue().splitlines())  # cut at the width, not wrapped


def test_progress_line() -> None:
    line = progress_line(_state())
    assert line.startswith("devnet: 31s  block 42  outer step 2/6 VERIFY")
    assert "nodes up 1/2" in line and "0:3.500 1:3.100" in line and "\n" not in line


def test_the_devnet_prints_progress_lines_into_a_pipe(tmp_path: Path) -> None:
    """A piped `devnet` (CI, tee) prints each process as it comes up and then a plain line per
    outer step and every few seconds, not one frame at the end."""
    toml = tmp_path / "devnet.toml"
    toml.write_text(
        "hosts = 1\nverifiers = 1\nadversaries = []\nouter_steps = 2\ninner_steps = 5\nsegment_len = 5\n"
        'sampled_segments = 1\nbatch_size = 2\nseq_len = 16\nmodel_size = "tiny"\nblock_interval = 0.2\n'
        "timeout = 240.0\n[phases]\njoin = 1.0\ntrain = 3.0\nreveal = 1.0\nverify = 2.0\nresult = 2.0\n"
    )
    r = subprocess.run(
        [str(BIN), "devnet", "--config", str(toml), "--out-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=400, env={**os.environ, "TERM": "xterm-256color"},
    )  # fmt: skip
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    for expected in ("devnet: starting the chain", "devnet: run 1 created; starting 2 nodes",
                     "devnet: host-0 listening at http://",
                     "devnet: verifier-0 listening at http://"):  # fmt: skip
        assert expected in out, expected
    steps = [x for x in out.splitlines() if x.startswith("devnet: ") and " outer step " in x]
    assert any("outer step 0/2" in x for x in steps) and any("outer step 1/2" in x for x in steps)
    assert "╭" not in out.split("devnet: report at")[0]  # no rich frame before the summary
    assert json.loads((next((tmp_path / "runs").iterdir()) / "snapshot.json").read_text())["failures"] == []
