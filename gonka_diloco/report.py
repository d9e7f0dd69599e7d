"""The run report: `report.md`, `loss.png`, the contribution table and the chain stats.

A report is rendered from a `Snapshot` — a plain, JSON-serialisable record of what the chain and
the nodes said — so the same code renders a live devnet, a recorded run folder
(`snapshot.json`) or a chain URL, and tests can render a recorded fixture without any node.
`evaluate` turns the snapshot into the list of failures that decide the devnet's exit code.

A devnet knows every node's behaviour, so its report judges (adversaries, PASS/FAIL). A run read
from a chain URL (`source = "chain"`) is described, not judged: its hosts are neither honest nor
adversarial to us, and what could not be read (a node that exited, a Δ no longer served) is one
note each. Its validation loss comes from the chain itself: the loss every host's result vote
carries (`val_loss_ppm`, specs §2.7), the median over the votes for the adopted model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SNAPSHOT_FILE = "snapshot.json"
UNKNOWN = "unknown"
"""The behaviour of a node found on chain, not started by us: neither judged honest nor adversarial."""
MAX_SNAPSHOT_BYTES = 64 << 20


class ReportError(ValueError):
    """A run folder or snapshot that cannot be read; the message says which and why."""


class ChainReadError(ReportError):
    """The chain behind a report cannot be read: unreachable, or it has no such run."""


class Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContributionRow(Model):
    host: str  # node name when known (host-2), else the address
    address: str
    outer_step: int
    outcome: str  # accepted / rejected / missing_reveal / equivocated / unverified / pending
    reasons: list[str] = Field(default_factory=list)  # one per verdict: "verifier-0: ACCEPT"
    verifiers: list[str] = Field(default_factory=list)
    delta_bytes: int | None = None
    tokens: int = 0
    reward: int = 0
    slashed: int = 0


class StepRow(Model):
    index: int
    phase: str
    accepted: list[str] = Field(default_factory=list)  # node names
    base_model_hash: str = ""
    result_hash: str | None = None
    result_votes: dict[str, str] = Field(default_factory=dict)  # node name -> hash it computed
    loss_votes: dict[str, float] = Field(default_factory=dict)
    """node name -> the validation loss its vote for the adopted model carried (on chain)"""
    val_loss: float | None = None  # the median of `loss_votes`: the step's loss as the chain records it
    open_height: int | None = None
    train_start: int | None = None
    commit_deadline: int | None = None  # earlier than train_start + train_blocks if it closed early
    done_height: int | None = None


class SitOut(Model):
    """A host bonded for an outer step (joined by its commit deadline) that committed nothing in it."""

    host: str
    address: str = ""
    outer_step: int
    joined_height: int | None = None


class NodeRow(Model):
    name: str
    role: str  # chain / host / verifier
    address: str = ""
    behaviour: str = "honest"
    honest_work: bool = False
    """An adversary whose contribution is honest work (withhold, forge_result, silent_after_accept):
    its acceptance is right; it fails if its vote is adopted or the run stalls."""
    url: str = ""
    state: str = ""  # last phase or status the node reported
    alive: bool = True
    restarts: int = 0
    joined_height: int | None = None
    log: str = ""  # path relative to the run folder
    local_loss: dict[int, float] = Field(default_factory=dict)  # outer step -> last local loss
    val_loss: dict[int, float] = Field(default_factory=dict)
    traffic: dict[str, dict[str, int]] = Field(default_factory=dict)
    """Object bytes since the node started, `up` (served) and `down` (fetched), by kind (`/status`)."""
    replayed_steps: int = 0
    """A verifier's inner steps replayed since it started (`/status`)."""


class ValidatorRow(Model):
    """One CometBFT validator at the end of a run (the embedded engine has none)."""

    name: str
    address: str = ""  # consensus address, hex
    url: str = ""
    height: int = 0
    app_hash: str = ""  # its own app hash at `height`
    network_app_hash: str = ""  # what most validators committed at that height
    state: str = ""  # ok / halted / diverged / down
    missed_blocks: int = 0
    restarts: int = 0
    detail: str = ""  # why it halted, in its own words


