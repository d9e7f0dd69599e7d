"""Regenerate `protocol/proto/*_pb2.py` from `specs/proto/` with grpcio-tools (`make proto`).

The generated module is written flat into this package (`tx_pb2.py`), and the file imports
nothing but google.protobuf, so importing it registers `inference.diloco.*` in the default
descriptor pool without touching the cosmos protos cosmpy registers there.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs" / "proto"
OUT = Path(__file__).resolve().parent
SOURCES = {"inference/diloco/tx.proto": "tx_pb2"}


def build() -> list[Path]:
    from grpc_tools import protoc  # dev tool only: not needed at run time

    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for source, module in SOURCES.items():
            args = ["protoc", f"-I{SPECS}", f"--python_out={tmp}", f"--pyi_out={tmp}", source]
            if protoc.main(args) != 0:
                raise SystemExit(f"protoc failed on {source}")
            stem = Path(tmp) / source.removesuffix(".proto")
            for suffix in (".py", ".pyi"):
                target = OUT / f"{module}{suffix}"
                shutil.copyfile(f"{stem}_pb2{suffix}", target)
                written.append(target)
    return written


if __name__ == "__main__":
    for path in build():
        print(path.relative_to(ROOT), file=sys.stderr)
