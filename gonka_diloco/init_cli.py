"""`gonka-diloco init`: a run.toml, one host.toml per host and one verifier.toml per verifier that fit.

Written by hand, the three files disagree in ways each node only finds at start-up or mid-run: a
host's stake below the run's `min_host_stake` (ErrStakeTooLow at join), `verifiers_per_contribution`
or `audit_verifiers` above the verifiers that exist (nobody to draw), a run with no bound on its
outer steps or one whose step 0 opens before any host has joined, two hosts sharing a data
directory or a port. `init` derives every such number from one set of choices — hosts, verifiers,
model preset, dataset — and checks the result the way `run create` and the nodes will. It also
creates the keys the configs name (in the keyring every command reads) and prints the funding and
start-up commands that go with them, so the README's recipe runs as written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

DEFAULT_KEYRING = Path("~/.gonka-diloco/keyring")
GPT_PRESETS = ("tiny", "small", "base")
HF_ARCHS = ("llama", "qwen2")
HF_PRESETS = ("tiny", "small", "125m", "1b")
MODELS = (*(f"gpt-{p}" for p in GPT_PRESETS), *(f"{a}-{p}" for a in HF_ARCHS for p in HF_PRESETS))
BYTE_VOCAB = 256
"""`replay.model.VOCAB_SIZE`, the GPT presets' byte vocabulary (not imported: that imports torch)."""
FEE_RESERVE = 1_000_000_000
"""ngonka funded beside each stake for fees: at the devnet's gas price (1 ngonka/gas; `chain.app.Limits`:
20k + 10/byte + 10k/msg, ×1.3) a 1 kB tx costs ≈ 53k ngonka and a 10 kB reveal ≈ 0.2M, so 1 GNK pays
for thousands of a node's txs."""

app = typer.Typer(
    help="Write a run.toml, host.toml and verifier.toml files that fit together.", add_completion=False
)


class InitError(ValueError):
    """A choice that cannot make a working set of configs; the message names the option."""


def _fail(message: str, code: int = 2) -> None:
    Console(stderr=True, soft_wrap=True).print(Text.assemble(("error: ", "red"), message))
    raise typer.Exit(code)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")


def model_table(model: str, seed: int, vocab: int | None) -> tuple[dict[str, Any], int]:
    """The run's [model] (factory, config) for a preset name, and the model's context length.
    A dataset's vocabulary sizes a Hugging Face model's embedding; the GPT presets embed bytes."""
    from gonka_diloco.devnet_config import MODEL_SIZES

    family, _, preset = model.partition("-")
    if model not in MODELS:
        raise InitError(f"--model {model!r}: expected one of {', '.join(MODELS)}")
    if family == "gpt":
        if vocab is not None and vocab > BYTE_VOCAB:
            raise InitError(
                f"--model {model} embeds bytes ({BYTE_VOCAB} tokens) but the dataset's vocabulary is "
                f"{vocab}: use a llama-* or qwen2-* preset"
            )
        size = MODEL_SIZES[preset]
        return {"factory": "trainer.model:small_gpt", "config": {**size, "seed": seed}}, size["block_size"]
    from replay.hf import PRESETS  # imports torch: only for the Hugging Face presets

    config: dict[str, Any] = {"preset": preset, "seed": seed}
    if vocab is not None:
        config["vocab_size"] = vocab
    context = int(PRESETS[preset]["max_position_embeddings"])
    return {"factory": f"trainer.hf:{family}", "config": config}, context


