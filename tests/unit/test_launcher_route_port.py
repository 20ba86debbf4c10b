"""A mesh node the launcher starts without a route port gets a free one (``--route-port 0``), in every
argument form argparse takes: ``--flag value`` and ``--flag=value``; a port or config given is kept."""

from __future__ import annotations

import pytest

from meshplane.cli.main import build_parser
from meshplane.launchers.servers import StreamsServerProcess


def served(extra_args: tuple[str, ...]) -> tuple[int, object]:
    """The route port and config ``meshplane serve`` reads from the launcher's argv."""
    server = StreamsServerProcess(extra_args=extra_args)
    server.cleanup()  # its work directory: never started
    args = build_parser().parse_args(["serve", "--port", "0", "--data-dir", "d", *server._extra_args])
    return args.route_port, args.config


@pytest.mark.parametrize("node", [("--node-id", "a"), ("--node-id=a",)])
def test_a_node_given_no_route_port_gets_a_free_one(node: tuple[str, ...]) -> None:
    assert served(node) == (0, None)


@pytest.mark.parametrize("port", [("--route-port", "5"), ("--route-port=5",)])
def test_a_route_port_given_is_kept(port: tuple[str, ...]) -> None:
    assert served(("--node-id", "a", *port))[0] == 5


def test_a_config_given_names_the_route_port() -> None:
    route_port, config = served(("--node-id=a", "--config=node.toml"))
    assert str(config) == "node.toml"
    assert route_port != 0, "--route-port 0 added after a --config would override the file's port"
