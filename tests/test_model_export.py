"""`gonka-diloco model export` / `model sample` (issue 38): a finished run's final model out as a
folder — Hugging Face layout for the transformers presets (loaded by transformers itself, logits
equal to the project's own forward), safetensors + config + `replay.spec.load_exported` for the
built-in GPT — with MODEL.md saying where it came from, read by the chain's hash from node disks
or fetched from the run's nodes (parameters only, every chunk verified); each refusal one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from gonka_diloco.cli import app
from gonka_diloco.export import (
    ExportError,
    Tokenizer,
    export,
    fetch_params,
    final_from_chain,
    final_from_folder,
    run_tokenizer,
    verify_export,
)
from gonka_diloco.report import ContributionRow, NodeRow, Snapshot, StepRow
from gonka_diloco.sample import Settings, continue_text, folder_tokenizer
from nodekit.globalmodel import GROUP, PARAM, GlobalModel, GlobalStore
from nodekit.objects import Kind, model_specs
from nodekit.store import ContentStore
from protocol.config import ModelSpec
from protocol.tensors import canonical_header, data_offsets
from replay.data import shakespeare_manifest
from replay.hf import spec_config
from replay.spec import ExportedModelError, build_model, load_exported
from tests.support.nodes import (
    LockstepChain,
    create_run,
    host,
    run_config,
    running,
    then_stop,
    tiny_corpus,
    verifier_node,
)
from tests.support.replay import SPEC, tiny_cfg

BIN = Path(sys.executable).parent / "gonka-diloco"
LLAMA = ModelSpec(factory="trainer.hf:llama", config=spec_config("llama", "tiny"))
QWEN2 = ModelSpec(factory="trainer.hf:qwen2", config=spec_config("qwen2", "tiny"))
BYTES = Tokenizer("bytes")
CHUNK = 4096


def trained(spec: ModelSpec, seed: int = 1) -> GlobalModel:
    """A G that is not the seeded init: perturbed parameters and a non-zero outer momentum."""
    g = torch.Generator().manual_seed(seed)
    params = {
        n: p.detach() + 0.01 * torch.randn(p.shape, generator=g)
        for n, p in build_model(spec).named_parameters()
    }
    momentum = {n: torch.randn(p.shape, generator=g) for n, p in params.items()}
    return GlobalModel.create(params, momentum)


def run_folder(
    tmp: Path,
    spec: ModelSpec,
    gm: GlobalModel,
    *,
    status: str = "finished",
    on: tuple[str, ...] = ("host-0",),
    dataset: str = "0" * 64,
) -> Path:
    """A devnet run folder as a devnet leaves it: snapshot.json naming the run, its config and final
    hash; the nodes' disks under `<folder>/<node>/store`, G on those named in `on`."""
    folder = tmp / "run"
    for name in on:
        GlobalStore(ContentStore(folder / name / "store")).save(gm)
    cfg = tiny_cfg(model=spec, dataset_manifest_hash=dataset)
    snap = Snapshot(
        run_id=3, run_status=status, chain_id="gonka-devnet", chain_url="http://127.0.0.1:1",
        config=cfg.model_dump(mode="json"), current_step=1,
        steps=[StepRow(index=0, phase="DONE", result_hash="a" * 64, val_loss=3.5),
               StepRow(index=1, phase="DONE" if status == "finished" else "TRAIN", result_hash=gm.hash,
                       val_loss=2.25)],
        contributions=[ContributionRow(host="host-0", address="x", outer_step=s, outcome="accepted",
                                       tokens=640) for s in (0, 1)],
        nodes=[NodeRow(name="verifier-0", role="verifier"),
               NodeRow(name="host-1", role="host", behaviour="noise"), NodeRow(name="host-0", role="host")],
    )  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "snapshot.json").write_text(snap.model_dump_json())
    return folder


def tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


def with_params(spec: ModelSpec, gm: GlobalModel) -> torch.nn.Module:
    model = build_model(spec)
    gm.load_into(model)
    return model.eval()


# ---------------------------------------------------------------- the two layouts


