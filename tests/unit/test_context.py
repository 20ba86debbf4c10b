"""Connection contexts: saved, selected, read under the environment; a stopped owner's is not used."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshplane import PlaneConfig, context
from meshplane.errors import ConfigError


@pytest.fixture(autouse=True)
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("MESHPLANE_CONTEXT", raising=False)
    for name in context.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_the_selected_context_is_read_and_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    assert context.current() is None
    values = {"NATS_SERVER": "nats://127.0.0.1:4333", "DYN_EVENT_PLANE": "zmq"}
    context.save(context.Context("work", values, "the work cluster"))
    assert PlaneConfig.from_env().nats_server == "nats://127.0.0.1:4222"  # saved, not selected
    context.select("work")
    config = PlaneConfig.from_env()
    assert (config.nats_server, config.event_plane) == ("nats://127.0.0.1:4333", "zmq")
    monkeypatch.setenv("DYN_EVENT_PLANE", "nats")
    assert PlaneConfig.from_env().event_plane == "nats"
    monkeypatch.setenv("MESHPLANE_CONTEXT", "none")
    assert PlaneConfig.from_env().nats_server == "nats://127.0.0.1:4222"


def test_a_context_of_a_stopped_process_is_not_used(caplog: pytest.LogCaptureFixture) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    context.save(context.Context("local", {"DYN_EVENT_PLANE": "zmq"}, owner_pid=int(gone.stdout)))
    context.select("local")
    assert context.current() is None
    assert "has stopped" in caplog.text
    context.save(context.Context("local", {"DYN_EVENT_PLANE": "zmq"}, owner_pid=os.getpid()))
    assert context.current() is not None


def test_files_are_private_and_secrets_are_not_shown(config_home: Path) -> None:
    path = context.save(
        context.Context(
            "secure",
            {"NATS_SERVER": "nats://s3cret@127.0.0.1:4222", "MESHPLANE_STREAMS_TOKEN": "t0ken"},
        )
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    shown = context.load("secure").shown()
    assert shown == {"NATS_SERVER": "nats://***@127.0.0.1:4222", "MESHPLANE_STREAMS_TOKEN": "***"}


def test_bad_names_files_and_variables_are_clear_errors(config_home: Path) -> None:
    with pytest.raises(ConfigError, match=r"context name '\.\./x'"):
        context.save(context.Context("../x", {}))
    with pytest.raises(ConfigError, match="a context holds only"):
        context.save(context.Context("x", {"PATH": "/bin"}))
    with pytest.raises(ConfigError, match="no context named 'missing'"):
        context.select("missing")
    folder = config_home / "meshplane" / "context"
    folder.mkdir(parents=True)
    (folder / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"broken\.json is unreadable"):
        context.load("broken")


def test_names_select_and_remove() -> None:
    for name in ("b", "a"):
        context.save(context.Context(name, {"DYN_EVENT_PLANE": "zmq"}))
    context.select("a")
    assert (context.names(), context.selected_name()) == (["a", "b"], "a")
    context.remove("a")
    assert (context.names(), context.selected_name()) == (["b"], None)


def test_a_selected_context_removed_by_hand_is_not_used(
    config_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = context.save(context.Context("gone", {"DYN_EVENT_PLANE": "zmq"}))
    context.select("gone")
    path.unlink()
    assert context.current() is None
    assert "does not exist" in caplog.text
    assert PlaneConfig.from_env().event_plane == "nats"


@pytest.fixture
def other_run() -> Iterator[int]:
    """The pid of another live process, standing for another `meshplane up`."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def test_a_run_takes_a_name_of_its_own_and_leaves_another_runs_selection_alone(other_run: int) -> None:
    """Issue 35, second finding: a second `up` replaced `local`, deleted it on exit while the first ran."""
    theirs = context.Context("local", {"DYN_EVENT_PLANE": "zmq"}, "first up", owner_pid=other_run)
    context.save(theirs)
    context.select("local")
    name, selected = context.claim_for_run("local", {"DYN_EVENT_PLANE": "nats"}, "second up")
    assert (name, selected) == ("local-2", False)
    assert context.load("local") == theirs
    assert context.selected_name() == "local"
    with pytest.raises(ConfigError, match=rf"belongs to a running process \(pid {other_run}"):
        context.remove("local")
    with pytest.raises(ConfigError, match="cannot replace context 'local'"):
        context.save(context.Context("local", {"DYN_EVENT_PLANE": "nats"}))
    context.release_run(name)
    assert context.names() == ["local"]
    assert context.selected_name() == "local"
    current = context.current()
    assert current is not None
    assert current.values == {"DYN_EVENT_PLANE": "zmq"}


def test_a_run_restores_the_selection_it_found(other_run: int) -> None:
    context.save(context.Context("work", {"DYN_EVENT_PLANE": "zmq"}))
    context.select("work")
    name, selected = context.claim_for_run("local", {"DYN_EVENT_PLANE": "nats"}, "up")
    assert (name, selected, context.selected_name()) == ("local", True, "local")
    context.release_run(name)
    assert (context.names(), context.selected_name()) == (["work"], "work")
    # With nothing before it, the selection passes to another run that still lives, else to nobody.
    context.select(None)
    name, _ = context.claim_for_run("local", {"DYN_EVENT_PLANE": "nats"}, "up")
    context.save(context.Context("local-9", {"DYN_EVENT_PLANE": "zmq"}, owner_pid=other_run))
    context.release_run(name)
    assert context.selected_name() == "local-9"


def test_a_stopped_runs_context_is_taken_over_and_another_process_cannot_release_ours() -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    context.save(context.Context("local", {"DYN_EVENT_PLANE": "zmq"}, owner_pid=int(gone.stdout)))
    context.select("local")
    assert context.claim_for_run("local", {"DYN_EVENT_PLANE": "nats"}, "up") == ("local", True)
    assert context.load("local").previous is None  # not itself
    context.save(context.Context("saved", {"DYN_EVENT_PLANE": "zmq"}))
    context.release_run("saved")  # not ours: untouched
    assert context.names() == ["local", "saved"]
