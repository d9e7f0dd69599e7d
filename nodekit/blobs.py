"""Transitional re-exports: the server is `nodekit.serve`, the fetcher `nodekit.fetch`, and
`fetch_to_store` is `nodekit.holdings`'."""

from nodekit.fetch import (
    BlobClient,
    BlobError,
    BlobInvalid,
    BlobUnavailable,
    Chunk,
    ChunkCoding,
    FetchReport,
    Sink,
)
from nodekit.holdings import fetch_to_store
from nodekit.objects import KINDS
from nodekit.serve import (
    BlobCatalog,
    BytesObject,
    Served,
    ServerThread,
    StoredObject,
    build_app,
    parse_listen,
    parse_range,
)

__all__ = [
    "KINDS",
    "BlobCatalog",
    "BlobClient",
    "BlobError",
    "BlobInvalid",
    "BlobUnavailable",
    "BytesObject",
    "Chunk",
    "ChunkCoding",
    "FetchReport",
    "Served",
    "ServerThread",
    "Sink",
    "StoredObject",
    "build_app",
    "fetch_to_store",
    "parse_listen",
    "parse_range",
]