def test_the_built_in_gpt_exports_as_safetensors_config_and_a_loader(tmp_path: Path) -> None:
    gm = trained(SPEC)
    final = final_from_folder(run_folder(tmp_path, SPEC, gm, on=("host-1", "host-0")))
    out, who = export(final, tmp_path / "out", tokenizer=BYTES)
    assert who == "host-0's disk"  # honest hosts are read first
    assert sorted(p.name for p in out.iterdir()) == [
        "MODEL.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    saved = tensors(out / "model.safetensors")
    assert saved.keys() == dict(gm.params).keys()  # the parameters only: no outer momentum
    assert all(torch.equal(saved[n], gm.params[n]) for n in saved)
    model = load_exported(out)
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(idx), with_params(SPEC, gm)(idx))
    section = json.loads((out / "config.json").read_text())["gonka_diloco"]
    assert section["model_spec"] == SPEC.model_dump(mode="json")
    assert section["provenance"]["model_hash"] == gm.hash
    md = (out / "MODEL.md").read_text()
    for fact in ("| run | 3 |", gm.hash, "| outer steps | 2 |", "1,280", "2.2500", "`gonka-devnet`",
                 "host-0's disk", "load_exported"):  # fmt: skip
        assert fact in md, fact
    verify_export(out)
    codec = folder_tokenizer(out)
    assert codec.encode(["héllo"])[0] == list("héllo".encode())  # byte-level: id = byte
    settings = Settings(tokens=12)
    assert continue_text(model, codec, "ROMEO", 32, settings) == continue_text(
        model, codec, "ROMEO", 32, settings
    )


@pytest.mark.parametrize("spec", [LLAMA, QWEN2], ids=["llama", "qwen2"])
def test_an_hf_preset_exports_a_folder_transformers_loads_with_the_same_logits(
    tmp_path: Path, spec: ModelSpec
) -> None:
    import transformers

    gm = trained(spec)
    out, _ = export(final_from_folder(run_folder(tmp_path, spec, gm)), tmp_path / "out", tokenizer=BYTES)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert hf_model.dtype == torch.float32
    idx = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = hf_model(input_ids=idx).logits
        ours = with_params(spec, gm)(idx)
        assert torch.equal(theirs, ours)  # exact in float32
        assert torch.equal(load_exported(out)(idx), ours)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok("ROMEO:")["input_ids"] == list(b"ROMEO:")
    assert "AutoModelForCausalLM" in (out / "MODEL.md").read_text()


def test_a_bfloat16_export_converts_tensor_by_tensor(tmp_path: Path) -> None:
    gm = trained(SPEC)
    out, _ = export(final_from_folder(run_folder(tmp_path, SPEC, gm)), tmp_path / "out", dtype="bfloat16",
                    tokenizer=BYTES)  # fmt: skip
    saved = tensors(out / "model.safetensors")
    assert all(
        t.dtype == torch.bfloat16 and torch.equal(t, gm.params[n].to(torch.bfloat16))
        for n, t in saved.items()
    )
    assert next(load_exported(out).parameters()).dtype == torch.float32


# ---------------------------------------------------------------- refusals, one line each


def test_an_unfinished_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"run 3 in .* is running, not finished"):
        final_from_folder(run_folder(tmp_path, SPEC, trained(SPEC), status="running"))


def test_a_corrupted_copy_is_skipped_for_an_intact_one_and_refused_when_none_is(tmp_path: Path) -> None:
    gm = trained(SPEC)
    folder = run_folder(tmp_path, SPEC, gm, on=("host-0", "verifier-0"))
    path = folder / "host-0" / "store" / GROUP / f"{gm.hash}.model"
    specs = model_specs({n: tuple(t.shape) for n, t in gm.params.items()})
    at = data_offsets(specs)[PARAM + "lm_head.weight"][0] + 5  # a byte of the parameters
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    _, who = export(final_from_folder(folder), tmp_path / "out", tokenizer=BYTES)
    assert who == "verifier-0's disk"
    (folder / "verifier-0" / "store" / GROUP / f"{gm.hash}.model").unlink()
    with pytest.raises(ExportError) as e:
        export(final_from_folder(folder), tmp_path / "out2", tokenizer=BYTES)
    assert str(e.value).startswith(
        f"no holder has run 3's final model {gm.hash[:12]} intact (host-0's disk: "
    )
    assert "corrupted on disk" in str(e.value) and "verifier-0's disk: not on disk" in str(e.value)
    assert "\n" not in str(e.value) and not (tmp_path / "out2").exists()  # nothing half-written
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out2")]


def test_a_hash_nobody_holds_and_an_occupied_out_are_refused(tmp_path: Path) -> None:
    folder = run_folder(tmp_path, SPEC, trained(SPEC), on=())
    with pytest.raises(
        ExportError, match=r"no holder has run 3's final model .* \(host-0's disk: no store at"
    ):
        export(final_from_folder(folder), tmp_path / "out", tokenizer=BYTES)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    with pytest.raises(ExportError, match="already exists and is not an empty folder"):
        export(final_from_folder(folder), tmp_path / "taken", tokenizer=BYTES)


def test_unknown_and_unfinished_runs_on_a_chain_are_refused() -> None:
    chain = LockstepChain()
    with pytest.raises(ExportError, match=r"^no run 7 on http://x$"):
        final_from_chain(chain, 7, "http://x")
    run_id = create_run(chain, run_config(tiny_corpus()))
    with pytest.raises(
        ExportError, match=rf"^run {run_id} on http://x is active \(outer step 0\), not finished"
    ):
        final_from_chain(chain, run_id, "http://x")


