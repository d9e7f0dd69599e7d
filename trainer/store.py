"""Moved to `nodekit.store` (one content-addressed store for both nodes); kept for the adversary
library and benches that import these names from here."""

from nodekit.store import StateStore, StoreError, atomic_write, clone_state, state_from_bytes, state_to_bytes

__all__ = ["StateStore", "StoreError", "atomic_write", "clone_state", "state_from_bytes", "state_to_bytes"]