class ChainStats(Model):
    height: int = 0  # the chain's height when the report was made
    txs: int | None = None  # txs that touched this run (None: not counted)
    host_slashed: int = 0
    verifier_slashed: int = 0
    rewards: int = 0
    first_height: int | None = None  # the run's span: created at ...
    last_height: int | None = None  # ... until its last step closed (or now, while it runs)
    seconds: float | None = None  # block time from first_height to last_height

    @property
    def blocks(self) -> int:
        """Blocks in the run's span; the whole chain when the span is unknown (older snapshots)."""
        if self.first_height is None or self.last_height is None:
            return self.height
        return max(0, self.last_height - self.first_height + 1)


class FinalModelRow(Model):
    """The devnet's export of its final model, and what G_0 and the final model write after one
    prompt (reproducible: greedy, or sampled from a fixed seed)."""

    folder: str  # relative to the run folder
    model_hash: str
    prompt: str = ""
    settings: str = ""  # "greedy, 80 tokens"
    samples: dict[str, str] = Field(default_factory=dict)  # "G_0" / "final" -> the continuation


class Snapshot(Model):
    run_id: int
    source: str = "devnet"  # devnet: nodes we started (judged); chain: any run on a chain (described)
    chain_url: str = ""
    run_status: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    current_step: int = 0
    steps: list[StepRow] = Field(default_factory=list)
    contributions: list[ContributionRow] = Field(default_factory=list)
    nodes: list[NodeRow] = Field(default_factory=list)
    validators: list[ValidatorRow] = Field(default_factory=list)
    chain: ChainStats = ChainStats()
    sit_outs: list[SitOut] = Field(default_factory=list)
    wall_s: float | None = None
    failures: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)  # what could not be read or does not add up, one each
    chain_id: str = ""
    final_model: FinalModelRow | None = None  # a devnet's export of its final model

    @property
    def judged(self) -> bool:
        """A devnet's run, whose nodes' behaviours we know: PASS/FAIL and adversaries apply."""
        return self.source != "chain"

    def node(self, name: str) -> NodeRow | None:
        return next((n for n in self.nodes if n.name == name), None)

    def val_loss(self) -> dict[int, float]:
        """Global validation loss per outer step: what the chain recorded with the result votes
        (`StepRow.val_loss`), else what honest hosts said on `/status` (they compute the same model)."""
        merged: dict[int, float] = {s.index: s.val_loss for s in self.steps if s.val_loss is not None}
        for n in self.nodes:
            if n.role == "host" and n.behaviour in ("honest", UNKNOWN):
                for step, loss in n.val_loss.items():
                    merged.setdefault(step, loss)
        return dict(sorted(merged.items()))

    def tokens_seen(self) -> dict[int, int]:
        """Tokens in the global model after each outer step: the accepted contributions' tokens so far."""
        per_step: dict[int, int] = {}
        for c in self.contributions:
            if c.outcome == "accepted":
                per_step[c.outer_step] = per_step.get(c.outer_step, 0) + c.tokens
        out, total = {}, 0
        for step in sorted({*per_step, *self.val_loss()}):
            total += per_step.get(step, 0)
            out[step] = total
        return out


# ---------------------------------------------------------------- checks


