"""The `gonka-diloco` CLI: help everywhere, keys, run create, devnet config errors, status."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gonka_diloco.cli import LAZY, app
from gonka_diloco.devnet_config import DevnetConfigError, load_config, parse_adversary
from gonka_diloco.procs import NodeProcess, python_cli
from protocol.keys import TEST_MNEMONIC, test_wallet

runner = CliRunner()

TINY_RUN = """
name = "cli-test"
seed = 3
inner_steps = 10
segment_len = 5
sampled_segments = 1
[model]
factory = "trainer.model:small_gpt"
config = { n_layer = 1, n_head = 2, n_embd = 16, block_size = 64 }  # the default seq_len's context
[phases]
join_blocks = 100000  # outer step 0 stays PENDING however slowly the test runs
"""


def invoke(*args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input)


# ---------------------------------------------------------------- help


def test_top_level_help_does_not_import_the_nodes() -> None:
    """`--help` must stay fast: it lists lazy sub-apps without importing torch, FastAPI or cosmpy."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from gonka_diloco.cli import app\n"
        "r = CliRunner().invoke(app, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "heavy = sorted(m for m in ('torch', 'fastapi', 'cosmpy') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["devnet"],
        ["report"],
        ["keys"],
        ["keys", "add"],
        ["keys", "list"],
        ["keys", "show"],
        ["keys", "send"],
        ["keys", "balance"],
        ["keys", "encrypt"],
        ["init"],
        ["run"],
        ["run", "create"],
        ["status"],
        ["chain"],
        ["host"],
        ["verifier"],
        ["model"],
        ["model", "export"],
        ["model", "sample"],
    ],
)
def test_every_command_has_help(args: list[str]) -> None:
    result = invoke(*args, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output
    assert "--help" in result.output


def test_help_lists_every_command() -> None:
    out = invoke("--help").output
    for name in [*LAZY, "devnet", "report"]:
        assert name in out


# ---------------------------------------------------------------- keys


def test_keys_add_list_show(tmp_path: Path) -> None:
    ring = str(tmp_path / "ring")
    made = invoke("keys", "add", "alice", "--keyring-dir", ring)
    assert made.exit_code == 0, made.output
    assert "Write this mnemonic down" in made.output
    alice = next(line.split(": ")[1] for line in made.output.splitlines() if line.startswith("address: "))
    assert alice.startswith("gonka1")
    assert (tmp_path / "ring" / "alice.json").stat().st_mode & 0o077 == 0

    mnemonic = tmp_path / "m.txt"
    mnemonic.write_text(TEST_MNEMONIC + "\n")
    imported = invoke("keys", "add", "dev", "--keyring-dir", ring, "--mnemonic-file", str(mnemonic))
    assert imported.exit_code == 0, imported.output
    assert "mnemonic" not in imported.output.lower().replace("--mnemonic", "")  # never echoes an imported one

    shown = invoke("keys", "show", "dev", "--address", "--keyring-dir", ring)
    assert shown.output.strip() == str(test_wallet(0).address())  # coin type 1200, index 0

    listed = invoke("keys", "list", "--keyring-dir", ring)
    assert listed.exit_code == 0
    assert "alice" in listed.output and alice in listed.output and "dev" in listed.output


def test_keys_recover_from_stdin(tmp_path: Path) -> None:
    result = invoke(
        "keys", "add", "r", "--recover", "--keyring-dir", str(tmp_path), input=TEST_MNEMONIC + "\n"
    )
    assert result.exit_code == 0, result.output
    assert str(test_wallet(0).address()) in result.output


def test_keys_errors_are_one_clear_line(tmp_path: Path) -> None:
    ring = str(tmp_path)
    assert invoke("keys", "add", "a", "--keyring-dir", ring).exit_code == 0
    dup = invoke("keys", "add", "a", "--keyring-dir", ring)
    assert dup.exit_code == 1 and "already exists" in dup.output
    missing = invoke("keys", "show", "nobody", "--keyring-dir", ring)
    assert missing.exit_code == 1 and "no key named 'nobody'" in missing.output
    bad = invoke("keys", "add", "b", "--recover", "--keyring-dir", ring, input="not a mnemonic\n")
    assert bad.exit_code == 1 and "error" in bad.output
    assert "Traceback" not in dup.output + missing.output + bad.output


# ---------------------------------------------------------------- run create


def test_run_create_dry_run_fills_in_the_hashes(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(TINY_RUN)
    result = invoke("run", "create", str(path), "--dry-run")
    assert result.exit_code == 0, result.output
    assert '"initial_model_hash": "' in result.output
    assert '"dataset_manifest_hash": "' in result.output
    assert '"inner_steps": 10' in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("inner_steps = [", "not valid TOML"),
        ("inner_steps = 10", "[model] is required"),
        (TINY_RUN.replace("segment_len = 5", "segment_len = 3"), "multiple of segment_len"),
        (TINY_RUN + "bogus = 1\n", "bogus: Extra inputs are not permitted"),
        (TINY_RUN.replace("trainer.model:small_gpt", "os:system"), "not a factory the chain can count"),
        (
            TINY_RUN.replace("trainer.model:small_gpt", "os:system").replace(
                "block_size = 64 }", "block_size = 64, param_count = 4096 }"
            ),
            "not on this node's allow-list",
        ),
    ],
)
def test_run_create_bad_config(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "run.toml"
    path.write_text(text)
    result = invoke("run", "create", str(path), "--dry-run")
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_run_create_overlap_option_sets_the_schedule(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(TINY_RUN)
    result = invoke("run", "create", str(path), "--dry-run", "--overlap", "eager")
    assert result.exit_code == 0, result.output
    assert '"overlap": "eager"' in result.output
    bad = invoke("run", "create", str(path), "--dry-run", "--overlap", "eagre")
    assert bad.exit_code == 2 and "expected one of none, eager" in bad.output


def test_the_removed_delayed_schedule_is_refused_in_one_line(tmp_path: Path) -> None:
    """Issue 22: `overlap = "delayed"` is gone; the flag and the run config name the field and
    the allowed values in one line, never a traceback."""
    path = tmp_path / "run.toml"
    path.write_text('overlap = "delayed"' + TINY_RUN)
    result = invoke("run", "create", str(path), "--dry-run")
    assert result.exit_code == 2, result.output
    assert "overlap: Input should be 'none' or 'eager'" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    (tmp_path / "ok.toml").write_text(TINY_RUN)
    flag = invoke("run", "create", str(tmp_path / "ok.toml"), "--dry-run", "--overlap", "delayed")
    assert flag.exit_code == 2 and "--overlap 'delayed': expected one of none, eager" in flag.output
    out = tmp_path / "devnet"
    devnet = invoke("devnet", "--overlap", "delayed", "--out-dir", str(out))
    assert devnet.exit_code == 2, devnet.output
    assert devnet.output.strip() == "error: invalid devnet config: overlap: Input should be 'none' or 'eager'"
    assert not out.exists()  # nothing was started or written


def test_run_create_missing_file(tmp_path: Path) -> None:
    result = invoke("run", "create", str(tmp_path / "none.toml"), "--dry-run")
    assert result.exit_code == 2 and "run config not found" in result.output


CALIBRATION = {  # what `gonka-diloco verifier calibrate` writes (its `run_config`), trimmed
    "cumulative_rule": "root-sum-square",
    "k": 5,
    "run_config": {
        "tolerance": 0.01,
        "tolerance_exp_avg": 0.02,
        "tolerance_exp_avg_sq": 0.03,
        "tolerance_update": 0.04,
        "tolerance_denominator": 0.05,
        "tolerance_cumulative": 0.006,
        "tolerance_cumulative_update": 0.007,
    },
}


def test_run_create_sets_every_tolerance_threshold(tmp_path: Path) -> None:
    """Issue 36 (3): `run create` takes the thresholds `verifier calibrate` proposes, all seven,
    and a flag for each; a flag wins over the calibration."""
    import json

    path, cal = tmp_path / "run.toml", tmp_path / "calibration.json"
    path.write_text(TINY_RUN)
    cal.write_text(json.dumps(CALIBRATION))
    create = ("run", "create", str(path), "--dry-run")
    result = invoke(*create, "--calibration", str(cal), "--tolerance-update", "0.4")
    assert result.exit_code == 0, result.output
    config = json.loads(result.output)["config"]
    assert config["replay_mode"] == "tolerance"
    wanted = {**CALIBRATION["run_config"], "tolerance_update": 0.4}
    assert {k: config[k] for k in CALIBRATION["run_config"]} == wanted
    flags = invoke(
        *create, "--tolerance", "1", "--tolerance-exp-avg", "2",
        "--tolerance-exp-avg-sq", "3", "--tolerance-denominator", "5", "--tolerance-cumulative", "6",
        "--tolerance-cumulative-update", "7",
    )  # fmt: skip
    assert flags.exit_code == 0, flags.output
    config = json.loads(flags.output)["config"]
    got = [config.get(k) for k in CALIBRATION["run_config"]]
    assert got == [1, 2, 3, None, 5, 6, 7]  # tolerance_update unset: omitted from the dump


def test_run_create_gives_a_tolerance_run_fp32_moments_unless_the_toml_names_them(tmp_path: Path) -> None:
    """The default moments are int8 and tolerance mode needs fp32 (specs §6.2.1): a tolerance run
    from `--calibration` or the TOML gets `inner.moments = "fp32"`; a TOML that names
    int8 with tolerance is refused in one line naming the field and the value to set."""
    import json

    path, cal = tmp_path / "run.toml", tmp_path / "calibration.json"
    path.write_text(TINY_RUN)
    cal.write_text(json.dumps(CALIBRATION))
    bitwise = invoke("run", "create", str(path), "--dry-run")
    assert bitwise.exit_code == 0 and "moments" not in json.loads(bitwise.output)["config"]["inner"]  # int8
    out = invoke("run", "create", str(path), "--dry-run", "--calibration", str(cal))
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["config"]["inner"]["moments"] == "fp32"
    thresholds = "tolerance = 1.0\ntolerance_exp_avg = 1.0\ntolerance_exp_avg_sq = 1.0\n"
    head, model = TINY_RUN.split("[model]")
    path.write_text(f'{head}replay_mode = "tolerance"\n{thresholds}[model]{model}')
    out = invoke("run", "create", str(path), "--dry-run")
    assert out.exit_code == 0 and json.loads(out.output)["config"]["inner"]["moments"] == "fp32", out.output
    path.write_text(f'{head}replay_mode = "tolerance"\n{thresholds}[inner]\nmoments = "int8"\n[model]{model}')
    refused = invoke("run", "create", str(path), "--dry-run")
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert "replay_mode 'tolerance' needs inner.moments = 'fp32'" in refused.output
    path.write_text(f'{head}[inner]\nmoments = "int8"\n[model]{model}')  # named int8, then --calibration
    named = invoke("run", "create", str(path), "--dry-run", "--calibration", str(cal))
    assert named.exit_code == 2 and "needs inner.moments = 'fp32'" in named.output


def test_run_create_refuses_summed_thresholds_calibrated_for_the_earlier_rule(tmp_path: Path) -> None:
    """The summed-residual thresholds mean what the rule they were calibrated for divides by (specs
    §6.4): a calibration from before issue 36 (Σ w for a fixed number of opened segments, no
    `cumulative_rule`) or for another rule is refused in one line; without summed-residual
    thresholds the rule does not matter."""
    import json

    from protocol.config import CUMULATIVE_RULE

    assert CALIBRATION["cumulative_rule"] == CUMULATIVE_RULE  # what `verifier calibrate` writes
    path, cal = tmp_path / "run.toml", tmp_path / "calibration.json"
    path.write_text(TINY_RUN)
    create = ("run", "create", str(path), "--dry-run")
    cal.write_text(json.dumps({"opened": 8, "run_config": CALIBRATION["run_config"]}))  # before issue 36
    result = invoke(*create, "--calibration", str(cal))
    assert result.exit_code == 2 and "the rule before issue 36" in result.output
    assert "calibrate again with `gonka-diloco verifier calibrate`" in result.output
    assert "Traceback" not in result.output
    cal.write_text(json.dumps({**CALIBRATION, "cumulative_rule": "sum"}))
    other = invoke(*create, "--calibration", str(cal))
    assert other.exit_code == 2 and "are for rule 'sum'" in other.output
    per_segment = {k: v for k, v in CALIBRATION["run_config"].items() if "cumulative" not in k}
    cal.write_text(json.dumps({"opened": 8, "run_config": per_segment}))
    assert invoke(*create, "--calibration", str(cal)).exit_code == 0
    cal.write_text(json.dumps({**CALIBRATION, "cumulative_rule": 2}))
    assert "cumulative_rule: expected a string" in invoke(*create, "--calibration", str(cal)).output
    cal.write_text("{")
    assert "cannot read calibration" in invoke(*create, "--calibration", str(cal)).output
    bad = invoke(*create, "--tolerance-cumulative", "-1")
    assert bad.exit_code == 2
    assert "tolerance_cumulative: Input should be greater than or equal to 0" in bad.output


def test_run_create_refuses_summed_thresholds_calibrated_for_longer_sums(tmp_path: Path) -> None:
    """A calibration records the fewest segments its summed-residual thresholds hold for
    (`cumulative_least_segments`, specs §6.4): a run whose rule sums fewer is refused in one line
    (honest noise is larger over fewer segments); one that sums as many or more takes them, as do
    explicit flags for both summed thresholds."""
    import json

    path, cal = tmp_path / "run.toml", tmp_path / "calibration.json"
    path.write_text(TINY_RUN)  # H/k = 2: one window of two segments
    create = ("run", "create", str(path), "--dry-run")
    cal.write_text(json.dumps({**CALIBRATION, "cumulative_least_segments": 3}))
    refused = invoke(*create, "--calibration", str(cal))
    assert refused.exit_code == 2 and "hold for sets of 3 segments or more" in refused.output
    assert "sums 2" in refused.output and "Traceback" not in refused.output
    assert "verifier calibrate --window-segments 2" in refused.output  # what to run instead
    flags = ("--tolerance-cumulative", "0.01", "--tolerance-cumulative-update", "0.01")
    assert invoke(*create, "--calibration", str(cal), *flags).exit_code == 0
    path.write_text(TINY_RUN.replace("inner_steps = 10", "inner_steps = 30"))  # windows of 3 of 6
    assert invoke(*create, "--calibration", str(cal)).exit_code == 0
    for bad in (1, "3", True):
        cal.write_text(json.dumps({**CALIBRATION, "cumulative_least_segments": bad}))
        out = invoke(*create, "--calibration", str(cal)).output
        assert "cumulative_least_segments: expected an integer ≥ 2" in out


# ---------------------------------------------------------------- devnet config


def test_devnet_config_from_toml_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "devnet.toml"
    path.write_text(
        'hosts = 5\nverifiers = 3\nblock_interval = 0.25\n[[adversaries]]\nbehaviour = "lazy"\ncount = 2\n'
        "params = { fraction = 0.5 }\n[phases]\ntrain = 4.0\n"
    )
    cfg = load_config(path, {"hosts": 6, "seed": None, "phases": {"reveal": 2.0}})
    assert cfg.hosts == 6 and cfg.verifiers == 3  # the flag wins, an unset flag does not
    assert cfg.phases.train == 4.0 and cfg.phases.reveal == 2.0
    assert cfg.blocks(cfg.phases.train) == 16
    assert [b for b, _ in cfg.host_behaviours()] == ["honest"] * 4 + ["lazy", "lazy"]
    assert cfg.host_behaviours()[-1][1] == {"fraction": 0.5}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"hosts": 0}, "hosts: Input should be greater than or equal to 1"),
        (
            {"hosts": 2, "adversaries": [{"behaviour": "noise", "count": 2}]},
            "at least one host must be honest",
        ),
        ({"inner_steps": 12, "segment_len": 5}, "multiple of segment_len"),
        ({"verifiers": 1, "verifiers_per_contribution": 2}, "cannot exceed the number of verifiers"),
        ({"hosts": 20, "verifiers": 12}, "at most 31"),
        ({"codec": "fp64"}, "codec: Input should be"),
        ({"hots": 3}, "hots: Extra inputs are not permitted"),
    ],
)
def test_devnet_config_errors_name_the_field(tmp_path: Path, data: dict, message: str) -> None:
    with pytest.raises(DevnetConfigError, match="invalid devnet config") as err:
        load_config(None, data)
    assert message in str(err.value)


