"""serve's config file, checked against serve's real parser: every flag has one key, every problem is
found with its line, secrets are refused, values are what the flags would have made."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from meshplane.cli.config_file import SEED_SECTIONS, read_config, settings_of
from meshplane.cli.main import build_parser
from meshplane.cli.options import subcommands


@pytest.fixture
def serve() -> argparse.ArgumentParser:
    return subcommands(build_parser())["serve"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serve.toml"
    path.write_text(text)
    return path


def test_every_serve_flag_has_one_key_and_seed_004s_sections_hold_theirs(
    serve: argparse.ArgumentParser,
) -> None:
    settings = settings_of(serve)
    flags = {
        action.dest
        for action in serve._actions
        if action.option_strings
        and action.dest not in ("help", "config")
        and action.help != argparse.SUPPRESS
    }
    assert sorted(s.action.dest for s in settings.values()) == sorted(flags)
    for key, section in SEED_SECTIONS.items():
        assert settings[(section, key)].action.dest == key
    assert settings[("mesh", "tls_cert")].flag == "--mesh-tls-cert"
    assert settings[("mesh_limits", "max_routes")].flag == "--mesh-max-routes"
    assert settings[("limits", "max_topics")].flag == "--max-topics"
    assert settings[("server", "port")].flag == "--port"


def test_values_become_what_the_flags_would_have_made(serve: argparse.ArgumentParser, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'port = 16001\ndata_dir = "/srv/streams"\nstandby = true\n'
        "[server]\nno_auto_create = true\n"
        '[mesh]\nnode_id = "a"\nroutes = ["tcp://h:1", "tcp://h:2"]\ngateway = "c2=tcp://h:3"\n'
        'tls_ca = "ca.pem"\n[http]\nbackpressure_policy = "drop_oldest"\n'
        "[distributed_state]\nbloom_filter_fpr = 0.02\n",
    )
    config = read_config(path, serve)
    assert config.problems == []
    assert config.values == {
        "port": 16001,
        "data_dir": Path("/srv/streams"),
        "standby": True,
        "no_auto_create": True,
        "node_id": "a",
        "routes": ("tcp://h:1", "tcp://h:2"),
        "gateway": [("c2", "tcp://h:3")],
        "mesh_tls_ca": Path("ca.pem"),
        "backpressure_policy": "drop_oldest",
        "bloom_filter_fpr": 0.02,
    }
    assert config.lines["node_id"] == 7


def test_every_problem_is_found_with_its_line(serve: argparse.ArgumentParser, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "port = 'x'\n"  # 1
        "[limits]\n"  # 2
        "max_topicz = 3\n"  # 3
        "[mesh]\n"  # 4
        "max_routes = 4\n"  # 5
        "standby = 1\n"  # 6
        "[http]\n"  # 7
        "backpressure_policy = 'sometimes'\n"  # 8
        "token = 's3cret'\n"  # 9
        "[sever]\n"  # 10
        "port = 1\n"  # 11
        "[server]\n"  # 12
        "storage = 'nats://user:pw@h:4222'\n"  # 13
        "fsync = true\n",  # 14
    )
    rendered = [p.render(path) for p in read_config(path, serve).problems]
    assert rendered == [
        f"{path}:1: [server] port: 'x' is not valid for --port (invalid literal for int() with base 10: 'x')",
        f"{path}:3: [limits] max_topicz: unknown key (did you mean max_topics?)",
        f"{path}:5: [mesh] max_routes: unknown key in [mesh]: it belongs in [mesh_limits]",
        f"{path}:6: [mesh] standby: unknown key in [mesh]: it belongs in [server]",
        f"{path}:8: [http] backpressure_policy: 'sometimes' is not one of "
        "drop_oldest, drop_newest, disconnect",
        f"{path}:9: [http] token: secrets are not read from the config file: tokens come from token_file, "
        "the mesh secrets from $MESHPLANE_MESH_MEMBER_SECRET and $MESHPLANE_MESH_CLIENT_SECRET",
        f"{path}:10: [sever]: unknown section (did you mean [server]?)",
        f"{path}:13: [server] storage: a URL holds credentials: they go in $MESHPLANE_STREAMS_STORAGE, "
        "not in the config file",
        f"{path}:14: [server] fsync: expected a string, not True",
    ]
    assert "s3cret" not in " ".join(rendered)
    assert "pw@" not in " ".join(rendered)


def test_a_file_that_is_not_toml_or_not_there_is_one_problem(
    serve: argparse.ArgumentParser, tmp_path: Path
) -> None:
    broken = read_config(write(tmp_path, "port = 1\n[limits\n"), serve).problems
    assert len(broken) == 1
    assert (broken[0].line, broken[0].where) == (2, "syntax")
    missing = read_config(tmp_path / "absent.toml", serve).problems
    assert [p.message for p in missing] == ["cannot read it: No such file or directory"]
