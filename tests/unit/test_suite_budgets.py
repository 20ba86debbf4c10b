"""A test must end with its own clear failure, not pytest-timeout's: each integration test's
pytest-timeout (120 s unless marked) is at least the sum of the waits written in it, so the first wait
that runs out names what did not happen.

A wait is a ``timeout=`` given to any call, a timeout given by position to a function of the suite or
of meshplane that takes one (``read_until(x, y, 60)``, ``sub.next(10)``, ``asyncio.wait_for(x, 5)``),
or such a function's default when none is given (``eventually``'s 10 s); functions defined in the
test count once. A wait in a ``for`` loop over a literal sequence or ``range(n)`` counts once per
iteration; one in any other loop, once."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
INTEGRATION = TESTS / "integration"
SOURCES = (TESTS, TESTS.parent / "src" / "meshplane")
DEFAULT_TIMEOUT = 120  # pyproject.toml's pytest-timeout
# Playwright's waits and ZeroMQ's poll take milliseconds
MILLISECONDS = {"wait_for_function", "wait_for_selector", "wait_for_url", "expect_event", "poll"}
PASS_THROUGH = {"to_thread"}  # asyncio.to_thread(f, *args): the waits are f's
FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def _name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _seconds(node: ast.expr | None) -> float | None:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return float(node.value)
    return None


@dataclass(frozen=True)
class TimeoutParameter:
    """Where a function takes ``timeout`` (its position after ``self``, None if keyword-only) and its
    default in seconds (None: none, or not a number)."""

    position: int | None
    default: float | None


ASYNCIO = {"wait_for": TimeoutParameter(1, None)}  # asyncio's own: wait_for(aw, timeout)


def _timeout_parameter(function: FunctionNode) -> TimeoutParameter | None:
    positional = [a.arg for a in function.args.posonlyargs + function.args.args]
    defaults = function.args.defaults
    if "timeout" in positional:
        index = positional.index("timeout")
        first_default = len(positional) - len(defaults)
        default = _seconds(defaults[index - first_default]) if index >= first_default else None
        skip = 1 if positional[0] in ("self", "cls") else 0
        return TimeoutParameter(index - skip, default)
    keywords = [a.arg for a in function.args.kwonlyargs]
    if "timeout" in keywords:
        return TimeoutParameter(None, _seconds(function.args.kw_defaults[keywords.index("timeout")]))
    return None


def _functions(root: Path) -> Iterator[FunctionNode]:
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, FunctionNode):
                yield node


@cache
def _timeouts() -> dict[str, TimeoutParameter]:
    """Functions taking a timeout, by name: where every definition of a name agrees (or the part they
    agree on: the position when only the defaults differ)."""
    takes: dict[str, set[TimeoutParameter]] = defaultdict(set)
    for root in SOURCES:
        for function in _functions(root):
            parameter = _timeout_parameter(function)
            if parameter is not None and not function.name.startswith("__"):
                takes[function.name].add(parameter)
    timeouts: dict[str, TimeoutParameter] = {}
    for name, found in takes.items():
        positions = {p.position for p in found}
        defaults = {p.default for p in found}
        timeouts[name] = TimeoutParameter(
            positions.pop() if len(positions) == 1 else None, defaults.pop() if len(defaults) == 1 else None
        )
    return timeouts


def _call_wait(call: ast.Call, parameter: TimeoutParameter, args: list[ast.expr]) -> float:
    for keyword in call.keywords:
        if keyword.arg == "timeout":
            return _seconds(keyword.value) or 0.0
    if parameter.position is not None and len(args) > parameter.position:
        return _seconds(args[parameter.position]) or 0.0
    return parameter.default or 0.0


def _iterations(loop: ast.For | ast.AsyncFor) -> int:
    over = loop.iter
    if isinstance(over, ast.Tuple | ast.List | ast.Set):
        return len(over.elts)
    if isinstance(over, ast.Call) and _name(over) == "range" and len(over.args) == 1:
        count = _seconds(over.args[0])
        return int(count) if count is not None else 1
    return 1


def _budget(node: ast.AST) -> float:
    if isinstance(node, ast.For | ast.AsyncFor):
        inner = sum(_budget(child) for child in node.body + node.orelse)
        return _budget(node.iter) + _iterations(node) * inner
    total = 0.0
    if isinstance(node, ast.Call):
        name, args = _name(node), list(node.args)
        func = node.func
        if isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "asyncio" and name in ASYNCIO:
            parameter = ASYNCIO[name]  # asyncio.wait_for(aw, timeout), whatever the suite names so
        else:
            if name in PASS_THROUGH and args and isinstance(args[0], ast.Attribute | ast.Name):
                name = args[0].attr if isinstance(args[0], ast.Attribute) else args[0].id
                args = args[1:]
            parameter = _timeouts().get(name, TimeoutParameter(None, None))  # any call's timeout= counts
        if name not in MILLISECONDS:
            total += _call_wait(node, parameter, args)
    for child in ast.iter_child_nodes(node):
        total += _budget(child)
    return total


def _timeout_of(decorators: list[ast.expr]) -> float | None:
    for decorator in decorators:
        if isinstance(decorator, ast.Call) and _name(decorator) == "timeout" and decorator.args:
            return _seconds(decorator.args[0])
    return None


def _pytestmark(body: list[ast.stmt]) -> float | None:
    for statement in body:
        if isinstance(statement, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in statement.targets
        ):
            value = statement.value
            marks = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
            return _timeout_of(marks)
    return None


def _tests(path: Path) -> Iterator[tuple[str, FunctionNode, float]]:
    """Every test of a module with its pytest-timeout (its mark, else its class's, else the module's)."""
    module = ast.parse(path.read_text())
    module_limit = _pytestmark(module.body) or DEFAULT_TIMEOUT
    for node in module.body:
        if isinstance(node, FunctionNode) and node.name.startswith("test_"):
            yield node.name, node, _timeout_of(node.decorator_list) or module_limit
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            class_limit = _timeout_of(node.decorator_list) or _pytestmark(node.body) or module_limit
            for method in node.body:
                if isinstance(method, FunctionNode) and method.name.startswith("test_"):
                    limit = _timeout_of(method.decorator_list) or class_limit
                    yield f"{node.name}::{method.name}", method, limit


def test_every_test_outlasts_its_own_waits() -> None:
    short = []
    for path in sorted(INTEGRATION.glob("test_*.py")):
        for name, test, limit in _tests(path):
            budget = _budget(test)
            if budget > limit:
                short.append(f"{path.name}:{test.lineno} {name}: waits {budget:g} s, timeout {limit:g} s")
    assert short == []


def _wait_of(source: str) -> float:
    return _budget(ast.parse(source))


def test_the_budget_counts_what_the_issue_found_missing() -> None:
    """Positional timeouts, defaults, loops and helpers of the suite are all waits."""
    assert _wait_of("read_until(proc, 'x', 60)") == 60
    assert _wait_of("sub.next(10)") == 10
    assert _wait_of("eventually(lambda: True)") == 10  # tests.helpers.eventually's default
    assert _wait_of("asyncio.wait_for(x, 5)") == 5
    assert _wait_of("asyncio.to_thread(node.wait_ready, 20)") == 20
    assert _wait_of("for name in ('a', 'b'):\n    eventually(f, timeout=30)") == 60
    assert _wait_of("for i in range(3):\n    sub.next(timeout=2)") == 6
    assert _wait_of("d.get('k', 5)") == 0  # not a function with a timeout
