"""Handlers as in FastStream: decorated functions, payloads decoded by type hint, return values published.

Run it next to `make run` (it uses the selected context), or test it without servers: `app.test()`.
"""

import asyncio

import msgspec

from meshplane import Scope
from meshplane.app import MeshApp

app = MeshApp()
scope = Scope.endpoint("shop", "orders", "api")


class Order(msgspec.Struct):
    id: int
    amount: float


class Receipt(msgspec.Struct):
    order_id: int
    total: float


@app.subscriber(scope, "orders")
@app.publisher(scope, "receipts")  # the return value is published here
async def handle(order: Order) -> Receipt:
    return Receipt(order.id, total=round(order.amount * 1.2, 2))


async def main() -> None:
    async with app.test() as test:  # the in-process plane: no server needed
        receipts = await test.subscriber(scope, "receipts")
        await test.publish(scope, "orders", Order(1, 10.0))
        print((await receipts.next(timeout=5)).decode(Receipt))
    # In production: `asyncio.run(app.run())` serves until Ctrl-C on NATS (or ZeroMQ).


asyncio.run(main())