def test_devnet_toml_errors(tmp_path: Path) -> None:
    with pytest.raises(DevnetConfigError, match="config file not found"):
        load_config(tmp_path / "none.toml", {})
    bad = tmp_path / "bad.toml"
    bad.write_text("hosts = = 3")
    with pytest.raises(DevnetConfigError, match="is not valid TOML"):
        load_config(bad, {})


def test_adversary_flag_form() -> None:
    spec = parse_adversary("lazy:2:fraction=0.5,loud=true,tag=x")
    assert (spec.behaviour, spec.count, spec.params) == (
        "lazy",
        2,
        {"fraction": 0.5, "loud": True, "tag": "x"},
    )
    with pytest.raises(DevnetConfigError, match="count 'two' is not an integer"):
        parse_adversary("lazy:two")
    with pytest.raises(DevnetConfigError, match="is not key=value"):
        parse_adversary("lazy:1:fraction")


def test_devnet_command_rejects_bad_input_without_starting_anything(tmp_path: Path) -> None:
    result = invoke("devnet", "--hosts", "1", "--adversary", "noise", "--out-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "at least one host must be honest" in result.output
    unknown = invoke("devnet", "--adversary", "teleport", "--out-dir", str(tmp_path))
    assert unknown.exit_code == 2
    assert "unknown host behaviour 'teleport'" in unknown.output
    assert list(tmp_path.iterdir()) == []  # nothing was started or written
    negative = invoke("devnet", "--tolerance-cumulative-update", "-1", "--out-dir", str(tmp_path))
    assert negative.exit_code == 2  # the flag reaches the config (issue 36, 3)
    assert "tolerance_cumulative_update: Input should be greater than or equal to 0" in negative.output


def test_devnet_lists_adversaries() -> None:
    result = invoke("devnet", "--list-adversaries")
    assert result.exit_code == 0
    assert "noise" in result.output and "malicious" in result.output


# ---------------------------------------------------------------- status (against a real chain node)


@pytest.fixture
def chain_url(tmp_path: Path) -> Iterator[str]:
    node = NodeProcess(
        "chain",
        python_cli(
            "chain", "start", "--home", str(tmp_path / "chain"), "--port", "0", "--block-interval", "0.05"
        ),
        tmp_path / "chain.log",
    )
    node.start()
    try:
        yield node.wait_listening(60)
    finally:
        node.stop()


@pytest.mark.slow
def test_run_create_and_status_against_a_chain(tmp_path: Path, chain_url: str) -> None:
    path = tmp_path / "run.toml"
    path.write_text(TINY_RUN)
    created = invoke("run", "create", str(path), "--chain-url", chain_url, "--test-index", "0")
    assert created.exit_code == 0, created.output
    assert '"run_id": 1' in created.output
    status = invoke("status", "--chain-url", chain_url)
    assert status.exit_code == 0, status.output
    assert "cli-test" in status.output and "PENDING" in status.output
    not_authority = invoke("run", "create", str(path), "--chain-url", chain_url, "--test-index", "5")
    assert not_authority.exit_code == 1 and "MsgCreateRun failed" in not_authority.output
    missing = invoke("status", "--chain-url", chain_url, "--run-id", "9")
    assert missing.exit_code == 1 and "no run 9" in missing.output


def test_status_unreachable_chain() -> None:
    result = invoke("status", "--chain-url", "http://127.0.0.1:9")
    assert result.exit_code == 1
    assert "cannot read http://127.0.0.1:9" in result.output


def test_the_devnet_help_example_is_a_valid_config(tmp_path: Path) -> None:
    from gonka_diloco.cli import DEVNET_EPILOG

    lines = DEVNET_EPILOG.splitlines()
    example = [line.strip() for line in lines if line.startswith("  ")]
    path = tmp_path / "devnet.toml"
    path.write_text("\n".join(example))
    cfg = load_config(path, {})
    assert cfg.verifiers_per_contribution == 3 and cfg.phases.train == 8.0
    assert [b for b, _ in cfg.host_behaviours()][-1] == "lazy"
    assert [b for b, _ in cfg.verifier_behaviours()] == ["honest", "honest", "malicious"]


# ---------------------------------------------------------------- funding: chain start --fund, keys send


def _one_line_error(result, *needles: str) -> None:
    """A bad input ends in exactly one `error:` line naming the problem, never a traceback."""
    out = result.output
    assert result.exit_code != 0, out
    assert "Traceback" not in out
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out
    for needle in needles:
        assert needle in errors[0], out


@pytest.fixture
def funded_chain(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A fresh chain whose genesis makes keyring key `authority` the authority and funds `host-0`."""
    keys = tmp_path / "keys"
    assert invoke("keys", "add", "host-0", "--keyring-dir", str(keys)).exit_code == 0
    node = NodeProcess(
        "chain",
        python_cli(
            "chain", "start", "--home", str(tmp_path / "chain"), "--port", "0", "--block-interval", "0.05",
            "--authority", "authority", "--fund", "host-0:20GNK", "--keyring-dir", str(keys),
        ),
        tmp_path / "chain.log",
    )
    node.start()
    try:
        yield node.wait_listening(60), keys
    finally:
        node.stop()


@pytest.mark.slow
def test_chain_start_funds_keys_and_keys_send_moves_tokens(tmp_path: Path, funded_chain) -> None:
    url, keys = funded_chain
    k = ["--keyring-dir", str(keys), "--chain-url", url]
    assert '"gnk": "20GNK"' in invoke("keys", "balance", "host-0", *k).output
    assert invoke("keys", "show", "authority", "--keyring-dir", str(keys)).exit_code == 0  # created by start
    assert invoke("keys", "add", "newcomer", "--keyring-dir", str(keys)).exit_code == 0
    # a fresh key cannot sign anything yet: one line that says how to fund it
    path = tmp_path / "run.toml"
    path.write_text("seq_len = 32\n" + TINY_RUN)  # within the model's context (block_size 32)
    unfunded = invoke("run", "create", str(path), "--key", "newcomer", *k)
    _one_line_error(unfunded, "MsgCreateRun failed", "does not exist on the chain", "keys send")
    _one_line_error(invoke("keys", "send", "newcomer", "host-0", "1GNK", *k), "never funded", "keys send")
    sent = invoke("keys", "send", "authority", "newcomer", "3.5GNK", *k)
    assert sent.exit_code == 0, sent.output
    assert '"to_balance": 3500000000' in sent.output
    _one_line_error(invoke("keys", "send", "newcomer", "host-0", "30GNK", *k), "InsufficientFunds", "balance")
    _one_line_error(invoke("keys", "send", "newcomer", "host-0", "lots", *k), "amount 'lots'")
    _one_line_error(invoke("keys", "send", "nobody", "host-0", "1GNK", *k), "no key named 'nobody'")
    _one_line_error(invoke("keys", "send", "newcomer", "gonka1nope", "1GNK", *k), "not a valid gonka address")
    # funded but not the authority: the chain's answer plus who the authority is
    not_authority = invoke("run", "create", str(path), "--key", "host-0", *k)
    _one_line_error(not_authority, "not the authority", "chain start --authority")
    created = invoke("run", "create", str(path), "--key", "authority", *k)
    assert created.exit_code == 0 and '"run_id": 1' in created.output, created.output
    report = invoke("report", url, "--run-id", "9", "--out", str(tmp_path / "r"))
    assert report.exit_code == 1 and "no run 9 on" in report.output and "Traceback" not in report.output
    # a node whose key was never funded: its join says so in one line, then it exits 1
    assert invoke("keys", "add", "unfunded-host", "--keyring-dir", str(keys)).exit_code == 0
    host_toml = tmp_path / "host.toml"
    host_toml.write_text(
        f'chain_url = "{url}"\nrun_id = 1\ndata_dir = "h"\n'
        f'[key]\nkeyring_dir = "{keys}"\nname = "unfunded-host"\n'
    )
    host = subprocess.run(python_cli("host", "run", "--config", str(host_toml)), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert host.returncode == 1 and "Traceback" not in host.stderr, host.stderr
    errors = [line for line in host.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not exist on the chain" in errors[0], errors
    assert "keys send" in errors[0], errors


def test_funding_an_existing_home_is_refused_not_ignored(tmp_path: Path) -> None:
    from chain.node import Node

    Node(tmp_path / "chain").close()  # a home holding the default dev genesis
    keys = tmp_path / "keys"
    assert invoke("keys", "add", "host-0", "--keyring-dir", str(keys)).exit_code == 0
    again = subprocess.run(
        python_cli("chain", "start", "--home", str(tmp_path / "chain"), "--port", "0", "--fund",
                   "host-0:1GNK", "--keyring-dir", str(keys)),
        capture_output=True, text=True, timeout=60,
    )
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr
    assert "different genesis" in again.stderr and "keys send" in again.stderr


def test_chain_start_rejects_bad_funding_before_starting(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    for fund, message in [
        ("host-0", "expected NAME:AMOUNT"),
        ("ghost:5GNK", "no key named 'ghost'"),
        ("gonka1abc:5GNK", "not a valid gonka address"),
        ("gonka1abc:-5", "expected e.g. 20GNK"),
    ]:
        out = subprocess.run(
            python_cli("chain", "start", "--home", str(tmp_path / "c"), "--port", "0", "--fund", fund,
                       "--keyring-dir", str(keys)),
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 2, (fund, out.stdout, out.stderr)
        assert message in out.stderr and "Traceback" not in out.stderr, (fund, out.stderr)
        assert not (tmp_path / "c" / "chain.sqlite").exists()


def test_keys_encrypted_add_show_and_unlock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setattr("protocol.keys.SCRYPT_N", 1 << 10)
    keys = ["--keyring-dir", str(tmp_path / "keys")]
    pw = tmp_path / "pw"
    pw.write_text("a long passphrase\n")
    os.chmod(pw, 0o600)
    added = invoke("keys", "add", "sealed", "--mnemonic-file", str(_mnemonic(tmp_path)), "--passphrase-file",
                   str(pw), *keys)
    assert added.exit_code == 0 and "encrypted: yes" in added.output, added.output
    assert "abandon" not in (tmp_path / "keys" / "sealed.json").read_text()
    listed = invoke("keys", "list", *keys)
    assert "sealed" in listed.output and "yes" in listed.output
    assert str(test_wallet(0).address()) in invoke("keys", "show", "sealed", "-a", *keys).output
    os.chmod(pw, 0o644)
    _one_line_error(invoke("keys", "encrypt", "sealed", "--passphrase-file", str(pw), *keys), "chmod 600")
    short = tmp_path / "short"
    short.write_text("short")
    os.chmod(short, 0o600)
    _one_line_error(invoke("keys", "add", "x", "--passphrase-file", str(short), *keys), "at least 8")


def _mnemonic(tmp_path: Path) -> Path:
    path = tmp_path / "mnemonic"
    path.write_text(TEST_MNEMONIC)
    return path
