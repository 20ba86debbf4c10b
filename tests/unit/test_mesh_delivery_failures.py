"""A subscriber whose delivery fails loses that event alone: the publisher, the link it came over and
every other subscriber are served as ever, and the node counts and says it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from meshplane.mesh.config import MeshConfig
from meshplane.mesh.holders import MeshEvent
from meshplane.mesh.links import Link
from meshplane.mesh.node import MeshNode


@dataclass(eq=False)
class Recorder:
    got: list[str] = field(default_factory=list)

    def deliver(self, event: MeshEvent) -> None:
        self.got.append(event.subject)


@dataclass(eq=False)
class Broken:
    def deliver(self, event: MeshEvent) -> None:
        raise RuntimeError("a subscriber's bug")


@pytest.fixture
def node() -> MeshNode:
    node = MeshNode(MeshConfig(node_id="a", cluster="c1"))
    node.direct.enabled = False  # the Python path is the one under test
    return node


def test_a_failing_subscriber_costs_the_others_nothing_on_a_local_publish(
    node: MeshNode, caplog: pytest.LogCaptureFixture
) -> None:
    before, after = Recorder(), Recorder()
    for holder in (before, Broken(), after):
        node.subscribe(holder, "orders.>")
    with caplog.at_level(logging.ERROR):
        assert node.publish("orders.eu", b"x") == 3
        assert node.publish("orders.us", b"y") == 3
    assert before.got == after.got == ["orders.eu", "orders.us"]
    assert node.counters["delivery_failures"] == 2
    assert "a subscriber's bug" in caplog.text


def test_a_failing_subscriber_costs_the_others_nothing_on_a_peers_event(node: MeshNode) -> None:
    before, after = Recorder(), Recorder()
    for holder in (before, Broken(), after):
        node.subscribe(holder, "orders.>")
    link = Link("b")
    node.routes.deliver_remote(link, MeshEvent("b", "orders.eu", 1, 1, b"x"), now=1.0)
    assert before.got == after.got == ["orders.eu"]
    assert node.counters["delivery_failures"] == 1


def test_a_subscriber_that_fails_at_every_event_does_not_flood_the_log(
    node: MeshNode, caplog: pytest.LogCaptureFixture
) -> None:
    """Each failure was an error line of its own: a publisher's 10,000 events, 10,000 lines."""
    node.subscribe(Broken(), "orders.>")
    with caplog.at_level(logging.ERROR):
        for _ in range(10_000):
            node.publish("orders.eu", b"x")
    assert node.counters["delivery_failures"] == 10_000
    assert 1 <= len(caplog.records) <= 5
