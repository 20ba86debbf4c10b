"""A small application on meshplane's app API: handlers for orders and raw payloads, and its hooks."""

from __future__ import annotations

import msgspec

from meshplane import Scope
from meshplane.app import MeshApp

SCOPE = Scope.endpoint("shop", "orders", "api")


class Order(msgspec.Struct):
    id: int
    amount: float


class Receipt(msgspec.Struct):
    order_id: int
    total: float


def make_app() -> tuple[MeshApp, list[str]]:
    app = MeshApp()
    calls: list[str] = []

    @app.on_startup
    def started() -> None:
        calls.append("startup")

    @app.on_shutdown
    async def stopped() -> None:
        calls.append("shutdown")

    @app.subscriber(SCOPE, "orders")
    @app.publisher(SCOPE, "receipts")
    async def handle(order: Order) -> Receipt | None:
        if order.amount < 0:
            raise ValueError("a negative amount")
        return Receipt(order.id, total=order.amount * 2) if order.amount else None

    @app.subscriber(SCOPE, "raw")
    def raw(payload: bytes) -> None:  # plain functions work too
        calls.append(payload.decode())

    return app, calls
