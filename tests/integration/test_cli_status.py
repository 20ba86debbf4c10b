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


def test_a_streams_token_is_checked_not_just_the_public_health(tmp_path: Path) -> None:
    """Issue 57: `status` said ok with a wrong token (it asked only the public /health; exit 0)."""
    with StreamsServerProcess(env={"MESHPLANE_STREAMS_TOKEN": "right-t0ken-0123456789"}) as streams:
        streams.start()
        # zmq: no NATS to check, so the exit code is the streams server's alone
        env = {**base_env(tmp_path), "DYN_EVENT_PLANE": "zmq", "MESHPLANE_STREAMS_URL": streams.url}
        for token in ("wrong-t0ken-0123456789", None):
            given = {"MESHPLANE_STREAMS_TOKEN": token} if token else {}
            code, checks = status({**env, **given})
            assert code == 4, checks
            assert checks["streams"]["state"] == "auth", checks
            assert "wrong-t0ken" not in json.dumps(checks)
        code, checks = status({**env, "MESHPLANE_STREAMS_TOKEN": "right-t0ken-0123456789"})
        assert code == 0, checks
        assert "token accepted" in checks["streams"]["detail"]
        token_file = tmp_path / "token"
        token_file.write_text("wrong-t0ken-0123456789\n")
        code, checks = status(env, "--token-file", str(token_file))
        assert code == 4, checks


def test_the_mesh_node_of_a_mesh_plane_is_asked_for_its_secret(tmp_path: Path) -> None:
    env = {**base_env(tmp_path), "MESHPLANE_MESH_SECRET": "the-right-secret"}
    argv = ("--node-id", "a", "--route-port", "0")
    with StreamsServerProcess(extra_args=argv, env={"MESHPLANE_MESH_SECRET": "the-right-secret"}) as node:
        node.start()
        plane = {**env, "DYN_EVENT_PLANE": "mesh", "MESHPLANE_NODE": node.announced["mesh"]["route_url"]}
        code, checks = status(plane)
        assert code == 0, checks
        assert "node a, secret proven" in checks["mesh node"]["detail"]
        code, checks = status({**plane, "MESHPLANE_MESH_SECRET": "a-wrong-secret"})
        assert code == 4, checks
        assert checks["mesh node"]["state"] == "auth"
        assert "a-wrong-secret" not in json.dumps(checks)
