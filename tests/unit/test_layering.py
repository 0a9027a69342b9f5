"""The package's layers, held against its imports: each module imports only its own layer and
the ones below it, nothing imports its way back to itself, and only `bridge/drivers/` imports a
database driver. docs/development.md draws the same layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import bridge
from bridge.dialects.registry import dialect_names

BRIDGE = Path(bridge.__file__).parent

# Lowest first. A module's layer is that of the longest prefix of its name listed here.
# Modules of one layer may import each other (no cycles, below); `daemon` and `spark` share a
# layer and must not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("bridge", "bridge.exceptions", "bridge.secrets"),
    ("bridge.addressing",),
    ("bridge.drivers",),
    ("bridge.dialects",),
    ("bridge.config",),
    (
        "bridge.processing_host",
        "bridge.headers",
        "bridge.routing",
        "bridge.messages",
        "bridge.retry_policy",
        "bridge.connections",
        "bridge.outages",
    ),
    ("bridge.storage",),
    ("bridge.forwarding",),
    ("bridge.daemon", "bridge.spark"),
    ("bridge.commands",),
    ("bridge.__main__",),
]
SIBLINGS_APART = {"bridge.daemon", "bridge.spark"}
DATABASE_DRIVERS = {"pyodbc", "psycopg", "psycopg_pool", "psycopg2", "sqlite3", "pymssql"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(BRIDGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in BRIDGE.rglob("*.py")}


def _home(module: str) -> str:
    """The LAYERS entry `module` belongs to."""
    entries = [entry for layer in LAYERS for entry in layer]
    matches = [e for e in entries if module == e or module.startswith(e + ".")]
    assert matches, f"{module} is in no layer: add it to LAYERS"
    return max(matches, key=len)


def _rank(module: str) -> int:
    home = _home(module)
    return next(i for i, layer in enumerate(LAYERS) if home in layer)


def _imports(path: Path, *, runtime_only: bool, everything: bool = False) -> set[str]:
    """What `path` imports anywhere in it (also inside functions); with `runtime_only`, not
    what is under `if TYPE_CHECKING:`. Bridge modules only, unless `everything`."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped.update(id(child) for child in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from bridge.dialects import registry` imports the module bridge.dialects.registry
            found.update(
                f"{node.module}.{alias.name}"
                for alias in node.names
                if f"{node.module}.{alias.name}" in MODULES
            )
    if everything:
        return found
    return {name for name in found if name in MODULES}


def _graph() -> dict[str, set[str]]:
    return {
        name: {m for m in _imports(path, runtime_only=True) if m != name}
        for name, path in MODULES.items()
    }


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        _home(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_from_a_layer_above_its_own(module: str) -> None:
    rank = _rank(module)
    for imported in _imports(MODULES[module], runtime_only=True):
        assert _rank(imported) <= rank, f"{module} (layer {rank}) imports {imported}"
        home, imported_home = _home(module), _home(imported)
        if {home, imported_home} <= SIBLINGS_APART:
            assert home == imported_home, f"{module} imports its sibling {imported}"


def test_no_module_imports_a_module_that_imports_it_back() -> None:
    graph = _graph()
    for start in graph:
        seen: set[str] = set()
        stack = list(graph[start])
        while stack:
            module = stack.pop()
            assert module != start, f"{start} is in an import cycle"
            if module not in seen:
                seen.add(module)
                stack.extend(graph[module])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_drivers_import_a_database_driver(module: str) -> None:
    imported = {
        name.split(".")[0]
        for name in _imports(MODULES[module], runtime_only=False, everything=True)
    }
    if module.startswith("bridge.drivers."):
        return
    assert not imported & DATABASE_DRIVERS, f"{module} imports {imported & DATABASE_DRIVERS}"


def test_drivers_know_no_dialect_name() -> None:
    names = set(dialect_names())
    for path in (BRIDGE / "drivers").glob("*.py"):
        strings = {
            node.value
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        }
        assert not strings & names, path.name


def test_the_top_level_holds_the_shared_vocabulary_only() -> None:
    flat = sorted(p.name for p in BRIDGE.glob("*.py"))
    assert len(flat) <= 12, flat


@pytest.mark.parametrize(
    "path", sorted(BRIDGE.rglob("*.py")), ids=lambda p: str(p.relative_to(BRIDGE))
)
def test_no_module_is_longer_than_a_newcomer_can_hold(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 600