def evaluate(snap: Snapshot, *, expect_finished: bool = True, expect_all_honest: bool = True) -> list[str]:
    """Every reason this run counts as failed; empty means it passed."""
    failures: list[str] = []
    behaviour = {n.name: n.behaviour for n in snap.nodes}
    honest_work = {n.name for n in snap.nodes if n.honest_work}
    for node in snap.nodes:
        if not node.alive:
            failures.append(f"{node.name} crashed")
    for v in snap.validators:
        if v.state == "diverged":
            failures.append(
                f"validator {v.name} diverged from the network at height {v.height}: app hash "
                f"{v.app_hash[:16]} where the others have {v.network_app_hash[:16]} ({v.detail or 'running'})"
            )
        elif v.state != "ok":
            failures.append(f"validator {v.name} is {v.state}" + (f": {v.detail}" if v.detail else ""))
    if expect_finished and snap.run_status != "finished":
        failures.append(
            f"run did not finish (status {snap.run_status or 'unknown'}, step {snap.current_step})"
        )
    finalized = [c for c in snap.contributions if c.outcome != "pending"]
    for c in finalized:
        if behaviour.get(c.host, UNKNOWN) == UNKNOWN:
            continue
        honest = behaviour[c.host] == "honest"
        if honest and c.outcome != "accepted":
            failures.append(f"honest {c.host} was {c.outcome} at outer step {c.outer_step}")
        if not honest and c.outcome == "accepted" and c.host not in honest_work:
            failures.append(
                f"adversary {c.host} ({behaviour[c.host]}) was accepted at outer step {c.outer_step}"
            )
    if expect_all_honest:
        committed = {(c.host, c.outer_step) for c in snap.contributions}
        honest_hosts = [n.name for n in snap.nodes if n.role == "host" and n.behaviour == "honest"]
        for step in snap.steps:
            if step.phase != "DONE":
                continue
            missing = [h for h in honest_hosts if (h, step.index) not in committed]
            if missing:
                failures.append(
                    f"honest hosts made no contribution at outer step {step.index}: {missing}"
                    + _late_join_hint(snap, step, missing)
                )
    for step in snap.steps:
        if step.result_hash is None:
            continue
        # an adversary's vote may differ (forge_result votes for a model it made up); an honest one's
        # may not, and the adopted model must be one an honest host voted for
        honest_votes = {
            h: v for h, v in step.result_votes.items() if behaviour.get(h, UNKNOWN) in ("honest", UNKNOWN)
        }
        disagree = sorted(h for h, v in honest_votes.items() if h in step.accepted and v != step.result_hash)
        if disagree:
            failures.append(f"outer step {step.index}: accepted hosts computed another model: {disagree}")
        voters = sorted(h for h, v in step.result_votes.items() if v == step.result_hash)
        if voters and step.result_hash not in honest_votes.values():
            failures.append(
                f"outer step {step.index}: adopted {step.result_hash[:12]}, "
                f"voted for by adversaries only: {voters}"
            )
    losses = snap.val_loss()
    if len(losses) < 2:
        failures.append("fewer than two global validation losses were reported")
    else:
        values = list(losses.values())
        if not values[-1] < values[0]:
            failures.append(f"global validation loss did not fall ({values[0]:.4f} -> {values[-1]:.4f})")
    return failures


def _late_join_hint(snap: Snapshot, step: StepRow, missing: list[str]) -> str:
    """Name the usual cause of a missing first contribution: nodes slower to start than the join window."""
    if step.train_start is None:
        return ""
    late = [
        n.name
        for n in snap.nodes
        if n.name in missing and n.joined_height is not None and n.joined_height >= step.train_start
    ]
    if not late:
        return ""
    return (
        f" ({', '.join(late)} joined after training began at block {step.train_start}: lengthen phases.join)"
    )


# ---------------------------------------------------------------- rendering


def perplexity(loss: float) -> float:
    """exp(loss), capped where it would overflow (an untrained model's loss can be large)."""
    return math.exp(min(loss, 700.0))


def _perplexity_axis(ax: Any) -> None:
    """A right-hand axis reading the loss axis as perplexity = exp(loss)."""
    import numpy as np

    sec = ax.secondary_yaxis(
        "right", functions=(lambda x: np.exp(np.minimum(x, 700)), lambda y: np.log(np.maximum(y, 1e-300)))
    )
    sec.set_ylabel("perplexity")


