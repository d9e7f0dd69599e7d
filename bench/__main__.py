"""Run every benchmark: `.venv/bin/python -m bench [--quick]`. Add your module to BENCHES."""

from __future__ import annotations

import argparse
import importlib

BENCHES = [
    "bench.hashing",
    "bench.codecs",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller inputs, for a smoke run")
    quick = ap.parse_args().quick
    for name in BENCHES:
        print(f"\n## {name}")
        importlib.import_module(name).main(quick=quick)


if __name__ == "__main__":
    main()