def test_an_exported_file_changed_since_is_refused_by_sample(tmp_path: Path) -> None:
    out, _ = export(
        final_from_folder(run_folder(tmp_path, SPEC, trained(SPEC))), tmp_path / "out", tokenizer=BYTES
    )
    raw = bytearray((out / "model.safetensors").read_bytes())
    raw[-3] ^= 0xFF
    (out / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ExportedModelError, match=r"does not hash to the sha256 its config\.json records"):
        verify_export(out)
    (out / "model.safetensors").write_bytes(bytes(raw[:100]))  # truncated
    with pytest.raises(ExportedModelError, match="not a readable safetensors file"):
        load_exported(out)
    with pytest.raises(
        ExportedModelError, match=r"no config.json \(is it a `gonka-diloco model export` folder"
    ):
        load_exported(tmp_path)


def one_line(result: Any, code: int, *fragments: str) -> str:
    out = result.output if hasattr(result, "output") else result.stderr
    assert result.exit_code == code if hasattr(result, "exit_code") else result.returncode == code, out
    assert "Traceback" not in out
    lines = [line for line in out.strip().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def test_the_command_line_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    cli = lambda *a: runner.invoke(app, list(a), env={"COLUMNS": "250"})  # noqa: E731
    unknown = run_folder(tmp_path / "unknown", SPEC, trained(SPEC))
    assert cli("model", "export", str(unknown), "--out", str(tmp_path / "u")).exit_code == 0
    assert (
        "not included: the run's dataset (000000000000) was not named"
        in (tmp_path / "u" / "MODEL.md").read_text()
    )
    one_line(
        cli("model", "sample", str(tmp_path / "u"), "--prompt", "x"), 1, "u: no tokenizer.json", "--dataset"
    )
    folder = run_folder(tmp_path, SPEC, trained(SPEC), dataset=shakespeare_manifest()[1].manifest_hash())
    one_line(
        cli("model", "export", str(tmp_path / "nope"), "--out", str(tmp_path / "o")),
        2,
        "nope: no such folder",
    )
    one_line(
        cli("model", "export", str(tmp_path), "--out", str(tmp_path / "o")), 2, "neither a devnet run folder"
    )
    one_line(cli("model", "export", str(folder / "host-0"), "--out", str(tmp_path / "o")), 2,
             "is a node's data_dir: give --chain URL --run N")  # fmt: skip
    one_line(cli("model", "export", "--chain", "localhost:1", "--run", "1", "--out", str(tmp_path / "o")), 2,
             "--chain 'localhost:1' is not an http:// or https:// URL")  # fmt: skip
    one_line(cli("model", "export", "--chain", "http://127.0.0.1:1", "--out", str(tmp_path / "o")), 2,
             "--chain URL and --run N go together")  # fmt: skip
    one_line(
        cli("model", "export", str(folder), "--out", str(tmp_path / "o"), "--dtype", "int8"),
        2,
        "--dtype 'int8'",
    )
    one_line(cli("model", "sample", str(tmp_path / "nope"), "--prompt", "x"), 1, "nope: no such model folder")
    ok = cli("model", "export", str(folder), "--out", str(tmp_path / "o"))
    assert ok.exit_code == 0, ok.output
    assert "run 3's final model" in ok.output and "read from: host-0's disk" in ok.output
    sampled = cli("model", "sample", str(tmp_path / "o"), "--prompt", "ROMEO", "--tokens", "5")
    assert sampled.exit_code == 0 and sampled.output.startswith("ROMEO"), sampled.output
    one_line(
        cli("model", "sample", str(tmp_path / "o"), "--prompt", ""),
        2,
        "--prompt: the prompt encodes to no tokens",
    )


def test_the_installed_command_answers_a_mistyped_chain_url_in_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens there once closed
    url = f"http://127.0.0.1:{port}"
    argv = [str(BIN), "model", "export", "--chain", url, "--run", "1", "--out", str(tmp_path / "o")]
    env = {**os.environ, "COLUMNS": "250"}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: cannot reach the chain at http://127.0.0.1:{port}"
    )


# ---------------------------------------------------------------- a real finished run


