"""`meshplane serve --config FILE` on a real server: the file's sections reach the service, flags win
over it; a bad file is one line; `config show` prints a file `config check` accepts."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import pytest

from meshplane.errors import MeshplaneError
from meshplane.launchers import StreamsServerProcess
from meshplane.streams.client import StreamsClient
from tests.support.cli import MESHPLANE, plane_env

CONFIG = """\
port = 1  # the flag --port wins
fsync = "always"

[limits]
max_topics = 2

[mesh]
node_id = "from-file"
route_port = 0

[distributed_state]
bloom_filter_capacity = 5000
"""


def test_serve_takes_its_settings_from_the_file_and_flags_win(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(CONFIG)
    with StreamsServerProcess(extra_args=("--config", str(config))) as server:
        server.start()
        assert server.port != 1
        assert server.announced["mesh"]["node"] == "from-file"

        async def create_three() -> list[str]:
            failures = []
            async with StreamsClient(server.url) as client:
                for name in ("one", "two", "three"):
                    try:
                        await client.create_topic(name, 1)
                    except MeshplaneError as exc:
                        failures.append(str(exc))
                status = await client.request("GET", "/mesh")
            assert status["node"] == "from-file"
            return failures

        failures = asyncio.run(create_three())
    assert len(failures) == 1
    assert "topics" in failures[0]


def test_a_bad_file_stops_serve_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text("[limits]\nmax_topicz = 2\nmax_rooms = 'many'\n")
    result = subprocess.run(
        [*MESHPLANE, "serve", "--config", str(config), "--port", "0", "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=60,
        env=plane_env(tmp_path),
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"meshplane: error: {config}:2: [limits] max_topicz: unknown key (did you mean max_topics?) "
        f"and 1 more (meshplane config check {config} lists every problem)"
    )
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("storage", [None, "nats://user:pw@127.0.0.1:4222"])
def test_config_show_says_where_each_setting_comes_from_and_prints_a_file_check_accepts(
    tmp_path: Path, storage: str | None
) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(CONFIG)
    env = plane_env(tmp_path)
    if storage:
        env["MESHPLANE_STREAMS_STORAGE"] = storage
    shown = subprocess.run(
        [*MESHPLANE, "config", "show", str(config), "--port", "17000"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "port = 17000  # flag --port" in lines
    assert f'fsync = "always"  # {config}:2' in lines
    assert f"max_topics = 2  # {config}:5" in lines
    assert "max_rooms = 10000  # default" in lines
    assert "bloom_filter_capacity = 5000" in shown.stdout
    if storage:
        assert '# storage = "nats://***@127.0.0.1:4222"  # $MESHPLANE_STREAMS_STORAGE' in lines
        assert "pw" not in shown.stdout
    again = tmp_path / "shown.toml"
    again.write_text(shown.stdout)
    checked = subprocess.run(
        [*MESHPLANE, "config", "check", str(again)], capture_output=True, text=True, timeout=60, env=env
    )
    assert checked.returncode == 0, checked.stdout
    assert checked.stdout.endswith("no problems\n")


def _meshplane(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MESHPLANE, *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd)


def test_config_check_refuses_what_serve_refuses_in_the_files_terms(tmp_path: Path) -> None:
    """Issue 57: the docs' example set tls_cert without tls_key: `config check` passed it and `serve`
    refused it naming flags (--mesh-tls-cert and --mesh-tls-key go together); a dotted key was
    reported on the wrong line."""
    env = plane_env(tmp_path)
    config = tmp_path / "serve.toml"
    config.write_text(
        'port = 15500\n\n[mesh]\nnode_id = "a"\ntls_cert = "/etc/meshplane/a.pem"   # --mesh-tls-cert\n'
    )
    checked = _meshplane("config", "check", str(config), env=env)
    assert checked.returncode == 2
    assert checked.stdout == f"{config}:5: [mesh] tls_cert: needs tls_key: a certificate goes with its key\n"
    served = _meshplane("serve", "--config", str(config), env=env)
    assert served.returncode == 2
    assert f"{config}:5: [mesh] tls_cert: needs tls_key" in served.stderr
    assert "--mesh-tls" not in served.stderr
    # A flag given with the file is named as the flag
    served = _meshplane(
        "serve", "--config", str(config), "--mesh-tls-key", "a.key", "--storage", "nats://h:4222", env=env
    )
    assert served.returncode == 2
    assert "--storage must be local on a mesh node ([mesh] node_id)" in served.stderr

    dotted = tmp_path / "dotted.toml"
    dotted.write_text(
        'port = 15500\nfsync = "always"\nmesh.node_id = "a"\nmesh.routes = ["tcp://10.0.0.2:16500"]\n\n'
        'mesh.tls_ca = "/etc/meshplane/ca.pem"\n'
    )
    checked = _meshplane("config", "check", str(dotted), env=env)
    assert checked.returncode == 2
    assert checked.stdout.startswith(f"{dotted}:6: [mesh] tls_ca: needs tls_cert and tls_key"), checked.stdout
    dotted.write_text('fsync = "always"\nmesh.routes = ["tcp://10.0.0.2:16500"]\n')
    checked = _meshplane("config", "check", str(dotted), env=env)
    assert checked.stdout.startswith(f"{dotted}:2: [mesh] routes: needs node_id"), checked.stdout


@pytest.mark.parametrize(
    "storage",
    [
        "nats://127.0.0.1:4222,nats://s3cr3t@127.0.0.1:4223",
        "nats://s3cr3t@127.0.0.1:4222",
        "tls://u:s3cr3t@h:4222",
    ],
)
def test_config_check_finds_credentials_in_any_url_of_a_list_and_in_natss_token_form(
    tmp_path: Path, storage: str
) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(f'storage = "{storage}"\n')
    checked = _meshplane("config", "check", str(config), env=plane_env(tmp_path))
    assert checked.returncode == 2
    assert "holds credentials: they go in $MESHPLANE_STREAMS_STORAGE" in checked.stdout
    assert "s3cr3t" not in checked.stdout


def test_every_toml_snippet_of_the_docs_passes_config_check_and_starts_serve(tmp_path: Path) -> None:
    root = Path(__file__).parents[2]
    snippets = [
        body
        for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
        for body in re.findall(r"```toml\n(.*?)```", page.read_text(), re.DOTALL)
    ]
    assert snippets
    env = plane_env(tmp_path)
    for argv in (["ca"], ["node", "a"]):  # the files the snippets name, made as the docs say
        subprocess.run([*MESHPLANE, "tls", *argv, "--dir", str(tmp_path / "certs")], env=env, check=True)
    for number, snippet in enumerate(snippets):
        config = tmp_path / f"snippet-{number}.toml"
        config.write_text(snippet)
        checked = _meshplane("config", "check", str(config), env=env)
        assert checked.returncode == 0, checked.stdout
        # serve with it, where this machine's paths and ports replace the deployment's
        local = snippet.replace("/etc/meshplane/", f"{tmp_path}/certs/").replace(
            "/var/lib/meshplane/", f"{tmp_path}/lib-{number}/"
        )
        config.write_text(local)
        with StreamsServerProcess(extra_args=("--config", str(config), "--route-port", "0")) as server:
            server.start(timeout=60)
            assert server.announced["url"].startswith("http")


def test_config_check_names_every_mistake_of_the_vpn_file_it_names_with_its_line(tmp_path: Path) -> None:
    vpns = tmp_path / "vpns.toml"
    vpns.write_text('[vpns.A]\nmax_queues = 0\n[vpns.A.users.u]\npassword_hash = "plain"\n')
    config = tmp_path / "serve.toml"
    config.write_text(f'[mesh]\nnode_id = "a"\nvpns = "{vpns}"\n')
    checked = _meshplane("config", "check", str(config), env=plane_env(tmp_path))
    assert checked.returncode == 2
    lines = checked.stdout.splitlines()
    assert lines[0].startswith(f"{vpns}:2: [vpns.A]: max_queues"), lines
    assert lines[1].startswith(f"{vpns}:4: [vpns.A.users.u]: password_hash must be an argon2 hash"), lines
