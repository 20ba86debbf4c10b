"""etcd from Debian's etcd-server package."""

from __future__ import annotations

import shutil
from pathlib import Path

from meshplane.launchers.base import (
    ServerError,
    ServerProcess,
    find_binary,
    free_port,
    wait_for_port,
)


class EtcdServer(ServerProcess):
    """etcd (Debian's ``etcd-server``) with its data in a temporary folder, kept across restarts."""

    def __init__(self, host: str = "127.0.0.1", tls: tuple[Path, Path, Path | None] | None = None) -> None:
        """``tls``: (certificate, key, CA that clients' certificates must chain to, or None)."""
        super().__init__()
        self.host = host
        self.tls = tls
        self.client_port = 0
        self.peer_port = 0

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.client_port}"

    def start(self, timeout: float = 20.0, wipe: bool = False) -> EtcdServer:
        """Start (or restart on the same ports); ``wipe`` deletes the data first."""
        data = self.workdir / "data"
        if wipe:
            shutil.rmtree(data, ignore_errors=True)
        for _ in range(5):
            if not self.client_port:
                self.client_port, self.peer_port = free_port(self.host), free_port(self.host)
            client, peer = self.endpoint, f"http://{self.host}:{self.peer_port}"
            tls: list[str] = []
            if self.tls:
                cert, key, client_ca = self.tls
                tls = ["--cert-file", str(cert), "--key-file", str(key)]
                if client_ca is not None:
                    tls += ["--client-cert-auth", "--trusted-ca-file", str(client_ca)]
            proc = self._spawn(
                [
                    find_binary("etcd"),
                    "--name",
                    "meshplane-test",
                    "--data-dir",
                    str(data),
                    "--listen-client-urls",
                    client,
                    "--advertise-client-urls",
                    client,
                    "--listen-peer-urls",
                    peer,
                    "--initial-advertise-peer-urls",
                    peer,
                    "--initial-cluster",
                    f"meshplane-test={peer}",
                    "--log-level",
                    "warn",
                    *tls,
                ]
            )
            try:
                wait_for_port(self.host, self.client_port, proc, timeout, self.log_path)
                return self
            except ServerError:
                if proc.poll() is None:
                    raise
                self.client_port = 0  # lost a race for the port: pick new ones
        raise ServerError(f"etcd did not start: {self.log_path.read_text()[-2000:]}")
