"""One run: build the namespaces, start real servers in them (each data directory on a lossy disk),
run a workload while the schedule's faults come and go, heal everything, read the final state,
check it.

The harness process itself moves into the ``client`` namespace (``setns``, before it opens a socket
or starts a thread), so it reaches the servers as a client on another machine would; ``ip -n``,
mounts and signals reach every namespace from there.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from meshplane.launchers import StreamsServerProcess
from tests.chaos.checker import Verdict, combined
from tests.chaos.evidence import prove
from tests.chaos.lossyfs import Disk
from tests.chaos.network import Network, can_build
from tests.chaos.schedule import Fault, plan, refuse_inert

CLONE_NEWNET = 0x40000000
HTTP_PORT, ROUTE_PORT = 8080, 7000
PROXY_PORT = 7100  # + the peer's index: where a host's proxy to that peer listens (on its loopback)
SLOW = (200, 200)  # the slow nemesis: milliseconds of delay, and of jitter on top, each way
SHORT_SPANS = {"gap": (0.5, 1.5), "length": (1.0, 3.0)}  # --short: seconds between faults, of each fault
CLOCK_STEP = 15.0  # the clock nemesis: seconds a host's wall clock steps ahead (and back at heal)
CLOCK_DIR = Path(__file__).parent / "clock"  # its sitecustomize steps a server's clock as the file says


def enter(ns_path: str) -> None:
    """This thread (and those it starts later) into the network namespace at ``ns_path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(ns_path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {ns_path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


class Server(Protocol):
    """A server process the harness starts, signals and stops (a launcher's ``ServerProcess``)."""

    def start(self, timeout: float = ...) -> object: ...

    def kill(self, sig: int = ...) -> None: ...

    def cleanup(self) -> None: ...


class Servers:
    """A server process on each host, in the host's namespace, its data on the host's lossy disk
    (mounted at ``mount(host)``); ``make`` builds each (``meshplane serve`` unless a workload says)."""

    def __init__(
        self,
        network: Network,
        hosts: tuple[str, ...],
        make: Callable[[Servers, str], Server],
        proxied: bool = False,
        waves: tuple[tuple[str, ...], ...] = (),
    ):
        self.network = network
        self.hosts = hosts
        self.proxied = proxied
        self.waves = waves
        # Threads that start servers live as long as the run: a server started with a parent-death
        # signal gets it when the thread that started it ends (PR_SET_PDEATHSIG is per thread).
        self.pool = ThreadPoolExecutor(max_workers=len(hosts), thread_name_prefix="boot")
        self.proxies: dict[str, subprocess.Popen[str]] = {}
        self.root = Path(tempfile.mkdtemp(prefix="meshplane-chaos-"))
        self.disks = {host: Disk(self.root / f"{host}.backing", self.mount(host)) for host in hosts}
        self.servers = {host: make(self, host) for host in hosts}
        self.active: Fault | None = None  # the fault applied now, if any
        self.schedule_began = 0.0  # when the traffic and the schedule began (monotonic)
        self.evidence: list[str] = []  # per fault applied: what showed it acting (empty: nothing)

    def mount(self, host: str) -> Path:
        return self.root / host

    def route_url(self, host: str) -> str:
        return f"tcp://{self.network.address(host)}:{ROUTE_PORT}"

    def url(self, host: str) -> str:
        return f"http://{self.network.address(host)}:{HTTP_PORT}"

    def peer_url(self, host: str, peer: str) -> str:
        """How ``host``'s server dials ``peer``'s route port: through the host's proxy to that peer,
        if the workload has proxies (for the slow nemesis)."""
        if not self.proxied:
            return self.route_url(peer)
        return f"tcp://127.0.0.1:{PROXY_PORT + self.hosts.index(peer)}"

    def clock_file(self, host: str) -> Path:
        """Seconds the host's wall clock is off (the clock nemesis; read by servers that watch it)."""
        return self.root / f"{host}.clock"

    def clock_env(self, host: str) -> dict[str, str]:
        """The environment of a (Python) server that watches its host's clock file, now 0."""
        self.clock_file(host).write_text("0")
        return {"PYTHONPATH": str(CLOCK_DIR), "MESHPLANE_CHAOS_CLOCK": str(self.clock_file(host))}

    def _control(self, host: str) -> Path:
        return self.root / f"{host}.slow"

    def proxy_stats(self, host: str) -> Path:
        """Where ``host``'s proxy counts the chunks it held back, per peer."""
        return self.root / f"{host}.slow.delayed"

    def _start_proxies(self) -> None:
        for host in self.hosts:
            self._control(host).write_text("")
            links = [
                f"{PROXY_PORT + index}={peer}={self.network.address(peer)}:{ROUTE_PORT}"
                for index, peer in enumerate(self.hosts)
                if peer != host
            ]
            command = [*self.network.exec_prefix(host), sys.executable, "-m", "tests.chaos.proxy"]
            self.proxies[host] = subprocess.Popen(
                [*command, str(self._control(host)), *links], stdout=subprocess.PIPE, text=True
            )
        for host, proxy in self.proxies.items():  # all starting at once, each waited for
            assert proxy.stdout is not None
            if proxy.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the proxy on {host} did not start (exit {proxy.poll()})")

    def _slow(self, pair: tuple[str, ...], slow: bool) -> None:
        first, second = pair
        for host, peer in ((first, second), (second, first)):
            self._control(host).write_text(f"{peer} {SLOW[0]} {SLOW[1]}\n" if slow else "")

    def start(self) -> None:
        if self.proxied:
            self._start_proxies()
        self.boot(self.hosts)

    def boot(self, hosts: Iterable[str]) -> None:
        """Mount ``hosts``' disks and start their servers, each wave's at once (machines boot in
        parallel; a wave waits for the servers the next needs at start, e.g. etcd or nats-servers)."""
        hosts = tuple(hosts)
        self.each(hosts, lambda host: self.disks[host].mount())
        for wave in self.started_in_waves(hosts):
            self.each(wave, lambda host: self.servers[host].start(timeout=30))

    def each(self, hosts: Iterable[str], action: Callable[[str], object]) -> None:
        """``action`` on every host at once (each mostly waits on a child process); the first error raised."""
        for done in [self.pool.submit(action, host) for host in hosts]:
            done.result()

    def started_in_waves(self, hosts: tuple[str, ...]) -> list[tuple[str, ...]]:
        """``hosts`` in the workload's waves, then those no wave names."""
        named = {host for wave in self.waves for host in wave}
        waves = [tuple(host for host in wave if host in hosts) for wave in self.waves]
        return [wave for wave in (*waves, tuple(host for host in hosts if host not in named)) if wave]

    def stop(self) -> None:
        if self.active is not None:
            self.heal(self.active)

        def down(host: str) -> None:
            self.servers[host].cleanup()
            self.disks[host].unmount()

        self.each(self.hosts, down)
        self.pool.shutdown()
        for proxy in self.proxies.values():
            proxy.kill()
            proxy.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    def apply(self, fault: Fault) -> None:
        net, first = self.network, fault.hosts[0]
        match fault.kind:
            case "isolate":
                net.isolate(first)
            case "cap":
                net.cap(first, "300kbit")
            case "kill":
                self.servers[first].kill(signal.SIGKILL)
            case "power" | "power-all":
                for host in fault.hosts:  # all at once: what a shared power supply does
                    self.servers[host].kill(signal.SIGKILL)
                for host in fault.hosts:
                    self.disks[host].cut()
            case "pause":
                self.servers[first].kill(signal.SIGSTOP)
            case "cut":
                net.drop(first, fault.hosts[1])
                net.drop(fault.hosts[1], first)
            case "one-way":
                net.drop(first, fault.hosts[1])
            case "slow":
                self._slow(fault.hosts, True)
            case "clock":
                Path(f"{self.clock_file(first)}.seen").unlink(missing_ok=True)  # no stale evidence
                self.clock_file(first).write_text(str(CLOCK_STEP))
        self.active = fault

    def heal(self, fault: Fault) -> None:
        net, first = self.network, fault.hosts[0]
        match fault.kind:
            case "isolate":
                net.rejoin(first)
            case "cap":
                net.uncap(first)
            case "kill":
                self.servers[first].start(timeout=30)
            case "power" | "power-all":
                self.boot(fault.hosts)
            case "pause":
                self.servers[first].kill(signal.SIGCONT)
            case "cut":
                net.undrop(first, fault.hosts[1])
                net.undrop(fault.hosts[1], first)
            case "one-way":
                net.undrop(first, fault.hosts[1])
            case "slow":
                self._slow(fault.hosts, False)
            case "clock":
                self.clock_file(first).write_text("0")  # stepped back: the wall clock goes backwards
        self.active = None


async def run_schedule(servers: Servers, faults: list[Fault], log: list[str]) -> None:
    began = servers.schedule_began = time.monotonic()
    for fault in faults:
        await asyncio.sleep(max(0.0, began + fault.start - time.monotonic()))
        log.append(f"{time.monotonic() - began:6.1f}s apply {fault.describe()}")
        await asyncio.to_thread(servers.apply, fault)
        # A fault applied late (the heal before it was slow: a JVM restarted) still lasts its length.
        heal_at = max(began + fault.start, time.monotonic()) + fault.length
        proving = asyncio.ensure_future(asyncio.to_thread(prove, servers, fault, heal_at))
        await asyncio.sleep(max(0.0, heal_at - time.monotonic()))
        servers.evidence.append(await proving)
        log.append(f"{time.monotonic() - began:6.1f}s acted: {servers.evidence[-1] or 'NO EVIDENCE'}")
        await asyncio.to_thread(servers.heal, fault)
        log.append(f"{time.monotonic() - began:6.1f}s heal  {fault.kind}")


def streams_server(
    args: Callable[[Servers, str], tuple[str, ...]],
) -> Callable[[Servers, str, str], Server]:
    """``meshplane serve`` on the host's address with ``args`` and ``--fsync``."""

    def make(servers: Servers, host: str, fsync: str) -> Server:
        return StreamsServerProcess(
            port=HTTP_PORT,
            data_dir=servers.mount(host) / "data",
            extra_args=("--host", servers.network.address(host), *args(servers, host), "--fsync", fsync),
            launcher=servers.network.exec_prefix(host),
        )

    return make


Body = Callable[[Servers, list[Fault], float, list[str]], Coroutine[Any, Any, dict[str, Verdict]]]


@dataclass(frozen=True)
class Workload:
    """Servers on ``hosts`` made by ``server`` (given the run's fsync setting), faults on ``targets``
    (default: every host); ``body`` runs the traffic for the duration (the schedule beside it,
    through ``run_schedule``), then reads the final state and checks it."""

    hosts: tuple[str, ...]
    nemeses: tuple[str, ...]
    server: Callable[[Servers, str, str], Server]
    body: Body
    targets: tuple[str, ...] = ()
    at_most_once: bool = False  # direct events: what a subscriber missed (gaps) is allowed
    proxied: bool = False  # servers dial each other through a proxy per link (``peer_url``): slow works
    waves: tuple[tuple[str, ...], ...] = ()  # hosts started (all at once) before the rest, wave by wave
    clocked: tuple[str, ...] = ()  # where the clock nemesis falls (servers watching the clock file)


@dataclass
class Report:
    workload: str
    nemeses: list[str]
    seed: int
    duration: float
    fsync: str
    faults: list[Fault]
    verdicts: dict[str, Verdict]
    log: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # seconds each part of the run took
    evidence: list[str] = field(default_factory=list)  # per fault: what showed it acting

    @property
    def unproven(self) -> list[str]:
        """The planned faults that left no evidence of acting (or were never applied)."""
        shown = [*self.evidence, *[""] * (len(self.faults) - len(self.evidence))]
        return [fault.describe() for fault, found in zip(self.faults, shown, strict=False) if not found]

    @property
    def total(self) -> Verdict:
        return combined(self.verdicts.values())

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "total": asdict(self.total), "unproven": self.unproven, "valid": self.valid}

    @property
    def valid(self) -> bool:
        checked = self.total.valid_for(at_most_once=workloads()[self.workload].at_most_once)
        return checked and not self.unproven


def workloads() -> dict[str, Workload]:
    from tests.chaos import (
        clock_workload,
        direct_workload,
        gateways_workload,
        groups_workload,
        jetstream_workload,
        mates_workload,
        mesh_workload,
        reproductions,
        spark_workload,
        topics_workload,
    )

    return {
        "mesh-guaranteed": mesh_workload.WORKLOAD,
        "mesh-gateways": gateways_workload.WORKLOAD,
        "mesh-direct": direct_workload.WORKLOAD,
        "mesh-mates": mates_workload.WORKLOAD,
        "topics-local": topics_workload.WORKLOAD,
        "topics-jetstream": jetstream_workload.WORKLOAD,
        "groups": groups_workload.WORKLOAD,
        "groups-jetstream-clock": clock_workload.WORKLOAD,
        "spark-cluster": spark_workload.WORKLOAD,
        "spark-jetstream": spark_workload.ON_JETSTREAM,
        "spark-queue": spark_workload.ON_QUEUE,
        "mates-race": reproductions.MATES_RACE,
        "mesh-resend": reproductions.MESH_RESEND,
    }


def run(
    name: str,
    seed: int,
    duration: float,
    nemeses: list[str] | None,
    fsync: str = "always",
    short: bool = False,
) -> Report:
    """Run one schedule (``nemeses`` None: every one the workload takes; ``short``: faults of 1-3 s
    with 0.5-1.5 s between, so a short run still has every nemesis); the calling process moves into
    the run's client namespace."""
    reason = can_build()
    if reason:
        raise RuntimeError(reason)
    workload = workloads()[name]
    kinds = list(workload.nemeses) if nemeses is None else nemeses
    refuse_inert(name, kinds, workload.nemeses)
    spans = SHORT_SPANS if short else {}
    hosts = workload.targets or workload.hosts
    faults = plan(seed, duration, hosts, kinds, **spans, clocked=workload.clocked) if kinds else []
    report = Report(name, kinds, seed, duration, fsync, faults, {})
    phases, mark = report.phases, time.monotonic()

    def lap(phase: str) -> float:
        """Seconds since the last lap, recorded as ``phase``'s."""
        nonlocal mark
        now = time.monotonic()
        phases[phase], mark = round(now - mark, 2), now
        return now

    network = Network([*workload.hosts, "client"]).build()
    lap("network")
    try:
        enter(f"/run/netns/{network.ns('client')}")
        servers = Servers(
            network,
            workload.hosts,
            lambda s, host: workload.server(s, host, fsync),
            workload.proxied,
            workload.waves,
        )
        try:
            servers.start()
            began = lap("start")
            report.verdicts = asyncio.run(workload.body(servers, faults, duration, report.log))
            report.evidence = servers.evidence
            # The body: getting ready (before the schedule), the duration, then reading and checking.
            ready = max(0.0, (servers.schedule_began or began) - began)
            after = lap("body") - began - ready - duration
            phases.update(ready=round(ready, 2), after=round(after, 2))
            del phases["body"]
        except BaseException:
            print_report(report)  # the schedule as far as it went
            for host, server in servers.servers.items():  # and what each server said last
                log_path = getattr(server, "log_path", None)
                if log_path is not None and log_path.exists():
                    print(f"--- {host}:\n{log_path.read_text()[-2500:]}", file=sys.stderr)
            raise
        finally:
            mark = time.monotonic()
            servers.stop()
            lap("stop")
    finally:
        network.teardown()
        lap("teardown")
    return report


def print_report(report: Report) -> None:
    what = "+".join(report.nemeses) or "no faults"
    print(f"{report.workload} under {what}, seed {report.seed}, fsync {report.fsync}:", file=sys.stderr)
    for line in report.log:
        print("  " + line, file=sys.stderr)
    for name, verdict in report.verdicts.items():
        print(f"  {name}: {verdict}", file=sys.stderr)
    for fault in report.unproven:
        print(f"  no evidence that this fault acted: {fault}", file=sys.stderr)
    if report.phases:
        print("  seconds: " + ", ".join(f"{k} {v}" for k, v in report.phases.items()), file=sys.stderr)
