"""A test must end with its own clear failure, not pytest-timeout's: each integration test's
pytest-timeout (120 s unless marked) is at least the sum of the waits written in it (``timeout=``
arguments and ``wait_for(x, seconds)``), so the first wait that runs out names what did not happen."""

from __future__ import annotations

import ast
from pathlib import Path

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
DEFAULT_TIMEOUT = 120  # pyproject.toml's pytest-timeout
MILLISECONDS = {"wait_for_function", "wait_for_selector", "wait_for_url", "expect_event"}  # Playwright


def _name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _budget(test: ast.AST) -> float:
    total = 0.0
    for node in ast.walk(test):
        if not isinstance(node, ast.Call) or _name(node) in MILLISECONDS:
            continue
        waits = [keyword.value for keyword in node.keywords if keyword.arg == "timeout"]
        if _name(node) in ("wait_for", "wait_ready") and len(node.args) >= 2:
            waits.append(node.args[1])
        for seconds in waits:
            if isinstance(seconds, ast.Constant) and isinstance(seconds.value, int | float):
                total += seconds.value
    return total


def _timeout_mark(test: ast.FunctionDef | ast.AsyncFunctionDef) -> float:
    for decorator in test.decorator_list:
        if isinstance(decorator, ast.Call) and _name(decorator) == "timeout" and decorator.args:
            value = decorator.args[0]
            if isinstance(value, ast.Constant) and isinstance(value.value, int | float):
                return float(value.value)
    return DEFAULT_TIMEOUT


def test_every_test_outlasts_its_own_waits() -> None:
    short = []
    for path in sorted(INTEGRATION.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
                budget, limit = _budget(node), _timeout_mark(node)
                if budget > limit:
                    short.append(f"{path.name}::{node.name}: waits {budget:g} s, timeout {limit:g} s")
    assert short == []
