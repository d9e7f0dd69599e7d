"""`gonka-diloco init`: the run.toml, host.toml and verifier.toml it writes fit together."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gonka_diloco.cli import app
from gonka_diloco.init_cli import BYTE_VOCAB
from gonka_diloco.run_cli import load_run_config
from protocol.config import Stake
from protocol.keys import Keyring
from trainer.node_config import load_host_config
from verifier.node_config import load_verifier_config

runner = CliRunner()


def init(tmp_path: Path, *args: str):
    keys = ["--keyring-dir", str(tmp_path / "keys")]
    return runner.invoke(app, ["init", "--dir", str(tmp_path / "cfg"), *keys, *args])


def one_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in errors[0], result.output


def test_the_configs_fit_together_and_name_their_keys(tmp_path: Path) -> None:
    r = init(tmp_path, "--hosts", "3", "--verifiers", "2", "--model", "gpt-tiny", "-H", "20", "-s", "2",
             "--base-port", "27100")  # fmt: skip
    assert r.exit_code == 0, r.output
    cfg = tmp_path / "cfg"
    run = load_run_config(cfg / "run.toml")  # exactly what `run create` reads
    hosts = [load_host_config(cfg / f"host-{i}.toml") for i in range(3)]
    verifiers = [load_verifier_config(cfg / f"verifier-{i}.toml") for i in range(2)]
    assert run.max_outer_steps == 10 and run.phases.min_hosts == 3 and run.phases.min_verifiers == 2
    assert run.phases.early_close and run.seq_len <= 64  # within gpt-tiny's context
    assert run.verifiers_per_contribution == 2 and run.audit_bps == 0  # nobody left to audit
    assert all(h.stake >= run.stake.min_host_stake for h in hosts)
    assert all(v.stake >= run.stake.min_verifier_stake for v in verifiers)
    nodes = [*hosts, *verifiers]
    assert len({n.data_path for n in nodes}) == 5 and len({n.listen for n in nodes}) == 5
    assert {n.listen for n in nodes} == {f"127.0.0.1:{27100 + i}" for i in range(5)}
    ring = Keyring(tmp_path / "keys")
    assert ring.names() == ["host-0", "host-1", "host-2", "verifier-0", "verifier-1"]
    assert str(hosts[1].wallet().address()) == ring.show("host-1").address  # the key the config names
    # the printed next steps fund every key with its stake and some fees
    assert "--authority authority --fund host-0:11GNK" in r.output and "--fund verifier-1:2GNK" in r.output
    # a second init keeps the keys and refuses to overwrite silently
    one_error(init(tmp_path, "--model", "gpt-tiny"), "already holds run.toml", "--force")
    again = init(tmp_path, "--hosts", "3", "--verifiers", "2", "--model", "gpt-tiny", "--force")
    assert again.exit_code == 0 and "created key" not in again.output
    assert ring.show("host-1").address == str(hosts[1].wallet().address())


def test_enough_verifiers_turn_audits_on_and_the_defaults_fit(tmp_path: Path) -> None:
    assert init(tmp_path, "--verifiers", "6", "--model", "gpt-small", "--no-keys").exit_code == 0
    run = load_run_config(tmp_path / "cfg" / "run.toml")
    assert run.verifiers_per_contribution == 4 and run.audit_verifiers == 2 and run.audit_bps == 10_000
    assert run.inner_steps == 500 and run.sampled_segments == 8  # RunConfig's defaults otherwise
    assert not (tmp_path / "keys").exists() or Keyring(tmp_path / "keys").names() == []


def test_the_node_defaults_fit_the_run_defaults() -> None:
    """host.toml / verifier.toml left at their default stake can join a run left at its defaults."""
    from trainer.node_config import HostConfig
    from verifier.node_config import VerifierConfig

    base = {"chain_url": "http://x", "run_id": 1, "data_dir": "d", "key": {"test_index": 1}}
    assert HostConfig.model_validate(base).stake >= Stake().min_host_stake
    assert VerifierConfig.model_validate(base).stake >= Stake().min_verifier_stake


def test_byte_vocabulary_matches_the_model() -> None:
    from replay.model import VOCAB_SIZE

    assert BYTE_VOCAB == VOCAB_SIZE


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--hosts", "0"], ["--hosts must be at least 1"]),
        (["--verifiers", "0"], ["--verifiers must be at least 1"]),
        (["--outer-steps", "0"], ["--outer-steps must be at least 1"]),
        (["--model", "gpt-huge"], ["--model 'gpt-huge'", "llama-tiny"]),
        (["--model", "gpt-tiny", "-H", "10", "-k", "5", "-s", "3"], ["s) = 3 cannot exceed H/k = 10/5 = 2"]),
        (["--model", "gpt-tiny", "-H", "12", "-k", "5"], ["(H) = 12 must be a multiple of segment_len"]),
        (["--dataset", "/nonexistent/data"], ["--dataset /nonexistent/data"]),
        (["--model", "gpt-tiny", "--step-seconds", "-1"], ["--step-seconds"]),
    ],
)
def test_bad_choices_are_one_line(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    one_error(init(tmp_path, "--no-keys", *args), *needles)
    assert not (tmp_path / "cfg").exists()  # nothing half-written


def test_a_dataset_sizes_the_vocabulary_and_pins_its_hash(tmp_path: Path) -> None:
    from replay.prepare import PrepareOptions, prepare

    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 400)
    prepare([str(tmp_path / "corpus.txt")], tmp_path / "data", PrepareOptions(train_bpe=300))
    one_error(init(tmp_path, "--no-keys", "--model", "gpt-tiny", "--dataset", str(tmp_path / "data")),
              "embeds bytes (256 tokens)", "llama-*")  # fmt: skip
    r = init(tmp_path, "--no-keys", "--model", "llama-tiny", "--dataset", str(tmp_path / "data"))
    assert r.exit_code == 0, r.output
    text = (tmp_path / "cfg" / "run.toml").read_text()
    data = tomllib.loads(text)
    from replay.data import open_dataset

    corpus = open_dataset(str(tmp_path / "data"))
    assert corpus.manifest is not None and corpus.manifest.tokenizer.vocab_size > 256
    assert data["model"]["config"]["vocab_size"] == corpus.manifest.tokenizer.vocab_size
    assert data["dataset_manifest_hash"] == corpus.manifest_hash  # `run create` without --dataset agrees
    host = load_host_config(tmp_path / "cfg" / "host-0.toml")
    assert Path(host.dataset_source) == (tmp_path / "data").resolve()
