"""Moved to `nodekit.globalmodel` (both nodes hold G); kept for the adversary lab and benches."""

from nodekit.globalmodel import GlobalModel, GlobalModelError, GlobalStore

__all__ = ["GlobalModel", "GlobalModelError", "GlobalStore"]
