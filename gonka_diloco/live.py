"""The devnet's live terminal view (rich): chain height, outer step and phase, every node.

The view is a pure function of a `LiveState`, so it can be rendered (and tested) without a
terminal or a running devnet; the orchestrator only fills the state and refreshes. Where stdout
is not a terminal (CI, `| tee`) a redrawn frame would print nothing until the end: `progress_line`
is the same state as one plain line, printed periodically instead.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from chain.params import Phase

PHASE_STYLE: dict[str, str] = {
    Phase.PENDING: "dim",
    Phase.TRAIN: "cyan",
    Phase.CHALLENGE: "magenta",
    Phase.REVEAL: "yellow",
    Phase.VERIFY: "blue",
    Phase.ESCALATION: "red",
    Phase.AUDIT: "blue",
    Phase.CONFIRM: "red",
    Phase.AWAITING_RESULT: "green",
    Phase.DONE: "bold green",
}
"""Keyed by `chain.params.Phase` (str-valued: a phase read from JSON finds its style)."""


@dataclass
class NodeView:
    name: str
    role: str
    behaviour: str = "honest"
    alive: bool = True
    status: dict[str, Any] = field(default_factory=dict)


@dataclass
class LiveState:
    run_id: int = 0
    height: int = 0
    outer_step: int = 0
    outer_steps: int = 0
    phase: str = "-"
    run_status: str = "-"
    elapsed_s: float = 0.0
    committed: int = 0
    accepted: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)  # node name -> outcome of this step
    val_loss: dict[int, float] = field(default_factory=dict)
    nodes: list[NodeView] = field(default_factory=list)
    events: deque[str] = field(default_factory=lambda: deque(maxlen=8))


def _fmt_loss(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, int | float) else "-"


def _node_table(state: LiveState) -> Table:
    table = Table(expand=True, show_edge=False, pad_edge=False)
    table.add_column("node", no_wrap=True, min_width=10)
    table.add_column("behaviour", no_wrap=True, max_width=12)
    table.add_column("state", no_wrap=True, min_width=11)
    for col in ("step", "commits", "acc/rej", "loss", "this step"):
        table.add_column(col, no_wrap=True, justify="right")
    for n in state.nodes:
        s = n.status
        name = Text(n.name, style="bold" if n.alive else "strike red")
        behaviour = Text(n.behaviour, style="" if n.behaviour == "honest" else "bold red")
        phase = str(s.get("phase", "-")) if n.alive else "down"
        outcome = state.outcomes.get(n.name, "")
        table.add_row(
            name,
            behaviour,
            Text(phase, style=PHASE_STYLE.get(phase, "")),
            str(s.get("outer_step", "-")),
            str(s.get("commits", "-")),
            f"{s.get('accepted', '-')}/{s.get('rejected', '-')}",
            _fmt_loss(s.get("loss", s.get("local_loss"))),
            Text(outcome, style="green" if outcome == "accepted" else "red"),
        )
    return table


def render(state: LiveState) -> Panel:
    """The whole view as one rich renderable."""
    phase = Text(state.phase, style=PHASE_STYLE.get(state.phase, ""))
    head = Text.assemble(
        ("block ", "dim"),
        (str(state.height), "bold"),
        ("   outer step ", "dim"),
        (f"{state.outer_step}/{state.outer_steps}", "bold"),
        ("   phase ", "dim"),
        phase,
        ("   commits ", "dim"),
        (str(state.committed), "bold"),
        ("   run ", "dim"),
        (state.run_status, "bold"),
        ("   ", ""),
        (f"{state.elapsed_s:.0f}s", "dim"),
    )
    losses = "  ".join(f"{k}:{v:.3f}" for k, v in sorted(state.val_loss.items())[-8:]) or "-"
    loss_line = Text.assemble(("global validation loss  ", "dim"), (losses, "bold"))
    # one line per event, cut at the terminal's width (not at a fixed column)
    events = Text("\n".join(state.events) or "-", style="dim", no_wrap=True, overflow="ellipsis")
    return Panel(
        Group(head, loss_line, _node_table(state), Text("recent", style="dim underline"), events),
        title=f"gonka-diloco devnet · run {state.run_id}",
        border_style="blue",
    )


def progress_line(state: LiveState) -> str:
    """The live view's head as one plain line, for a log or a pipe."""
    losses = " ".join(f"{k}:{v:.3f}" for k, v in sorted(state.val_loss.items())[-3:]) or "-"
    up = sum(1 for n in state.nodes if n.alive)
    return (
        f"devnet: {state.elapsed_s:.0f}s  block {state.height}  outer step {state.outer_step}/"
        f"{state.outer_steps} {state.phase}  commits {state.committed}  accepted {len(state.accepted)}  "
        f"nodes up {up}/{len(state.nodes)}  val loss {losses}  run {state.run_status}"
    )
