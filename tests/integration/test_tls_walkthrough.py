"""`meshplane tls` as a user meets it: docs/security.md's certificate walkthrough run as written (a
two-node TLS mesh and a client), and a client whose check fails told which name it expected and
which the certificate has."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from meshplane.launchers import StreamsServerProcess
from meshplane.launchers.base import free_port
from tests.helpers import read_until
from tests.support.cli import MESHPLANE, plane_env

ROOT = Path(__file__).parents[2]


def walkthrough(name: str) -> str:
    """The shell block under ``<!-- walkthrough: NAME -->`` in docs/security.md."""
    text = (ROOT / "docs" / "security.md").read_text()
    found = re.search(rf"<!-- walkthrough: {name} -->\n```sh\n(.*?)```", text, re.DOTALL)
    assert found is not None, f"docs/security.md has no walkthrough block {name!r}"
    return found[1]


def user_env(tmp_path: Path) -> dict[str, str]:
    """A user's shell: the venv's bin first (as `make shell`), no meshplane variables."""
    env = plane_env(tmp_path, "mesh")
    env.pop("DYN_EVENT_PLANE")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.timeout(230)  # its waits add up to 210 s
def test_the_security_docs_certificate_walkthrough_runs_as_written(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    made = subprocess.run(
        ["bash", "-euc", walkthrough("certificates")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    assert "PRIVATE KEY" not in made.stdout + made.stderr  # keys are written, never printed
    for key in ("ca.key", "a.key", "b.key", "app.key"):
        assert stat.S_IMODE((tmp_path / "certs" / key).stat().st_mode) == 0o600
    shown = made.stdout
    assert "URI:meshplane://node/east/a" in shown
    assert "DNS:a" in shown
    assert "IP:127.0.0.1" in shown
    assert "URI:meshplane://client/app" in shown

    # The mesh block on free ports: two nodes over TLS 1.3, a client publishing into a, one reading b.
    script = walkthrough("mesh")
    for port in ("15501", "15502", "16501", "16502"):
        script = script.replace(port, str(free_port()))
    run = subprocess.Popen(
        ["bash", "-euc", script],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the nodes and the publisher are its children: stopped with it
    )
    try:
        lines = read_until(run.stdout, "hello over TLS", timeout=90, what="the walkthrough's subscriber")
        assert run.wait(timeout=30) == 0
        assert any("'hello over TLS'" in line for line in lines), lines
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        run.wait(timeout=30)
        assert run.stderr is not None
        errors = run.stderr.read()
    assert "Traceback" not in errors, errors


@pytest.mark.timeout(350)  # its waits add up to 330 s
def test_a_client_refused_by_the_certificate_is_told_which_name_it_expected_and_which_it_has(
    tmp_path: Path,
) -> None:
    """Issue 57: a certificate without 127.0.0.1 failed every client with `IP address mismatch`,
    then 'start meshplane serve --node-id ...' although the node was running."""
    env = user_env(tmp_path)
    certs = tmp_path / "certs"
    for argv in (["ca"], ["node", "a", "--host", "10.9.9.9"], ["client", "app"]):
        subprocess.run([*MESHPLANE, "tls", *argv, "--dir", str(certs)], env=env, check=True, timeout=60)
    node = subprocess.Popen(
        [
            *MESHPLANE,
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "a-data"),
            "--node-id",
            "a",
            "--route-port",
            "0",
            "--mesh-tls-cert",
            str(certs / "a.pem"),
            "--mesh-tls-key",
            str(certs / "a.key"),
            "--mesh-tls-ca",
            str(certs / "ca.pem"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        announced = json.loads(read_until(node.stdout, r"route_url", 60, "the node's address")[-1])
        client_env = {
            **env,
            "DYN_EVENT_PLANE": "mesh",
            "MESHPLANE_NODE": announced["mesh"]["route_url"],
            "MESHPLANE_MESH_TLS_CA": str(certs / "ca.pem"),
            "MESHPLANE_MESH_TLS_CERT": str(certs / "app.pem"),
            "MESHPLANE_MESH_TLS_KEY": str(certs / "app.key"),
        }
        result = subprocess.run(
            [*MESHPLANE, "pub", "shop/orders", "orders", "x"],
            env=client_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        node.terminate()
        node.wait(timeout=30)
    assert result.returncode == 3, result.stderr
    assert "expected one naming '127.0.0.1'" in result.stderr
    assert "IP:10.9.9.9" in result.stderr
    assert "DNS:a" in result.stderr
    assert "start `meshplane serve" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.timeout(260)  # its waits add up to 240 s
@pytest.mark.parametrize("role", ["ca", "node", "client"])
def test_tls_never_replaces_a_file_without_force(tmp_path: Path, role: str) -> None:
    env = user_env(tmp_path)
    argv = {"ca": ["ca"], "node": ["node", "a"], "client": ["client", "app"]}[role]
    if role != "ca":
        subprocess.run([*MESHPLANE, "tls", "ca"], cwd=tmp_path, env=env, check=True, timeout=60)
    subprocess.run([*MESHPLANE, "tls", *argv], cwd=tmp_path, env=env, check=True, timeout=60)
    key = next(p for p in (tmp_path / "certs").glob("*.key") if p.name != "ca.key" or role == "ca")
    before = key.read_bytes()
    again = subprocess.run(
        [*MESHPLANE, "tls", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 2
    assert "--force" in again.stderr
    assert key.read_bytes() == before
    subprocess.run([*MESHPLANE, "tls", *argv, "--force"], cwd=tmp_path, env=env, check=True, timeout=60)
    assert key.read_bytes() != before
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


@pytest.mark.timeout(260)  # its waits add up to 240 s
def test_an_https_streams_server_whose_certificate_is_refused_is_explained_not_unreachable(
    tmp_path: Path,
) -> None:
    env = user_env(tmp_path)
    certs = tmp_path / "certs"
    for made in (["ca"], ["server", "streams", "--host", "10.9.9.9"]):
        subprocess.run([*MESHPLANE, "tls", *made, "--dir", str(certs)], env=env, check=True, timeout=60)
    tls = ("--tls-cert", str(certs / "streams.pem"), "--tls-key", str(certs / "streams.key"))
    with StreamsServerProcess(extra_args=tls) as server:
        server.start()
        client_env = {**env, "SSL_CERT_FILE": str(certs / "ca.pem"), "DYN_EVENT_PLANE": "zmq"}
        listed = subprocess.run(
            [*MESHPLANE, "topic", "list", "--url", server.url],
            env=client_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        status = subprocess.run(
            [*MESHPLANE, "status", "--url", server.url, "--json"],
            env=client_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert listed.returncode != 0
    for said in (listed.stderr, status.stdout):
        assert "answered, but its TLS certificate was refused" in said, said
        assert "expected one naming '127.0.0.1'" in said
        assert "IP:10.9.9.9" in said
        assert "cannot reach" not in said.lower()
