"""ATTACK (reviewer's reproduction, failing on today's code): a subscriber's liveness table has no
bound. Every publisher id heard is kept in ``LivenessTracker._last_seen`` (src/meshplane/core/liveness.py)
until its goodbye or its record's removal, while the sequence tracker beside it forgets past
``PUBLISHERS_REMEMBERED``: any peer that can put frames on a topic (any ZeroMQ publisher, a broker's
XSUB) sprays events with fresh publisher ids and the subscriber's memory grows without end (and every
``check`` walks the whole table, then reports each id as a timeout)."""

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
