"""A malicious dataset mirror: serves a prepared dataset over HTTP with its shards tampered.

The rule it attacks: a node hash-checks every shard against the manifest its run names before
using it (`replay.data.ShardFile`). Served next to an honest mirror of the same folder, the
honest one is read and the tampering one is refused, whatever the tampering.
"""

from __future__ import annotations

import http.server
import threading
from enum import StrEnum
from pathlib import Path
from types import TracebackType


class Tamper(StrEnum):
    HONEST = "honest"  # serves the files as they are
    FLIP = "flip"  # one bit of every shard flipped, same size
    TRUNCATE = "truncate"  # every shard two bytes short
    PAD = "pad"  # every shard followed by extra bytes (a bounded read must stop)
    SWAP = "swap"  # every shard answered with the bytes of another shard of the same size


class DatasetMirror:
    """`with DatasetMirror(folder, Tamper.FLIP) as url:` — the dataset at `url` (127.0.0.1, free port)."""

    def __init__(self, folder: Path, tamper: Tamper = Tamper.HONEST) -> None:
        self.folder, self.tamper = Path(folder), Tamper(tamper)
        mirror = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(send_body=True)

            def do_HEAD(self) -> None:
                self._answer(send_body=False)

            def _answer(self, send_body: bool) -> None:
                body = mirror.body(self.path.lstrip("/"))
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def body(self, name: str) -> bytes | None:
        path = (self.folder / name).resolve()
        if not path.is_relative_to(self.folder.resolve()) or not path.is_file():
            return None
        data = path.read_bytes()
        if path.suffix != ".bin" or self.tamper is Tamper.HONEST:
            return data
        if self.tamper is Tamper.FLIP:
            return bytes([data[0] ^ 1]) + data[1:]
        if self.tamper is Tamper.TRUNCATE:
            return data[:-2]
        if self.tamper is Tamper.PAD:
            return data + b"\x00" * 64
        others = [p for p in sorted(self.folder.glob("*.bin")) if p != path and p.stat().st_size == len(data)]
        return others[0].read_bytes() if others else bytes(len(data))

    def __enter__(self) -> str:
        self.thread.start()
        return self.url

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
