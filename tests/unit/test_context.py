"""Connection contexts: saved, selected, read under the environment; a stopped owner's is not used."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
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
