"""Evidence that a fault acted, read from the system while it is on (not from the harness's own
bookkeeping): a partition drops a probe's packets (its connect hangs, where a healthy host refuses
at once), a killed server's process is gone, a paused one is stopped (state T), a power loss took
the server and its lossy disk's process and detached the mount, a cap's shaper carried packets, a
slow link's proxy held chunks back, a clock step reached the server's clock. A planned fault with
no evidence makes the run invalid: a nemesis that did nothing proves nothing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tests.chaos.schedule import Fault

if TYPE_CHECKING:
    from tests.chaos.harness import Servers

PROBE_PORT = 9  # nothing listens there: a host that receives the probe refuses it at once
POLL = 0.05


def prove(servers: Servers, fault: Fault, until: float) -> str:
    """What shows ``fault`` acting, polled until ``until`` (monotonic: when it is healed); empty if
    nothing did."""
    check = _checks(servers, fault)
    while True:
        found = check(until)
        if found or time.monotonic() + POLL >= until:
            return found
        time.sleep(POLL)


def _checks(servers: Servers, fault: Fault) -> Callable[[float], str]:
    net, hosts, first = servers.network, fault.hosts, fault.hosts[0]
    match fault.kind:
        case "isolate":
            return lambda until: hangs(servers, "client", first, until)
        case "cut":
            return lambda until: both(
                hangs(servers, first, hosts[1], until), hangs(servers, hosts[1], first, until)
            )
        case "one-way":
            return lambda until: hangs(servers, first, hosts[1], until)
        case "kill":
            return lambda until: killed(servers, first)
        case "pause":
            return lambda until: paused(servers, first)
        case "power" | "power-all":
            return lambda until: both(*(powered_off(servers, host) for host in hosts))
        case "cap":
            return lambda until: shaped(net.ns(first))
        case "slow":
            before = {host: delayed(servers, host) for host in hosts}
            return lambda until: slowed(servers, hosts, before)
        case "clock":
            return lambda until: clock_seen(servers, first)
    raise ValueError(f"no evidence known for {fault.kind}")


def both(*found: str) -> str:
    """All of ``found``, or nothing if any is missing."""
    return "; ".join(found) if all(found) else ""


def hangs(servers: Servers, source: str, destination: str, until: float) -> str:
    """A connect from ``source``'s namespace to ``destination`` that goes unanswered (timed out or
    unreachable); empty if it was answered (refused or accepted)."""
    net = servers.network
    timeout = max(0.2, min(1.0, until - time.monotonic() - 0.1))
    outcome: list[str] = []

    def probe() -> None:
        # A thread of its own, moved into the source's namespace and gone after: no other thread's changes.
        from tests.chaos.harness import enter

        enter(f"/run/netns/{net.ns(source)}")
        began = time.monotonic()
        try:
            socket.create_connection((net.address(destination), PROBE_PORT), timeout=timeout).close()
            outcome.append("")
        except TimeoutError:
            outcome.append(
                f"connect {source} -> {destination} unanswered for {time.monotonic() - began:.1f}s"
            )
        except OSError as exc:  # refused: answered; unreachable (no ARP answer): not
            unanswered = exc.errno not in (None, 111)
            outcome.append(f"connect {source} -> {destination}: {exc.strerror}" if unanswered else "")

    thread = threading.Thread(target=probe, name=f"probe-{source}-{destination}")
    thread.start()
    thread.join(timeout + 5)
    return outcome[0] if outcome else ""


def process(servers: Servers, host: str) -> subprocess.Popen[bytes] | None:
    proc: subprocess.Popen[bytes] | None = getattr(servers.servers[host], "proc", None)
    return proc


def killed(servers: Servers, host: str) -> str:
    proc = process(servers, host)
    if proc is None or proc.poll() != -signal.SIGKILL or Path(f"/proc/{proc.pid}").exists():
        return ""
    return f"{host}: pid {proc.pid} gone (SIGKILL)"


def paused(servers: Servers, host: str) -> str:
    proc = process(servers, host)
    if proc is None:
        return ""
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except OSError:
        return ""
    state = stat.rsplit(")", 1)[1].split()[0]  # after the command's name, which may hold spaces
    return f"{host}: pid {proc.pid} state {state} (stopped)" if state == "T" else ""


def powered_off(servers: Servers, host: str) -> str:
    disk, gone = servers.disks[host], killed(servers, host)
    if (
        not gone
        or disk.proc is not None
        or disk.cut_exit != -signal.SIGKILL
        or os.path.ismount(disk.mountpoint)
    ):
        return ""
    return f"{gone}, its disk's process too, the mount detached"


def shaped(ns: str) -> str:
    """The cap's shaper on the host's eth0 carried packets (``tc -s``: sent, overlimits)."""
    done = subprocess.run(
        ["tc", "-s", "-n", ns, "qdisc", "show", "dev", "eth0"], capture_output=True, text=True, timeout=10
    )
    words = done.stdout.split()
    if "tbf" not in words or "Sent" not in words:
        return ""
    sent = words.index("Sent")
    packets = int(words[sent + 3])
    overlimits = words[words.index("overlimits") + 1] if "overlimits" in words else "?"
    return f"tbf on {ns}: {packets} packets, {overlimits} over its rate" if packets else ""


def delayed(servers: Servers, host: str) -> dict[str, int]:
    """Chunks ``host``'s proxy has held back so far, per peer (it writes them beside its control file)."""
    counts: dict[str, int] = {}
    try:
        text = servers.proxy_stats(host).read_text()
    except OSError:
        return counts
    for line in text.splitlines():
        peer, _, count = line.partition(" ")
        if count.isdigit():
            counts[peer] = int(count)
    return counts


def slowed(servers: Servers, pair: tuple[str, ...], before: dict[str, dict[str, int]]) -> str:
    found = []
    for host, peer in ((pair[0], pair[1]), (pair[1], pair[0])):
        held = delayed(servers, host).get(peer, 0) - before[host].get(peer, 0)
        if held > 0:
            found.append(f"{host}'s proxy held {held} chunks for {peer}")
    return "; ".join(found)  # one way is enough: the link may carry traffic one way only meanwhile


def clock_seen(servers: Servers, host: str) -> str:
    """The server's clock took the step (its clock watcher writes what it applied)."""
    try:
        seen = float(Path(f"{servers.clock_file(host)}.seen").read_text().strip() or 0)
    except (OSError, ValueError):
        return ""
    return f"{host}'s wall clock {seen:+.0f}s" if seen else ""
