"""Machines made of Linux network namespaces: each host its own namespace with one interface (eth0,
its own address) on a bridge that lives in a namespace of its own (the "switch"), so nothing of the
test's network touches the host's. Root only (``ip netns``).

Faults are what a network does: a host cut off from the switch (its port down), a pair of hosts that
cannot reach each other (packets dropped on the way, both ways or one: a connect hangs and a
connection's sends go unanswered, as on a real partition), a bandwidth cap (``tbf``; this kernel has
no ``netem``). Packets are dropped by routing them to a neighbour whose MAC address no port has: the
switch floods them and every host's interface discards them (a blackhole route failed connects at
once with EINVAL instead, and this kernel has neither nftables nor tc's drop action).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

SUBNET = "10.77.0"
NOWHERE = f"{SUBNET}.254", "02:00:00:00:00:fe"  # a neighbour no host is: what is routed there is lost
# Runs at once (the suite's short runs) each build their own namespaces (every name carries the run's
# pid; the same addresses in each are apart), but one at a time: ``ip netns add`` sets up /run/netns
# on first use, which two at once can race.
BUILDING = "/tmp/meshplane-chaos-netns.lock"


class NetworkError(RuntimeError):
    pass


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def tc(*args: str) -> None:
    done = subprocess.run(["tc", *args], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise NetworkError(f"tc {' '.join(args)}: {done.stderr.strip()}")


def can_build() -> str:
    """Empty when this process can build namespaces, else why not."""
    if os.geteuid() != 0:
        return "the fault harness needs root (ip netns, tc)"
    try:
        subprocess.run(["ip", "netns", "list"], capture_output=True, check=True, timeout=10)
        subprocess.run(["tc", "-V"], capture_output=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the fault harness needs iproute2's ip and tc ({exc})"
    return ""


@contextlib.contextmanager
def building() -> Iterator[None]:
    """Namespaces added or removed by this process alone (of those that take this lock)."""
    with open(BUILDING, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@dataclass
class Network:
    """Hosts by name (``a``, ``b``, ``client``...), each at ``address(name)`` in namespace ``ns(name)``."""

    hosts: list[str]
    prefix: str = field(default_factory=lambda: f"mp{os.getpid()}")
    built: list[str] = field(default_factory=list)  # namespaces made so far (removed by ``teardown``)

    @property
    def switch(self) -> str:
        return f"{self.prefix}-switch"

    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def address(self, host: str) -> str:
        return f"{SUBNET}.{self.hosts.index(host) + 2}"

    def port(self, host: str) -> str:
        """The host's port on the switch (a veth end in the switch's namespace)."""
        return f"p{self.hosts.index(host)}"

    def exec_prefix(self, host: str) -> tuple[str, ...]:
        """What runs a command on ``host``."""
        return ("ip", "netns", "exec", self.ns(host))

    def build(self) -> Network:
        with building():
            return self._build()

    def _build(self) -> Network:
        try:
            self._add_namespace(self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for host in self.hosts:
                ns = self._add_namespace(self.ns(host))
                port = self.port(host)
                ip(
                    "-n",
                    self.switch,
                    "link",
                    "add",
                    port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    ns,
                )
                ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
                ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
                ip("-n", ns, "link", "set", "eth0", "up")
                ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self._teardown()
            raise
        return self

    def _add_namespace(self, name: str) -> str:
        ip("netns", "add", name)
        self.built.append(name)
        return name

    def teardown(self) -> None:
        """Remove every namespace (and with them the veths, routes and qdiscs); processes still inside
        keep their sockets but reach nothing."""
        with building():
            self._teardown()

    def _teardown(self) -> None:
        while self.built:
            subprocess.run(["ip", "netns", "del", self.built.pop()], capture_output=True, timeout=10)

    # --- faults ---------------------------------------------------------------------------------------

    def isolate(self, host: str) -> None:
        ip("-n", self.switch, "link", "set", self.port(host), "down")

    def rejoin(self, host: str) -> None:
        ip("-n", self.switch, "link", "set", self.port(host), "up")

    def drop(self, source: str, destination: str) -> None:
        """Packets from ``source`` to ``destination`` are dropped (one way), silently."""
        ns, (address, mac) = self.ns(source), NOWHERE
        ip("-n", ns, "neigh", "replace", address, "lladdr", mac, "dev", "eth0", "nud", "permanent")
        ip("-n", ns, "route", "replace", f"{self.address(destination)}/32", "via", address, "dev", "eth0")

    def undrop(self, source: str, destination: str) -> None:
        ip("-n", self.ns(source), "route", "del", f"{self.address(destination)}/32")

    def cap(self, host: str, rate: str) -> None:
        """``host``'s outgoing traffic limited to ``rate`` (tc's units: 1mbit, 200kbit)."""
        shape = ("tbf", "rate", rate, "burst", "16kb", "latency", "400ms")
        tc("-n", self.ns(host), "qdisc", "replace", "dev", "eth0", "root", *shape)

    def uncap(self, host: str) -> None:
        tc("-n", self.ns(host), "qdisc", "del", "dev", "eth0", "root")
