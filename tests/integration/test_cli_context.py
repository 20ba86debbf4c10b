"""The newcomer's flow: `meshplane up` in one shell, plain `sub`, `ls`, `topic`, `env` in another,
with no variables set; the context goes when `up` stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from tests.helpers import read_until, wait_until
from tests.support.cli import MESHPLANE


def clean_env() -> dict[str, str]:
    """A new shell: none of meshplane's variables (the tests' own config folder stays)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "NATS_", "ETCD_", "MESHPLANE_"))}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MESHPLANE, *args], capture_output=True, text=True, timeout=60, env=clean_env())


def start_up(state_dir: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """A `meshplane up` and what it printed up to its next steps."""
    argv = [*MESHPLANE, "up", "--no-pipeline", "--state-dir", str(state_dir), "--nats-port", "0"]
    argv += ["--streams-port", "0", "--publishers", "2", "--rate", "50", "--duration", "60", *extra]
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())
    try:
        lines = read_until(up.stdout, "as variables", 60, "up's next steps")
    except AssertionError:
        up.kill()
        raise
    return up, "".join(lines)


def stop(up: subprocess.Popen[str]) -> None:
    up.send_signal(signal.SIGINT)
    up.wait(timeout=60)
    assert up.returncode == 0


def test_commands_in_another_shell_use_the_context_of_up(tmp_path: Path) -> None:
    up, printed = start_up(tmp_path)
    try:
        assert "context 'local' is selected while this runs" in printed

        listed = run("ls")
        assert listed.returncode == 0, listed.stderr
        wait_until(lambda: run("ls").stdout.count("kv-events") >= 2, timeout=30, what="the demo publishers")

        sub = run("sub", "dynamo/worker", "kv-events", "--count", "3", "--json", "--timeout", "30")
        assert sub.returncode == 0, sub.stderr
        assert len(sub.stdout.splitlines()) == 3
        assert "kv-events: 2 publisher(s) in dynamo/worker/generate (2)" in sub.stderr

        stats = run("topic", "stats", "demo-events")
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["topic"] == "demo-events"
        first = run("topic", "consume", "demo-events", "-p", "0", "-c", "2")  # it hung: partition 0 was empty
        assert first.returncode == 0, first.stderr
        assert [json.loads(line)["partition"] for line in first.stdout.splitlines()] == [0, 0]

        env = run("env")
        assert f"export DYN_FILE_KV={tmp_path / 'kv'}" in env.stdout
        assert "export NATS_SERVER=nats://127.0.0.1:" in env.stdout
        contexts = run("context", "ls")
        assert contexts.stdout.startswith(f"* local                live (pid {up.pid})")
    finally:
        stop(up)
    assert run("context", "ls").stdout == ""  # gone with its `up`
    nothing = run("env")
    assert nothing.returncode == 2
    assert "no context is selected" in nothing.stderr


def test_a_saved_context_is_used_until_another_is_selected(tmp_path: Path) -> None:
    saved = subprocess.run(
        [*MESHPLANE, "context", "save", "files", "--select"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean_env(), "DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(tmp_path / "kv")},
    )
    assert saved.returncode == 0, saved.stderr
    shown = run("context", "show")
    assert f"DYN_FILE_KV={tmp_path / 'kv'}" in shown.stdout
    (tmp_path / "kv").mkdir()
    listed = run("ls")
    assert listed.returncode == 0, listed.stderr  # file discovery in an empty folder: an empty table
    assert listed.stdout.startswith("SCOPE")
    assert run("context", "select", "none").returncode == 0
    assert run("context", "ls").stdout.startswith("  files")
    assert run("context", "rm", "files").returncode == 0


def test_a_second_up_elsewhere_neither_takes_nor_deletes_the_first_ones_context(tmp_path: Path) -> None:
    """Issue 35, second finding: the second `up` took `local`, deleted it on exit, and `ls` went empty."""
    first, _ = start_up(tmp_path / "first")
    try:
        second, printed = start_up(tmp_path / "second")
        try:
            assert "context 'local-2'; another run's context is selected" in printed
            assert "MESHPLANE_CONTEXT=local-2 " in printed
            shown = run("env")
            assert f"DYN_FILE_KV={tmp_path / 'first' / 'kv'}" in shown.stdout
            theirs = subprocess.run(
                [*MESHPLANE, "env"],
                capture_output=True,
                text=True,
                timeout=60,
                env={**clean_env(), "MESHPLANE_CONTEXT": "local-2"},
            )
            assert f"DYN_FILE_KV={tmp_path / 'second' / 'kv'}" in theirs.stdout
            listed = run("context", "ls").stdout.splitlines()
            assert listed[0].startswith(f"* local                live (pid {first.pid})"), listed
            assert listed[1].startswith(f"  local-2              live (pid {second.pid})"), listed
            refused = run("context", "rm", "local")
            assert refused.returncode == 2
            assert f"belongs to a running process (pid {first.pid}" in refused.stderr
        finally:
            stop(second)
        assert run("context", "ls").stdout.startswith("* local ")
        wait_until(
            lambda: run("ls").stdout.count("kv-events") >= 2, timeout=30, what="the first run's publishers"
        )
    finally:
        stop(first)
    assert run("context", "ls").stdout == ""


def test_mesh_and_status_commands_find_the_nodes_of_up_nodes(tmp_path: Path) -> None:
    """Issue 35: from an `up --nodes 3` context, `mesh status` answered 404 (it asked the streams
    server) and `status` had no mesh row."""
    up, _ = start_up(tmp_path, "--nodes", "3")
    try:
        shown = run("mesh", "status", "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["node"] == "a"
        status = run("status", "--json")
        checks = {c["name"]: c for c in map(json.loads, status.stdout.splitlines())}
        assert [checks[f"mesh {node}"]["state"] for node in "abc"] == ["ok"] * 3, checks
        assert "2/2 links up" in checks["mesh a"]["detail"]
        assert checks["pipeline"]["state"] == "skipped"
    finally:
        stop(up)
