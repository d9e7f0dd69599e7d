"""Command-line options more than one command takes, defined once: the tolerance-mode thresholds
(`devnet` and `run create` set the run config's fields of the same names)."""

from __future__ import annotations

from typing import Annotated

import typer

Tolerance = Annotated[
    float | None, typer.Option("--tolerance", help="Tolerance mode: threshold on the parameters.")
]
ToleranceExpAvg = Annotated[
    float | None, typer.Option("--tolerance-exp-avg", help="Tolerance mode: threshold on exp_avg.")
]
ToleranceExpAvgSq = Annotated[
    float | None, typer.Option("--tolerance-exp-avg-sq", help="Tolerance mode: threshold on exp_avg_sq.")
]
ToleranceUpdate = Annotated[
    float | None,
    typer.Option("--tolerance-update", help="Tolerance mode: exp_avg in update space (unset: exp_avg's)."),
]
ToleranceDenominator = Annotated[
    float | None,
    typer.Option(
        "--tolerance-denominator", help="Tolerance mode: AdamW's denominator (unset: exp_avg_sq's)."
    ),
]
ToleranceCumulative = Annotated[
    float | None,
    typer.Option(
        "--tolerance-cumulative",
        help="Tolerance mode: the segments' summed parameter residuals (specs §6.4; unset: off).",
    ),
]
ToleranceCumulativeUpdate = Annotated[
    float | None,
    typer.Option(
        "--tolerance-cumulative-update",
        help="Tolerance mode: their summed update-space residuals (specs §6.4; unset: off).",
    ),
]