def plan_configs(
    *,
    hosts: int,
    verifiers: int,
    chain_url: str,
    run_id: int,
    model: str,
    dataset: Path | None,
    name: str,
    seed: int,
    inner_steps: int,
    segment_len: int,
    sampled: int,
    outer_steps: int,
    step_seconds: float | None,
    block_seconds: float,
    keyring_dir: Path,
    listen_host: str,
    base_port: int,
) -> dict[str, str]:
    """File name → TOML text for the whole set, validated as `run create` and the nodes will."""
    from protocol.config import Phases, RunConfig, Stake

    if hosts < 1:
        raise InitError("--hosts must be at least 1")
    if verifiers < 1:
        raise InitError("--verifiers must be at least 1 (every contribution is replayed by v of them)")
    if outer_steps < 1:
        raise InitError("--outer-steps must be at least 1 (a run ends after it; 0 would run for ever)")
    vocab = manifest_hash = None
    if dataset is not None:
        from replay.data import DataError, open_dataset

        try:
            corpus = open_dataset(str(dataset))
        except DataError as e:
            raise InitError(f"--dataset {dataset}: {e}") from None
        manifest_hash = corpus.manifest_hash
        vocab = corpus.manifest.tokenizer.vocab_size if corpus.manifest is not None else None
    model_cfg, context = model_table(model, seed, vocab)
    stake = Stake()
    v = min(RunConfig.model_fields["verifiers_per_contribution"].default, verifiers)
    spare = verifiers - v  # auditors are drawn among verifiers not already assigned
    audit = min(RunConfig.model_fields["audit_verifiers"].default, spare) if spare else 0
    seq_len = min(RunConfig.model_fields["seq_len"].default, context)
    phases: dict[str, Any] = {
        "join_blocks": Phases.model_fields["join_blocks"].default,
        "min_hosts": hosts,  # step 0 trains once every host has joined, however late each starts
        "min_verifiers": verifiers,
        "early_close": True,  # windows close once everything they wait for is in (specs §2.3.1)
    }
    if step_seconds is not None:
        from gonka_diloco.phase_sizing import PhaseSizingError, train_phase_blocks

        try:
            phases["train_blocks"] = train_phase_blocks(inner_steps, step_seconds, block_seconds)
        except PhaseSizingError as e:
            raise InitError(f"--step-seconds: {e}") from None
    run: dict[str, Any] = {
        "name": name,
        "seed": seed,
        "inner_steps": inner_steps,
        "segment_len": segment_len,
        "sampled_segments": sampled,
        "verifiers_per_contribution": v,
        "seq_len": seq_len,
        "max_outer_steps": outer_steps,
    }
    if audit:
        run["audit_verifiers"] = audit
    else:
        run["audit_bps"] = 0  # no verifier is left to audit: more verifiers turn audits on
    if manifest_hash is not None:
        run["dataset_manifest_hash"] = manifest_hash
    check = {**run, "initial_model_hash": "0" * 64, "dataset_manifest_hash": manifest_hash or "0" * 64}
    try:
        RunConfig.model_validate({**check, "model": model_cfg, "phases": phases, "stake": stake})
    except ValueError as e:
        raise InitError(f"the run these options make is invalid: {_first_error(e)}") from None

    lines = [
        f"# A run for {hosts} host(s) and {verifiers} verifier(s), written by `gonka-diloco init`.",
        "# `run create` fills in initial_model_hash (and dataset_manifest_hash if absent).",
        *(f"{k} = {_toml(val)}" for k, val in run.items()),
    ]
    if not audit:
        lines.append("# audit_bps = 0: every verifier is one of a contribution's v; add some to audit")
    lines += ["", "[model]", f"factory = {_toml(model_cfg['factory'])}"]
    lines.append(f"config = {_toml(model_cfg['config'])}")
    lines += ["", "[phases]  # in blocks", *(f"{k} = {_toml(val)}" for k, val in phases.items())]
    if "train_blocks" not in phases:
        lines.append("# train_blocks: sized by `run create --measure` (or --step-seconds S), or set it here")
    lines += [
        "",
        "[stake]  # ngonka (1 GNK = 1e9); every host.toml / verifier.toml stakes at least its minimum",
        f"min_host_stake = {stake.min_host_stake}",
        f"min_verifier_stake = {stake.min_verifier_stake}",
        f"reward_per_outer_step = {stake.reward_per_outer_step}",
        "",
    ]
    files = {"run.toml": "\n".join(lines)}
    ring = str(keyring_dir.expanduser().resolve())
    data = str(dataset.resolve()) if dataset is not None else ""
    roles = (("host", hosts, stake.min_host_stake), ("verifier", verifiers, stake.min_verifier_stake))
    for role, count, amount in roles:
        for i in range(count):
            index = i if role == "host" else hosts + i
            port = base_port + index if base_port else 0
            node = [
                f"# {role} {i} of run {run_id}, by `gonka-diloco init` (DEVELOPERS-nodes.md: every field)",
                f"chain_url = {_toml(chain_url)}",
                f"run_id = {run_id}  # the run_id `run create` printed",
                f"data_dir = {_toml(f'{role}-{i}')}  # relative to this file: its own disk",
                f"listen = {_toml(f'{listen_host}:{port}')}  # port 0: a free one, kept across restarts",
                'public_url = ""  # what others fetch blobs from; default http://<listen>',
                f"stake = {amount}  # the run's min_{role}_stake",
                "threads = 1  # the run's `threads` (bitwise replay)",
            ]
            if data:
                node.append(f"dataset = {_toml(data)}")
            node += [
                "",
                "[key]",
                f"keyring_dir = {_toml(ring)}",
                f"name = {_toml(f'{role}-{i}')}",
                '# passphrase_file = "…"  # a 0600 file unlocking an encrypted key (`keys add --encrypt`)',
                "",
            ]
            files[f"{role}-{i}.toml"] = "\n".join(node)
    _check_nodes(files)
    return files


