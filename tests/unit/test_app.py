"""The application API over the in-process plane: decoding by type hint, outputs, hooks, failures."""

from __future__ import annotations

import pytest

from meshplane.app import MeshApp
from meshplane.core.envelope import EventEnvelope
from meshplane.errors import MeshplaneError
from tests.helpers import eventually
from tests.support.app import SCOPE, Order, Receipt, make_app


async def test_handlers_decode_by_type_publish_results_and_survive_failures() -> None:
    app, calls = make_app()
    async with app.test() as test:
        assert calls == ["startup"]
        receipts = await test.subscriber(SCOPE, "receipts")
        await test.publish(SCOPE, "orders", Order(1, 10.0))
        assert (await receipts.next(5)).decode(Receipt) == Receipt(1, 20.0)
        await test.publish(SCOPE, "orders", {"id": "not a number"})  # does not fit Order: dropped
        await test.publish(SCOPE, "orders", Order(2, -1.0))  # the handler raises: counted, served on
        await test.publish(SCOPE, "orders", Order(3, 0.0))  # None: nothing published
        await test.publish(SCOPE, "orders", Order(4, 1.5))
        assert (await receipts.next(5)).decode(Receipt) == Receipt(4, 3.0)
        await test.publish(SCOPE, "raw", b"as it is")
        await eventually(lambda: "as it is" in calls, what="the raw handler")
        assert (app.stats["undecodable"], app.stats["failed"], app.stats["published"]) == (1, 1, 2)
        assert app.stats["handled"] == 4
    assert calls[-1] == "shutdown"


async def test_the_whole_envelope_when_asked_for() -> None:
    app = MeshApp()
    seen: list[EventEnvelope] = []

    @app.subscriber(SCOPE, "audit")
    def audit(envelope: EventEnvelope) -> None:
        seen.append(envelope)

    async with app.test() as test:
        await test.publish(SCOPE, "audit", {"who": "me"})
        await eventually(lambda: bool(seen), what="the envelope")
    assert (seen[0].topic, seen[0].sequence, seen[0].decode()) == ("audit", 0, {"who": "me"})


def test_a_handler_without_a_parameter_is_refused_at_once() -> None:
    app = MeshApp()
    with pytest.raises(MeshplaneError, match="takes no parameter"):

        @app.subscriber(SCOPE, "nothing")
        def nothing() -> None: ...
