"""`meshplane status`: one line per service this shell points at; the exit code says if all are up."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from meshplane.launchers import NatsServer, StreamsServerProcess, free_port
from tests.support.cli import MESHPLANE, clean_env


def status(env: dict[str, str], *args: str) -> tuple[int, dict[str, dict[str, str]]]:
    result = subprocess.run(
        [*MESHPLANE, "status", "--json", *args], capture_output=True, text=True, timeout=60, env=env
    )
    checks = {c["name"]: c for c in map(json.loads, result.stdout.splitlines())}
    return result.returncode, checks


def base_env(tmp_path: Path) -> dict[str, str]:
    return {**clean_env(), "DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(tmp_path / "kv")}


def test_everything_up_then_something_down(nats_server: NatsServer, tmp_path: Path) -> None:
    env = {**base_env(tmp_path), "NATS_SERVER": nats_server.url}
    with StreamsServerProcess() as streams:
        streams.start()
        code, checks = status({**env, "MESHPLANE_STREAMS_URL": streams.url})
        assert code == 0, checks
        assert {name: c["state"] for name, c in checks.items()} == {
            "discovery": "ok",
            "nats": "ok",
            "streams": "ok",
        }
        assert "meshplane-streams" in checks["streams"]["detail"]
        assert "the folder does not exist yet" in checks["discovery"]["detail"]
        assert not (tmp_path / "kv").exists()  # a check creates nothing
    code, checks = status({**env, "NATS_SERVER": f"nats://127.0.0.1:{free_port()}"})
    assert code == 3
    assert checks["nats"]["state"] == "down"
    assert checks["streams"]["state"] == "skipped"


def test_refused_credentials_are_an_auth_failure(tmp_path: Path) -> None:
    with NatsServer(token="right") as nats:
        nats.start()
        code, checks = status({**base_env(tmp_path), "NATS_SERVER": f"nats://wrong@127.0.0.1:{nats.port}"})
    assert code == 4
    assert checks["nats"]["state"] == "auth"
    assert "wrong" not in checks["nats"]["detail"] + checks["nats"]["target"]


def test_brokers_of_broker_mode_are_checked(tmp_path: Path) -> None:
    xsub, xpub = free_port(), free_port()
    env = {
        **base_env(tmp_path),
        "DYN_EVENT_PLANE": "zmq",
        "DYN_ZMQ_BROKER_URL": f"xsub=tcp://127.0.0.1:{xsub} , xpub=tcp://127.0.0.1:{xpub}",
    }
    code, checks = status(env)
    assert code == 3
    assert (checks["broker xsub"]["state"], checks["broker xpub"]["state"]) == ("down", "down")


def test_an_up_that_was_killed_is_reported_not_its_stale_health(tmp_path: Path) -> None:
    import json as json_module
    import sys

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    running = {"pid": int(gone.stdout), "pipeline": {"state": "running", "pid": 1, "restarts": 0}}
    (tmp_path / "up.json").write_text(json_module.dumps(running))
    code, checks = status({**base_env(tmp_path), "MESHPLANE_STATE_DIR": str(tmp_path)})
    assert code == 3
    assert checks["up"]["state"] == "down"
    assert f"(pid {gone.stdout.strip()}) has stopped" in checks["up"]["detail"]
    assert "pipeline" not in checks
