"""The house's shape (issue 24): lines per file, methods per class, imports between packages.

`python -m bench.house [TREE]` reads a source tree (default: this checkout) by AST, imports nested
in functions included, and prints the node packages' files over 600 lines, the classes with more
than 15 methods and the import count between each pair of our packages. Run it on an old
checkout (`git worktree add /tmp/old REV`) to compare before and after.
"""

from __future__ import annotations

import argparse
import ast
import collections
from pathlib import Path

PACKAGES = ("trainer", "verifier", "nodekit", "replay", "protocol", "chain", "gonka_diloco")
NODE_PACKAGES = ("trainer", "verifier", "nodekit")
MAX_LINES, LISTED_METHODS = 600, 15


def measure(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]], dict[tuple[str, str], int]]:
    """(long files, big classes, imports between packages) of the tree at `root`."""
    long_files, classes = [], []
    imports: collections.Counter[tuple[str, str]] = collections.Counter()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            source = path.read_text()
            rel = str(path.relative_to(root))
            if package in NODE_PACKAGES and source.count("\n") > MAX_LINES:
                long_files.append((source.count("\n"), rel))
            for node in ast.walk(ast.parse(source, rel)):
                if isinstance(node, ast.ClassDef):
                    methods = sum(isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef) for b in node.body)
                    if methods > LISTED_METHODS:
                        classes.append((methods, f"{rel}:{node.name}"))
                elif isinstance(node, ast.Import | ast.ImportFrom):
                    is_plain = isinstance(node, ast.Import)
                    names = [a.name for a in node.names] if is_plain else [node.module or ""]
                    for name in names:
                        top = name.split(".")[0]
                        if top in PACKAGES and top != package:
                            imports[(package, top)] += 1
    return sorted(long_files, reverse=True), sorted(classes, reverse=True), dict(sorted(imports.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    args = parser.parse_args()
    if not all((Path(args.tree) / p).is_dir() for p in PACKAGES):
        parser.error(f"{args.tree}: not a gonka-diloco checkout (it lacks one of {', '.join(PACKAGES)})")
    long_files, classes, imports = measure(Path(args.tree))
    print(f"files over {MAX_LINES} lines in {', '.join(NODE_PACKAGES)}:", long_files or "none")
    print(f"classes with more than {LISTED_METHODS} methods:")
    for methods, name in classes:
        print(f"  {methods:3d}  {name}")
    print("imports between packages (importer -> imported: count):")
    for (importer, imported), count in imports.items():
        print(f"  {importer} -> {imported}: {count}")


if __name__ == "__main__":
    main()