def _first_error(e: Exception) -> str:
    errors = getattr(e, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "config"
        return f"{where}: {first.get('msg')}"
    return str(e)


def _check_nodes(files: dict[str, str]) -> None:
    """Each node TOML validates as its node will read it (the key itself is not opened here)."""
    import tomllib

    from trainer.node_config import HostConfig
    from verifier.node_config import VerifierConfig

    for fname, text in files.items():
        if fname == "run.toml":
            continue
        cls = HostConfig if fname.startswith("host-") else VerifierConfig
        try:
            cls.model_validate(tomllib.loads(text))
        except ValueError as e:
            raise InitError(f"{fname} would be invalid: {_first_error(e)}") from None


@app.command()
def init(
    out: Annotated[Path, typer.Option("--dir", help="Folder to write the TOML files into.")] = Path("."),
    hosts: Annotated[int, typer.Option("--hosts", help="Hosts that train.")] = 2,
    verifiers: Annotated[int, typer.Option("--verifiers", help="Verifiers that replay and judge.")] = 1,
    chain_url: Annotated[
        str, typer.Option("--chain-url", envvar="GONKA_CHAIN_URL", help="The chain the nodes use.")
    ] = "http://127.0.0.1:26657",
    run_id: Annotated[
        int, typer.Option("--run-id", min=1, help="The run id the nodes join (a new chain's first is 1).")
    ] = 1,
    model: Annotated[str, typer.Option("--model", help=f"Model preset: {', '.join(MODELS)}.")] = "llama-tiny",
    dataset: Annotated[
        Path | None,
        typer.Option("--dataset", help="A prepared dataset folder (`data prepare`); default: Shakespeare."),
    ] = None,
    name: Annotated[str, typer.Option("--name", help="The run's name.")] = "run",
    seed: Annotated[int, typer.Option("--seed", min=0, help="Run seed: model init, data, batches.")] = 1,
    inner_steps: Annotated[
        int, typer.Option("--inner-steps", "-H", min=1, help="H: inner steps per outer step.")
    ] = 500,
    segment_len: Annotated[
        int, typer.Option("--segment-len", "-k", min=1, help="k: inner steps per segment.")
    ] = 5,
    sampled: Annotated[
        int, typer.Option("--sampled", "-s", min=1, help="s: segments opened per contribution.")
    ] = 8,
    outer_steps: Annotated[
        int, typer.Option("--outer-steps", help="max_outer_steps: the run ends after these.")
    ] = 10,
    step_seconds: Annotated[
        float | None,
        typer.Option("--step-seconds", help="Seconds per inner step on a host: sizes phases.train_blocks."),
    ] = None,
    block_seconds: Annotated[
        float, typer.Option("--block-seconds", help="The chain's block interval (with --step-seconds).")
    ] = 1.0,
    keyring_dir: Annotated[
        Path,
        typer.Option("--keyring-dir", envvar="GONKA_KEYRING_DIR", help="Keyring the nodes' keys live in."),
    ] = DEFAULT_KEYRING,
    keys: Annotated[
        bool, typer.Option("--keys/--no-keys", help="Create the keys the configs name if they are missing.")
    ] = True,
    listen_host: Annotated[
        str, typer.Option("--listen-host", help="Interface the nodes listen on.")
    ] = "127.0.0.1",
    base_port: Annotated[
        int, typer.Option("--base-port", min=0, max=65000, help="Node i listens on base+i; 0: free ports.")
    ] = 0,
    force: Annotated[bool, typer.Option("--force", help="Overwrite TOML files that exist.")] = False,
) -> None:
    """Write run.toml, host-<i>.toml and verifier-<j>.toml that fit together, create their keys,
    and print the commands that fund, create and start them."""
    from protocol.keys import KeyringError
    from protocol.messages import format_amount

    try:
        files = plan_configs(
            hosts=hosts, verifiers=verifiers, chain_url=chain_url, run_id=run_id, model=model,
            dataset=dataset, name=name, seed=seed, inner_steps=inner_steps, segment_len=segment_len,
            sampled=sampled, outer_steps=outer_steps, step_seconds=step_seconds,
            block_seconds=block_seconds, keyring_dir=keyring_dir, listen_host=listen_host,
            base_port=base_port,
        )  # fmt: skip
    except InitError as e:
        _fail(str(e))
        return
    existing = [f for f in files if (out / f).exists()]
    if existing and not force:
        _fail(f"{out} already holds {', '.join(existing)}: give --force to overwrite, or another --dir")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for fname, text in files.items():
            (out / fname).write_text(text)
    except OSError as e:
        _fail(f"cannot write into {out}: {e.strerror or e}")
    names = [f.removesuffix(".toml") for f in files if f != "run.toml"]
    addresses: dict[str, str] = {}
    if keys:
        from gonka_diloco.keys_cli import open_keyring

        ring = open_keyring(keyring_dir)
        try:
            for key in names:
                if key in ring.names():
                    addresses[key] = ring.show(key).address
                else:
                    addresses[key] = ring.add(key)[0].address
                    typer.echo(f"created key {key} {addresses[key]} in {ring.dir}")
        except KeyringError as e:
            _fail(str(e))
    from protocol.config import Stake

    st = Stake()
    stakes = {k: st.min_host_stake if k.startswith("host-") else st.min_verifier_stake for k in names}
    fund = {k: amount + FEE_RESERVE for k, amount in stakes.items()}
    funds = " ".join(f"--fund {k}:{format_amount(a)}" for k, a in fund.items())
    where = "" if chain_url == "http://127.0.0.1:26657" else f" --chain-url {chain_url}"
    ds = f" --dataset {dataset}" if dataset is not None else ""
    typer.echo(f"wrote {', '.join(files)} in {out}")
    typer.echo("next (each node in its own terminal or machine):")
    typer.echo(f"  gonka-diloco chain start --home {out / 'chain'} --authority authority {funds}")
    typer.echo(
        "    (a chain someone else runs: fund each key with `gonka-diloco keys send FUNDED_KEY NAME AMOUNT"
        f"{where}`; its authority creates the run)"
    )
    measure = "" if step_seconds is not None else f" --measure --block-seconds {block_seconds:g}"
    typer.echo(f"  gonka-diloco run create {out / 'run.toml'} --key authority{ds}{measure}{where}")
    for key in names:
        role = "host" if key.startswith("host-") else "verifier"
        typer.echo(f"  gonka-diloco {role} run --config {out / (key + '.toml')}")
    typer.echo(f"  gonka-diloco status{where}")
    typer.echo(f"  gonka-diloco report {chain_url} --run-id {run_id}")
