"""The fault harness's pure parts: the seeded schedule, the checker, the results table."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.chaos.checker import Op, Verdict, check_direct, check_log, check_queues, combined
from tests.chaos.evidence import killed, paused
from tests.chaos.groups_workload import Assigned, Commit, check_group
from tests.chaos.harness import SHORT_SPANS, Report, workloads
from tests.chaos.proxy import Proxy, due, parse_control
from tests.chaos.schedule import EVERY, NEMESES, PAIRED, Fault, plan
from tests.chaos.table import BEGIN, END, markdown, replace_table
from tests.chaos.test_chaos import SHORT_RUNS
from tests.helpers import eventually, wait_until

HOSTS = ("a", "b", "c")


@given(st.integers(0, 2**32), st.floats(5, 300), st.lists(st.sampled_from(NEMESES), min_size=1, unique=True))
def test_a_schedule_is_replayed_from_its_seed_one_fault_at_a_time_within_the_duration(
    seed: int, duration: float, kinds: list[str]
) -> None:
    faults = plan(seed, duration, HOSTS, kinds)
    assert faults == plan(seed, duration, HOSTS, kinds)
    end = 0.0
    for fault in faults:
        assert fault.kind in kinds
        assert fault.start >= end  # the previous one was healed first
        end = fault.start + fault.length
        expected = len(HOSTS) if fault.kind in EVERY else 2 if fault.kind in PAIRED else 1
        assert len(set(fault.hosts)) == len(fault.hosts) == expected
        assert set(fault.hosts) <= set(HOSTS)
    assert end <= duration


@given(st.integers(0, 2**32))
def test_every_nemesis_comes_once_a_round(seed: int) -> None:
    faults = plan(seed, 600, HOSTS)
    for start in range(0, len(faults) - len(NEMESES) + 1, len(NEMESES)):
        assert sorted(f.kind for f in faults[start : start + len(NEMESES)]) == sorted(NEMESES)
    assert plan(seed + 1, 600, HOSTS) != faults


def test_unknown_nemeses_and_pairs_without_two_hosts_are_refused() -> None:
    with pytest.raises(ValueError, match="some of"):
        plan(1, 60, HOSTS, ["meteor"])
    with pytest.raises(ValueError, match="two hosts"):
        plan(1, 60, ("a",), ["cut"])


def test_a_nemesis_that_cannot_act_on_a_workload_is_refused_not_applied() -> None:
    """Issue 53: `topics-local --nemesis clock` applied faults to servers that never read the clock
    file, and mesh-mates took `slow` without proxies. The scheduler refuses both, before any run."""
    from tests.chaos.__main__ import main
    from tests.chaos.harness import workloads
    from tests.chaos.schedule import refuse_inert

    known = workloads()
    for workload, kind in (("topics-local", "clock"), ("mesh-mates", "slow"), ("groups", "slow")):
        with pytest.raises(ValueError, match=f"{kind} cannot act on workload {workload}"):
            refuse_inert(workload, [kind], known[workload].nemeses)
    refuse_inert("mesh-guaranteed", ["slow", "kill"], known["mesh-guaranteed"].nemeses)
    refuse_inert("groups-jetstream-clock", ["clock"], known["groups-jetstream-clock"].nemeses)
    with pytest.raises(SystemExit):  # the command line says so before it starts anything
        main(["--workload", "mesh-mates", "--nemesis", "kill,slow"])


def ops(publisher: str, outcomes: str) -> list[Op]:
    """``"ok?o"``: seq 0 acknowledged, seq 1 unknown, seq 2 acknowledged."""
    return [Op(publisher, seq, "ok" if c == "o" else "unknown") for seq, c in enumerate(outcomes)]


def test_a_clean_history_is_valid() -> None:
    history = ops("p1", "ooo") + ops("p2", "oo")
    held = [("p1", 0), ("p2", 0), ("p1", 1), ("p2", 1), ("p1", 2)]
    (verdict,) = check_queues(history, {"q": held}, lambda q, p: True).values()
    assert verdict == Verdict(operations=5, acknowledged=5)
    assert verdict.valid


def test_lost_duplicated_reordered_and_unexpected_are_each_counted() -> None:
    history = ops("p1", "oooo")
    lost = check_queues(history, {"q": [("p1", 0), ("p1", 2), ("p1", 3)]}, lambda q, p: True)["q"]
    assert (lost.lost, lost.valid) == (1, False)
    doubled = check_queues(
        history, {"q": [("p1", 0), ("p1", 1), ("p1", 1), ("p1", 2), ("p1", 3)]}, lambda q, p: True
    )
    assert (doubled["q"].duplicated, doubled["q"].lost) == (1, 0)
    swapped = check_queues(history, {"q": [("p1", 0), ("p1", 2), ("p1", 1), ("p1", 3)]}, lambda q, p: True)
    assert (swapped["q"].reordered, swapped["q"].lost) == (1, 0)
    phantom = check_queues(
        history, {"q": [("p1", 0), ("p1", 1), ("p1", 2), ("p1", 3), ("p9", 0)]}, lambda q, p: True
    )
    assert phantom["q"].unexpected == 1
    unwanted = check_queues(history, {"q": [("p1", 0)]}, lambda q, p: False)["q"]
    assert (unwanted.unexpected, unwanted.operations, unwanted.lost) == (1, 0, 0)


def test_an_unknown_outcome_may_arrive_or_not_and_its_order_is_not_checked() -> None:
    history = ops("p1", "o?o?")
    arrived_late = check_queues(history, {"q": [("p1", 0), ("p1", 2), ("p1", 1)]}, lambda q, p: True)["q"]
    assert arrived_late == Verdict(operations=4, acknowledged=2, indeterminate=2, indeterminate_arrived=1)


def test_queues_combine_counting_publishes_once_and_faults_per_queue() -> None:
    one = Verdict(operations=10, acknowledged=9, lost=1, indeterminate=1)
    other = Verdict(operations=10, acknowledged=9, duplicated=2, indeterminate=1, indeterminate_arrived=1)
    assert combined([one, other]) == Verdict(10, 9, 1, 2, 0, 0, 1, 1)


def test_the_table_goes_between_the_markers_and_nothing_else_changes() -> None:
    total = {"operations": 3, "acknowledged": 2, "lost": 0, "duplicated": 0, "reordered": 0, "unexpected": 0,
             "indeterminate": 1, "indeterminate_arrived": 1}  # fmt: skip
    report = {
        "workload": "w",
        "nemeses": ["kill"],
        "fsync": "interval",
        "seed": 7,
        "faults": [{}],
        "total": total,
    }
    table = markdown([report])
    assert "| w | kill | interval | 7 | 1 | 3 | 2 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 1 (1) |" in table
    assert "| lost | unreadable | duplicated |" in table
    document = f"before\n{BEGIN}\nold\n{END}\nafter\n"
    assert replace_table(document, table) == f"before\n{BEGIN}\n{table}{END}\nafter\n"


def test_a_store_that_cannot_be_read_is_unreadable_not_lost() -> None:
    """Issue 53: topics-jetstream counted "unreadable within 90 s" (a 503) as lost."""
    from tests.chaos.checker import unreadable

    verdict = unreadable(ops("p1", "oo?o"))
    assert verdict == Verdict(operations=4, acknowledged=3, indeterminate=1, unreadable=3)
    assert verdict.lost == 0
    assert not verdict.valid  # not served is still wrong: a column of its own


def placed(publisher: str, offsets: list[int | None]) -> list[Op]:
    """Appends of one producer: an offset is an acknowledged one, None an unknown outcome."""
    return [Op(publisher, seq, "unknown" if o is None else "ok", o) for seq, o in enumerate(offsets)]


def test_a_log_written_by_idempotent_producers_is_checked_for_place_order_gaps_and_doubles() -> None:
    history = placed("p1", [0, 2, None]) + placed("p2", [1])
    clean = check_log(history, [(0, "p1", 0), (1, "p2", 0), (2, "p1", 1), (3, "p1", 2)])
    assert clean == Verdict(operations=4, acknowledged=3, indeterminate=1, indeterminate_arrived=1)
    assert clean.valid
    doubled = check_log(history, [(0, "p1", 0), (1, "p2", 0), (2, "p1", 1), (3, "p1", 1)])
    assert (doubled.duplicated, doubled.lost, doubled.moved) == (1, 0, 0)
    moved = check_log(history, [(0, "p2", 0), (1, "p1", 0), (2, "p1", 1)])
    assert (moved.moved, moved.lost) == (2, 0)
    # Power lost with offsets 2.. unsynced: p1's seq 1 gone and its offset given to the next append.
    reused = check_log(placed("p1", [0, 1, 1]), [(0, "p1", 0), (1, "p1", 2)])
    assert (reused.lost, reused.reordered, reused.moved) == (1, 0, 0)
    gap = check_log(placed("p1", [0, 2]), [(0, "p1", 0), (2, "p1", 1)])
    assert (gap.gaps, gap.valid) == (1, False)
    phantom = check_log(placed("p1", [0]), [(0, "p1", 0), (1, "p9", 0)])
    assert phantom.unexpected == 1


def test_a_group_is_checked_for_split_owners_fencing_commit_order_and_lost_commits() -> None:
    assigned = [Assigned("m1", 1, (0, 1)), Assigned("m1", 2, (0,)), Assigned("m2", 2, (1,))]
    commits = [Commit("m1", 1, 0, 1, "ok"), Commit("m1", 1, 1, 1, "ok"), Commit("m2", 2, 1, 2, "ok")]
    commits += [Commit("m1", 1, 1, 2, "refused"), Commit("m1", 2, 0, 2, "unknown")]
    clean = check_group(assigned, commits, {0: 1, 1: 2})
    assert clean == Verdict(operations=5, acknowledged=3, indeterminate=1)
    assert clean.valid
    split = check_group([*assigned, Assigned("m3", 2, (0,))], commits, {0: 1, 1: 2})
    assert split.unexpected == 1  # partition 0 had two owners in generation 2
    stale = check_group(assigned, [*commits, Commit("m1", 1, 1, 3, "ok")], {0: 1, 1: 3})
    assert stale.unexpected == 1  # accepted from m1, which no longer owned partition 1
    back = check_group(assigned, [*commits, Commit("m2", 2, 1, 2, "ok")], {0: 1, 1: 2})
    assert back.reordered == 1  # the same offset accepted twice: the first was lost meanwhile
    assert check_group(assigned, commits, {0: 1, 1: 1}).lost == 1  # partition 1 went back at the end
    # m1's commit sent before m2's was answered, answered after it (its server paused in between): it
    # may have been stored first, so neither order nor fencing is broken; sent after it, both are
    late = Commit("m1", 1, 1, 1, "ok", sent=1)
    overlapped = [commits[0], Commit("m2", 2, 1, 2, "ok"), late]
    assert check_group(assigned, overlapped, {0: 1, 1: 2}).valid
    stale_late = check_group(assigned, [*overlapped[:2], Commit("m1", 1, 1, 1, "ok", sent=2)], {0: 1, 1: 2})
    assert (stale_late.reordered, stale_late.unexpected) == (1, 1)
    # Unknown commits (issue 53): one the final offset shows was stored is fenced and ordered too.
    assert check_group(assigned, commits, {0: 2, 1: 2}).valid  # m1's unknown commit of 2 was stored
    stale_unknown = [*commits, Commit("m1", 1, 1, 5, "unknown")]  # m2 had partition 1 by then
    assert check_group(assigned, stale_unknown, {0: 1, 1: 5}).unexpected == 1
    assert check_group(assigned, stale_unknown, {0: 1, 1: 2}).valid  # not stored: nothing wrong
    assert check_group(assigned, commits, {0: 1, 1: 9}).unexpected == 1  # an offset nobody committed


def test_direct_events_count_what_missed_as_gaps_and_doubles_order_and_strangers_as_wrong() -> None:
    published = {"p1": 4, "p2": 2}
    received = {
        "clean": [("p1", 0), ("p2", 0), ("p1", 1), ("p1", 2), ("p2", 1), ("p1", 3)],
        "lossy": [("p1", 0), ("p1", 3), ("p2", 1)],  # at most once: gaps only
        "wrong": [("p1", 1), ("p1", 0), ("p1", 1), ("p3", 0), ("p2", 2)],
    }
    verdicts = check_direct(published, received)
    assert verdicts["clean"] == Verdict(operations=6)
    assert verdicts["lossy"] == Verdict(operations=6, gaps=3)
    assert verdicts["lossy"].valid is False  # gaps make a verdict invalid: the caller allows them
    assert verdicts["wrong"] == Verdict(operations=6, duplicated=1, reordered=1, unexpected=2, gaps=4)


@given(st.lists(st.integers(0, 30), max_size=60))
def test_a_subsequence_in_order_is_never_wrong(seqs: list[int]) -> None:
    arrived = sorted(set(seqs))
    (verdict,) = check_direct({"p": 31}, {"s": [("p", seq) for seq in arrived]}).values()
    assert (verdict.duplicated, verdict.reordered, verdict.unexpected) == (0, 0, 0)
    assert verdict.gaps == 31 - len(arrived)


@given(
    st.lists(st.floats(0, 100), min_size=1, max_size=30),
    st.floats(0, 1),
    st.floats(0, 1),
    st.floats(0, 1),
)
def test_a_slowed_chunk_is_due_after_its_delay_and_never_before_the_one_ahead(
    reads: list[float], delay: float, jitter: float, fraction: float
) -> None:
    previous = 0.0
    for now in sorted(reads):
        when = due(now, previous, (delay, jitter), lambda low, high: low + (high - low) * fraction)
        assert when >= previous
        assert now + delay <= when <= max(previous, now + delay + jitter)
        previous = when


def test_the_control_file_names_slowed_peers_and_torn_lines_are_skipped() -> None:
    assert parse_control("b 200 50\nc 10\nd x 1\ne -5 0\n") == {"b": (0.2, 0.05), "e": (0.0, 0.0)}
    assert parse_control("") == {}


async def test_the_proxy_delays_each_way_and_passes_a_half_close_on(tmp_path: Path) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read())  # everything, up to the client's half-close
        writer.close()

    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    upstream_port = upstream.sockets[0].getsockname()[1]
    control = tmp_path / "slow"
    control.write_text("peer 150 0\n")
    proxy = Proxy(control)
    watching = asyncio.create_task(proxy.watch())
    listening = await proxy.serve(0, "peer", "127.0.0.1", upstream_port)
    port = listening.sockets[0].getsockname()[1]
    try:
        await eventually(lambda: proxy.slow == {"peer": (0.15, 0.0)}, what="the control file read")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        writer.write(b"ping")
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5) == b"ping"
        assert time.monotonic() - started >= 0.3  # 150 ms there, 150 ms back
        writer.close()
        # what the harness takes as evidence that the slow nemesis acted: the chunks held, per peer
        stats = tmp_path / "slow.delayed"
        await eventually(lambda: stats.exists() and stats.read_text() == "peer 2\n", what="the count written")
    finally:
        watching.cancel()
        listening.close()
        upstream.close()


def test_a_fault_that_left_no_evidence_makes_the_run_invalid() -> None:
    faults = [
        Fault(1.0, 2.0, "kill", ("a",)),
        Fault(4.0, 1.5, "pause", ("b",)),
        Fault(7.0, 1.0, "cap", ("c",)),
    ]
    report = Report("mesh-guaranteed", ["kill", "pause", "cap"], 1, 10.0, "always", faults, {"qa": Verdict()})
    report.evidence = ["a: pid 7 gone (SIGKILL)", ""]  # the pause showed nothing, the cap never came
    assert report.unproven == [faults[1].describe(), faults[2].describe()]
    assert not report.valid
    assert report.to_json()["unproven"] == report.unproven
    report.evidence += ["shown", "shown"]
    report.evidence[1] = "b: pid 8 state T (stopped)"
    assert report.unproven == []
    assert report.valid


def test_a_killed_or_paused_server_is_seen_so_in_the_process_table(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "60"])
    servers: Any = SimpleNamespace(servers={"a": SimpleNamespace(proc=proc)})
    try:
        assert killed(servers, "a") == ""
        assert paused(servers, "a") == ""
        proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: paused(servers, "a") != "", timeout=10, what="state T")
        assert "state T" in paused(servers, "a")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert f"pid {proc.pid} gone" in killed(servers, "a")
        proc = subprocess.Popen(["sleep", "60"])  # ended otherwise: not a kill
        servers.servers["a"].proc = proc
        proc.terminate()
        proc.wait(10)
        assert killed(servers, "a") == ""
    finally:
        proc.kill()
        proc.wait(10)


def test_every_short_run_fits_each_of_its_nemeses_whatever_the_seed() -> None:
    """The suite's short runs assert that every nemesis came: the longest gaps and faults must still
    leave room for one of each (a schedule stops at the first fault that would overrun)."""
    longest_gap, longest_fault = SHORT_SPANS["gap"][1], SHORT_SPANS["length"][1]
    for name, duration, _ in SHORT_RUNS:
        kinds = len(workloads()[name].nemeses)
        worst = longest_gap + kinds * longest_fault + (kinds - 1) * longest_gap
        assert worst <= duration, f"{name}: {kinds} nemeses may need {worst} s, the run has {duration} s"


def test_the_clock_nemesis_falls_only_where_a_server_watches_the_clock_file() -> None:
    """Issue 53: mesh-mates takes the clock nemesis on its mates (Python, watching the clock file),
    never on etcd (Go: the file cannot reach it, and the fault would leave no evidence)."""
    mates = workloads()["mesh-mates"]
    assert "clock" in mates.nemeses
    assert mates.clocked == ("a1", "a2")
    faults = [
        f
        for seed in range(20)
        for f in plan(seed, 120, mates.targets, ["clock", "kill"], clocked=mates.clocked)
    ]
    assert {f.hosts for f in faults if f.kind == "clock"} == {("a1",), ("a2",)}
    assert ("etcd",) in {f.hosts for f in faults if f.kind == "kill"}