def test_a_finished_runs_model_is_fetched_from_its_nodes_and_stays_on_their_disks(tmp_path: Path) -> None:
    """The smallest real run (2 hosts, 1 verifier, one outer step of a tiny GPT): while the hosts
    still serve, its final model is fetched from them by the chain's hash (the parameters' chunks
    only); after every node stopped, it is still on each host's disk and exports the same bytes."""
    chain = LockstepChain()
    corpus = tiny_corpus()
    run_id = create_run(chain, run_config(corpus, max_outer_steps=1, state_chunk_bytes=CHUNK))
    hosts = [host(tmp_path, i, run_id, chain, corpus) for i in (1, 2)]
    verifier = verifier_node(tmp_path, 3, run_id, corpus)
    fetched: list[Path] = []

    def verify_then_export() -> None:
        verifier.run()
        final, endpoints = final_from_chain(chain, run_id, "http://in-process")
        final.holders = [fetch_params(final, endpoints, tmp_path / "scratch")]
        fetched.append(export(final, tmp_path / "fetched", tokenizer=BYTES)[0])

    with running(
        [lambda h=h: h.run(linger=True) for h in hosts] + [then_stop(verify_then_export, hosts)], chain
    ):
        pass
    run = chain.query("run", run_id=run_id)
    assert run["status"] == "finished"
    h = run["global_model_hash"]
    assert h != run["config"]["initial_model_hash"]
    # only the header's and the parameters' chunks were fetched: the momentum's stayed holes
    model = build_model(ModelSpec.model_validate(run["config"]["model"]))
    specs = model_specs({n: tuple(p.shape) for n, p in model.named_parameters()})
    first_param = min(a for n, (a, _) in data_offsets(specs).items() if n.startswith(PARAM))
    lo, hi = -(-len(canonical_header(specs)) // CHUNK), first_param // CHUNK
    assert hi - lo > 10
    name = f"{GROUP}/{h}.{Kind.MODEL.value}"
    assert not any((tmp_path / "scratch" / name).read_bytes()[lo * CHUNK : hi * CHUNK])
    assert any((tmp_path / "host-1" / "store" / name).read_bytes()[lo * CHUNK : hi * CHUNK])
    for i in (1, 2):  # after the nodes stopped: on every honest host's disk, and the same model
        final, _ = final_from_chain(chain, run_id, "http://in-process", tmp_path / f"host-{i}")
        out, who = export(final, tmp_path / f"from-host-{i}", tokenizer=BYTES)
        assert who == str(tmp_path / f"host-{i}")
        assert (out / "model.safetensors").read_bytes() == (fetched[0] / "model.safetensors").read_bytes()
    md = (fetched[0] / "MODEL.md").read_text()
    assert "| outer steps | 1 |" in md and "fetched from" in md and h in md


def test_the_report_names_the_exported_folder_and_shows_both_samples() -> None:
    from gonka_diloco.report import FinalModelRow, render_markdown, summary_rows

    snap = Snapshot(run_id=1, final_model=FinalModelRow(
        folder="model", model_hash="ab" * 32, prompt="**HAMLET**  \n", settings="greedy, 80 tokens",
        samples={"G_0": "xq#", "final": "the the"},
    ))  # fmt: skip
    assert ("final model", "model/ (abababababab)") in summary_rows(snap)
    md = render_markdown(snap, has_plot=False)
    assert "## Final model" in md and "Exported to `model/`" in md
    assert '  G_0: "xq#"' in md and 'final: "the the"' in md and '"**HAMLET**  \\n"' in md


def test_a_run_on_a_prepared_dataset_ships_its_tokenizer(tmp_path: Path) -> None:
    import transformers

    from replay.prepare import PrepareOptions, load_tokenizer, prepare

    (tmp_path / "corpus.txt").write_text("The verifier replays the sampled segments of every host.\n" * 40)
    manifest = prepare([str(tmp_path / "corpus.txt")], tmp_path / "ds", PrepareOptions(train_bpe=300))
    spec = ModelSpec(factory="trainer.hf:llama", config=spec_config("llama", "tiny", vocab_size=300))
    folder = run_folder(tmp_path, spec, trained(spec), dataset=manifest.manifest_hash())
    with pytest.raises(ExportError, match=r"^dataset 'Shakespeare' has manifest \w{12}, the run's is"):
        run_tokenizer(final_from_folder(folder).cfg, "")  # a dataset that is not the run's
    final = final_from_folder(folder)
    final.dataset = str(tmp_path / "ds")
    out, _ = export(final, tmp_path / "out")
    ours = load_tokenizer(tmp_path / "ds", manifest)
    text = "The verifier replays"
    assert transformers.AutoTokenizer.from_pretrained(out)(text)["input_ids"] == ours.encode([text])[0]
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == manifest.tokenizer.eot_token == 0 and config["vocab_size"] == 300
    assert "the dataset's tokenizer" in (out / "MODEL.md").read_text()
    model = load_exported(out)
    written = continue_text(
        model, folder_tokenizer(out), text, 128, Settings(tokens=8, temperature=1.0, seed=3)
    )
    assert isinstance(written, str)