def plot_loss(snap: Snapshot, path: Path) -> None:
    """Validation loss and perplexity of the global model per outer step (with each host's last local
    loss) and per token seen by the global model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_tok) = plt.subplots(1, 2, figsize=(12, 4))
    try:
        val = snap.val_loss()
        seen = snap.tokens_seen()
        if val:
            ax.plot(list(val), list(val.values()), "k-o", linewidth=2, label="global validation")
            steps = [s for s in val if seen.get(s)]
            ax_tok.plot([seen[s] for s in steps], [val[s] for s in steps], "k-o", linewidth=2)
        for node in snap.nodes:
            if node.role == "host" and node.local_loss:
                steps = sorted(node.local_loss)
                style = "--" if node.behaviour == "honest" else ":"
                label = f"{node.name} local" + ("" if node.behaviour == "honest" else f" ({node.behaviour})")
                ax.plot(steps, [node.local_loss[s] for s in steps], style, alpha=0.7, label=label)
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("outer step (validation: after applying it)")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title(f"run {snap.run_id}")
        ax.grid(alpha=0.3)
        ax_tok.set_xlabel("tokens seen by the global model (accepted contributions)")
        ax_tok.set_ylabel("validation loss (nats/token)")
        ax_tok.set_title("validation loss per token seen")
        ax_tok.grid(alpha=0.3)
        for a in (ax, ax_tok):
            _perplexity_axis(a)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def _gnk(ngonka: int) -> str:
    return f"{ngonka / 1e9:,.3f} GNK"


def summary_rows(snap: Snapshot) -> list[tuple[str, str]]:
    """The headline numbers, shared by report.md and the terminal summary. A devnet's judge its
    nodes (adversaries, PASS/FAIL); a chain run's only describe them."""
    accepted = sum(c.outcome == "accepted" for c in snap.contributions)
    rejected = sum(c.outcome not in ("accepted", "pending", "unverified") for c in snap.contributions)
    val = snap.val_loss()
    first, last = (next(iter(val.values())), list(val.values())[-1]) if val else (0.0, 0.0)
    loss = f"{first:.4f} → {last:.4f}" if val else "n/a"
    ppl = f"{perplexity(first):.2f} → {perplexity(last):.2f}" if val else "n/a"
    hosts = [n for n in snap.nodes if n.role == "host"]
    bad = [n for n in hosts if n.behaviour != "honest"]
    if snap.judged:
        named = ", ".join(f"{n.name}={n.behaviour}" for n in bad) or "none"
        host_row = ("hosts (adversarial)", f"{len(hosts)} ({named})")
    else:
        host_row = ("hosts", str(len(hosts)))
    txs = snap.chain.txs if snap.chain.txs is not None else "n/a"
    rows = [
        ("outer steps done", f"{sum(s.phase == 'DONE' for s in snap.steps)}"),
        host_row,
        ("verifiers", str(sum(n.role == "verifier" for n in snap.nodes))),
        ("contributions accepted / rejected", f"{accepted} / {rejected}"),
        ("sit-outs", str(len(snap.sit_outs))),
        ("global validation loss", loss),
        ("validation perplexity", ppl),
        ("blocks / txs of the run", f"{snap.chain.blocks} / {txs}"),
        (
            "slashed (hosts / verifiers)",
            f"{_gnk(snap.chain.host_slashed)} / {_gnk(snap.chain.verifier_slashed)}",
        ),
        ("rewards paid", _gnk(snap.chain.rewards)),
    ]
    if snap.final_model is not None:
        rows.append(("final model", f"{snap.final_model.folder}/ ({snap.final_model.model_hash[:12]})"))
    if snap.judged:
        rows.append(("wall time", f"{snap.wall_s:.0f} s" if snap.wall_s is not None else "n/a"))
        rows.append(("result", "PASS" if not snap.failures else "FAIL"))
    else:
        span = snap.chain.seconds
        rows.append(("run time (block times)", f"{span:.0f} s" if span is not None else "n/a"))
    return rows


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


TRAFFIC_KINDS = {"delta": "Δ", "state": "states", "optimizer": "optimizer", "model": "G",
                 "error_feedback": "e"}  # fmt: skip


def traffic_per_step(snap: Snapshot) -> dict[str, dict[str, dict[str, float]]]:
    """node -> up/down -> kind -> bytes per outer step done, plus `replayed` -> steps per outer
    step (what `bench.verification` compares with the planner)."""
    steps = max(1, len([s for s in snap.steps if s.phase == "DONE"]))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for n in snap.nodes:
        if not n.traffic and not n.replayed_steps:
            continue
        per = {d: {k: v / steps for k, v in n.traffic.get(d, {}).items()} for d in ("up", "down")}
        out[n.name] = {**per, "replayed": {"steps": n.replayed_steps / steps}}
    return out


