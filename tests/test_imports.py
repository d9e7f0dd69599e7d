"""DESIGN §3's import table, enforced on the source (AST, no imports run).

protocol/ imports no other package of ours; chain/ only protocol; nodekit/ (the node runtime:
store, fetch, serve, config) protocol and the chain's client side (client, errors, params);
replay/ (the engine a host runs and a verifier re-runs) protocol and nodekit; trainer/ (the host)
and verifier/ protocol, the chain client, nodekit and replay, never each other; nobody but tests,
benches and the composition root imports gonka_diloco, not even inside a function: the host's and
the verifier's command lines live in the composition root (`gonka_diloco.host_cli`,
`gonka_diloco.verifier_cli`), which builds the behaviours and passes them in.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = (
    "protocol", "chain", "nodekit", "replay", "trainer", "verifier",
    "gonka_diloco", "specs", "tests", "bench",
)  # fmt: skip
CHAIN_CLIENT = ("chain.client", "chain.errors", "chain.params")

# package -> module prefixes of ours it may import (its own package is always allowed)
ALLOWED: dict[str, tuple[str, ...]] = {
    "protocol": (),
    "chain": ("protocol",),
    "nodekit": ("protocol", *CHAIN_CLIENT),
    "replay": ("protocol", "nodekit"),
    "trainer": ("protocol", "chain.client", "nodekit", "replay"),
    "verifier": ("protocol", "chain.client", "nodekit", "replay"),
}


def imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at top level) for every import in a file, relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                out.extend((a.name, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                out.append((base, top))
                out.extend((f"{base}.{a.name}", top) for a in child.names)  # `from pkg import module`
            visit(child, top and not nested)

    visit(tree, True)
    return out


def _ours(module: str) -> bool:
    return module.split(".")[0] in OURS


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(package: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for module, top in imports(path):
            if not _ours(module) or _under(module, package):
                continue
            if any(_under(module, p) for p in ALLOWED[package]):
                continue
            if _names_a_symbol(module):  # `from replay.step import State` also yields replay.step.State
                continue
            bad.append(f"{path.relative_to(ROOT)}: {module}{'' if top else ' (inside a function)'}")
    return bad


def _names_a_symbol(module: str) -> bool:
    """`pkg.mod.Name` where pkg.mod is a file: the name is a symbol, judged by its module."""
    parts = module.split(".")
    return any((ROOT / Path(*parts[:i])).with_suffix(".py").is_file() for i in range(1, len(parts)))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_follow_the_design_table(package: str) -> None:
    assert violations(package) == []


def test_the_checker_catches_what_it_must(tmp_path: Path) -> None:
    """The rules bite: the verifier importing the host node, trainer importing the chain's state
    machine, adversaries in a node (at the top or inside a function, even from a file named
    cli.py) are all reported."""
    assert imports(ROOT / "verifier" / "node.py")  # it parses real files
    fake = [
        ("verifier", "_import_rule_probe.py", "from trainer.node import HostNode\n"),
        ("trainer", "_import_rule_probe.py", "from chain.module import process_msg\n"),
        ("nodekit", "_import_rule_probe.py", "import gonka_diloco.adversaries\n"),
        ("protocol", "_import_rule_probe.py", "from nodekit.store import ContentStore\n"),
        ("replay", "_import_rule_probe.py", "from trainer.node import HostNode\n"),
        ("verifier", "cli.py", "def main():\n    from gonka_diloco.adversaries import resolve_verifier\n"),
        ("trainer", "cli.py", "def main():\n    from gonka_diloco.adversaries import resolve_host\n"),
    ]
    for package, name, text in fake:
        path = ROOT / package / name
        assert not path.exists(), path
        path.write_text(text)
        try:
            assert any(f"{package}/{name}" in v for v in violations(package)), (package, name)
        finally:
            path.unlink()


def test_test_files_share_helpers_only_through_tests_support() -> None:
    """A helper two test files need lives in tests/support/, so no test file imports another
    (by package path or by bare module name, as pytest's rootdir import also allows)."""
    bad = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for module, _ in imports(path):
            parts = module.split(".")
            if parts[0] == "tests":
                parts = parts[1:]
            if parts and parts[0].startswith("test_"):
                bad.append(f"{path.relative_to(ROOT)}: {module}")
    assert bad == []
