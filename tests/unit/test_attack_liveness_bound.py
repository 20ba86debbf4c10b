"""A reviewer's attack: any peer that can put frames on a topic sprayed made-up publisher ids, and a
subscriber's liveness table grew past every other bound (the sequence tracker stops at
PUBLISHERS_REMEMBERED); each check then walked it all. Now it is bounded alike, oldest forgotten."""

from __future__ import annotations

from meshplane.core.envelope import EventEnvelope
from meshplane.core.intake import Intake
from meshplane.core.sequence import PUBLISHERS_REMEMBERED


def test_a_spray_of_publisher_ids_is_remembered_within_a_bound() -> None:
    intake = Intake("t", [b"t"], liveness_timeout=3.0, reorder_window=0.0)
    sprayed = PUBLISHERS_REMEMBERED + 50_000
    batch = [EventEnvelope(publisher_id, 0, 0, "t", b"\xc0") for publisher_id in range(1, sprayed + 1)]
    for start in range(0, sprayed, 10_000):
        intake.accept(batch[start : start + 10_000], now=1.0)
    assert intake.liveness is not None
    assert intake.liveness.tracked <= PUBLISHERS_REMEMBERED, intake.liveness.tracked
    assert intake.liveness.forgotten == sprayed - PUBLISHERS_REMEMBERED