def traffic_rows(snap: Snapshot) -> list[list[str]]:
    rows = []
    per_step = traffic_per_step(snap)
    for n in snap.nodes:
        t = per_step.get(n.name)
        if t is None:
            continue
        cells = [_bytes(t[d].get(k, 0.0)) for d in ("up", "down") for k in TRAFFIC_KINDS]
        replayed = f"{t['replayed']['steps']:.1f}" if n.role == "verifier" else "-"
        rows.append([n.name, n.role, *cells, replayed])
    return rows


def _bytes(b: float) -> str:
    if b <= 0:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= size:
            return f"{b / size:.3g} {unit}"
    return f"{b:.0f} B"


def render_markdown(snap: Snapshot, *, has_plot: bool) -> str:
    parts = [f"# gonka-diloco run {snap.run_id}", ""]
    if snap.chain_url:
        parts += [f"Chain: `{snap.chain_url}`", ""]
    parts += ["## Summary", "", _table(["", ""], [list(r) for r in summary_rows(snap)]), ""]
    if snap.failures and snap.judged:
        parts += ["## Failures", "", *[f"- {f}" for f in snap.failures], ""]
    if snap.notes:
        parts += ["## Not read or not agreed", "", *[f"- {n}" for n in snap.notes], ""]
    if has_plot:
        parts += ["## Loss", "", "![loss](loss.png)", ""]
    val = snap.val_loss()
    if val:
        seen = snap.tokens_seen()
        rows = [[str(k), f"{seen.get(k, 0):,}", f"{v:.4f}", f"{perplexity(v):.2f}"] for k, v in val.items()]
        parts += [_table(["outer step", "tokens seen", "validation loss", "perplexity"], rows), ""]
    parts += _final_model_section(snap)
    parts += ["## Contributions", ""]
    rows = [
        [
            c.host,
            str(c.outer_step),
            c.outcome,
            "; ".join(c.reasons) or "-",
            ", ".join(c.verifiers) or "-",
            str(c.delta_bytes) if c.delta_bytes is not None else "n/a",
            str(c.tokens),
            _gnk(c.reward) if c.reward else "-",
            _gnk(c.slashed) if c.slashed else "-",
        ]
        for c in sorted(snap.contributions, key=lambda c: (c.outer_step, c.host))
    ]
    header = [
        "host",
        "outer step",
        "verdict",
        "reasons",
        "verifiers",
        "Δ bytes",
        "tokens",
        "reward",
        "slashed",
    ]
    parts += [_table(header, rows), ""]
    if snap.sit_outs:
        why = "Hosts bonded for an outer step that committed nothing in it (unpaid, not slashed)."
        parts += ["## Sit-outs", "", why, ""]
        sit_rows = [
            [o.host, str(o.outer_step), str(o.joined_height) if o.joined_height is not None else "-"]
            for o in sorted(snap.sit_outs, key=lambda o: (o.outer_step, o.host))
        ]
        parts += [_table(["host", "outer step", "joined at block"], sit_rows), ""]
    parts += ["## Outer steps", ""]
    step_rows = [
        [
            str(s.index),
            s.phase,
            ", ".join(s.accepted) or "-",
            (s.result_hash or "-")[:16],
            str(s.done_height or "-"),
        ]
        for s in snap.steps
    ]
    parts += [_table(["outer step", "phase", "accepted", "global model", "done at block"], step_rows), ""]
    parts += ["## Chain", ""]
    span = (
        f" (blocks {snap.chain.first_height}-{snap.chain.last_height})"
        if snap.chain.first_height is not None
        else ""
    )
    chain_rows = [
        ["blocks of the run" + span, str(snap.chain.blocks)],
        ["transactions of the run", str(snap.chain.txs) if snap.chain.txs is not None else "n/a"],
        ["chain height", str(snap.chain.height)],
        ["slashed from hosts", _gnk(snap.chain.host_slashed)],
        ["slashed from verifiers", _gnk(snap.chain.verifier_slashed)],
        ["rewards", _gnk(snap.chain.rewards)],
    ]
    parts += [_table(["", ""], chain_rows), ""]
    if snap.validators:
        parts += ["## Validators", ""]
        validator_rows = [
            [
                v.name,
                v.address[:12] or "-",
                str(v.height),
                (v.app_hash or "-")[:16],
                v.state
                + ("" if v.app_hash == v.network_app_hash else f" (network {v.network_app_hash[:16]})"),
                str(v.missed_blocks),
                str(v.restarts),
            ]
            for v in snap.validators
        ]
        header = ["validator", "address", "height", "app hash", "state", "missed blocks", "restarts"]
        parts += [_table(header, validator_rows), ""]
    traffic = traffic_rows(snap)
    if traffic:
        steps = max(1, len([s for s in snap.steps if s.phase == "DONE"]))
        parts += [
            "## Bytes per node per outer step",
            "",
            f"Object bytes each node served (↑) and fetched (↓), by kind, averaged over the {steps} outer "
            "steps done (`/status` traffic; a restarted node counts from its restart); states are opened "
            "training states and θ_H's parameters, G global models; replayed: a verifier's inner steps.",
            "",
            _table(["node", "role", *[f"{d} {k}" for d in ("↑", "↓") for k in TRAFFIC_KINDS.values()],
                    "replayed steps"], traffic),
            "",
        ]  # fmt: skip
    parts += ["## Nodes", ""]
    if snap.judged:
        node_rows = [
            [n.name, n.role, n.behaviour, n.address or "-", n.state or "-", str(n.restarts), n.log or "-"]
            for n in snap.nodes
        ]
        header = ["node", "role", "behaviour", "address", "last state", "restarts", "log"]
    else:  # nodes found on chain: neither honest nor adversarial to us, started by someone else
        node_rows = [
            [n.name, n.role, n.address or "-", n.url or "-", str(n.joined_height or "-"), n.state or "-"]
            for n in snap.nodes
        ]
        header = ["node", "role", "address", "endpoint", "joined at block", "last state"]
    parts += [_table(header, node_rows), ""]
    if snap.config:
        parts += [
            "## Run config",
            "",
            "```json",
            json.dumps(snap.config, indent=2, sort_keys=True),
            "```",
            "",
        ]
    return "\n".join(parts)


