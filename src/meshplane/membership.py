"""What an :class:`~meshplane.plane.EventPlane` hands each publisher and subscriber it makes.

The plane is the one factory: it opens the member's transport and gives it a :class:`Membership`
(configuration, the shared discovery backend, a callback to leave). Members never reach back into
the plane; ``EventPublisher.create`` / ``EventSubscriber.create`` are shortcuts that make a private
plane and close it with the member.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self

from meshplane.config import PlaneConfig
from meshplane.core.names import Scope
from meshplane.discovery.base import Discovery

if TYPE_CHECKING:
    from meshplane.plane import EventPlane


@dataclass(frozen=True, slots=True)
class Membership:
    config: PlaneConfig
    #: The plane's discovery backend, started on first use.
    discovery: Callable[[], Awaitable[Discovery]]
    #: Called once by the member's ``close()``: the plane stops heartbeating and closing it.
    leave: Callable[[Any], None]


class _Closable(Protocol):
    async def close(self) -> None: ...


class PlaneMember:
    """Base of publishers and subscribers: one ``create`` shortcut, one way to leave the plane."""

    _private_plane: _Closable | None = None
    #: What ``create`` without a plane makes: plane.py sets it to ``EventPlane`` when it is imported
    #: (``from meshplane import EventPublisher`` imports it, through the package), so members never
    #: import it: plane.py imports this module.
    plane_factory: ClassVar[Callable[[PlaneConfig | None], EventPlane] | None] = None

    def __init__(self, membership: Membership) -> None:
        self.config = membership.config
        self._membership = membership

    @classmethod
    def _made_by(cls, plane: EventPlane) -> Callable[..., Awaitable[Self]]:
        """The plane's factory method for this kind of member."""
        raise NotImplementedError

    @classmethod
    async def create(
        cls,
        scope: Scope,
        topic: str,
        *,
        plane: EventPlane | None = None,
        config: PlaneConfig | None = None,
        **options: Any,
    ) -> Self:
        """Make one on ``plane``; without one, on a private plane (from ``config`` or the
        environment) that closes with it. ``options`` go to the plane's factory (a publisher's ``name``)."""
        if plane is not None:
            return await cls._made_by(plane)(scope, topic, **options)
        if PlaneMember.plane_factory is None:
            raise RuntimeError(
                "meshplane.plane is not imported: import EventPublisher and EventSubscriber from meshplane"
            )
        private = PlaneMember.plane_factory(config)
        try:
            member = await cls._made_by(private)(scope, topic, **options)
        except BaseException:
            await private.close()
            raise
        member._private_plane = private
        return member

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _leave_plane(self) -> None:
        self._membership.leave(self)

    async def _close_private_plane(self) -> None:
        if self._private_plane is not None:
            await self._private_plane.close()
