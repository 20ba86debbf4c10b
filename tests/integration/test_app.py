"""The application API over a real nats-server: the same handlers as on the test plane."""

from __future__ import annotations

from pathlib import Path

from meshplane import EventPlane
from meshplane.launchers import NatsServer
from tests.conftest import make_config
from tests.support.app import SCOPE, Order, Receipt, make_app


async def test_the_app_over_nats(nats_server: NatsServer, tmp_path: Path) -> None:
    config = make_config("nats", "file", tmp_path, nats_server, None)
    app, calls = make_app()
    async with app.running(config), EventPlane(config) as client:
        receipts = await client.subscriber(SCOPE, "receipts")
        orders = await client.publisher(SCOPE, "orders")
        await orders.wait_for_subscribers(1, timeout=10)
        await orders.publish(Order(7, 2.5))
        assert (await receipts.next(10)).decode(Receipt) == Receipt(7, 5.0)
    assert calls == ["startup", "shutdown"]