def _final_model_section(snap: Snapshot) -> list[str]:
    """Where the final model was exported, how to use it, and what G_0 and it write."""
    m = snap.final_model
    if m is None:
        return []
    parts = [
        "## Final model",
        "",
        f"Exported to `{m.folder}/` in this run folder (global model `{m.model_hash[:16]}`; its MODEL.md "
        f"says where it came from). Here, `gonka-diloco model sample {m.folder} --prompt "
        f"{json.dumps(m.prompt)}` continues a prompt.",
        "",
    ]
    if m.samples:
        parts += [f"After {json.dumps(m.prompt)} ({m.settings}):", "", "```"]
        parts += [f"{name:>5}: {json.dumps(text, ensure_ascii=False)}" for name, text in m.samples.items()]
        parts += ["```", ""]
    return parts


def write_report(snap: Snapshot, folder: Path) -> Path:
    """Write snapshot.json, loss.png and report.md into `folder`; returns the report's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SNAPSHOT_FILE).write_text(snap.model_dump_json(indent=2))
    has_plot = bool(snap.val_loss()) or any(n.local_loss for n in snap.nodes)
    if has_plot:
        plot_loss(snap, folder / "loss.png")
    report = folder / "report.md"
    report.write_text(render_markdown(snap, has_plot=has_plot))
    return report


def load_snapshot(folder: Path) -> Snapshot:
    """Read a run folder's recorded snapshot, with a clear error for anything wrong with it."""
    path = folder / SNAPSHOT_FILE if folder.is_dir() else folder
    try:
        if path.stat().st_size > MAX_SNAPSHOT_BYTES:
            raise ReportError(f"{path} is larger than {MAX_SNAPSHOT_BYTES} bytes")
        return Snapshot.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise ReportError(f"no {SNAPSHOT_FILE} in {folder} (is it a devnet run folder?)") from None
    except ValidationError as e:
        raise ReportError(
            f"{path} is not a valid snapshot: {e.error_count()} errors, first: {e.errors()[0]['msg']}"
        ) from None
