"""The replay engine: what a host runs and a verifier re-runs, bit for bit (DESIGN §2).

Model (`model`, `hf`, `spec`), data (`data`), the inner step and its optimizer state (`step`),
the device and its determinism pins (`device`), and G_0 from a checkpoint (`checkpoint`). Both
nodes import it; neither node's package is imported by it. Factory names on the chain keep their
historical "trainer.model:small_gpt" / "trainer.hf:llama" spelling: they are wire strings in run
configs and vectors, mapped to these functions by `replay.spec.DEFAULT_ALLOW_LIST`.
"""
