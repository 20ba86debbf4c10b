"""The streams error family: every kind has one HTTP status, and clients map answers back to it."""

from __future__ import annotations

import pytest

import meshplane.core.groups  # noqa: F401 - defines the group kinds
import meshplane.streams.errors as errors
from meshplane.errors import MeshplaneError, StreamError


def every_kind(base: type[StreamError] = StreamError) -> set[type[StreamError]]:
    found = {base}
    for sub in base.__subclasses__():
        found |= every_kind(sub)
    return found


def test_every_kind_has_one_status() -> None:
    kinds = {cls.kind for cls in every_kind()}
    assert kinds == set(errors.HTTP_STATUS)  # no kind without a status, no status for no kind
    assert all(400 <= status < 600 for status in errors.HTTP_STATUS.values())
    assert all(issubclass(cls, MeshplaneError) and not hasattr(cls, "status") for cls in every_kind())


@pytest.mark.parametrize(
    "cls", sorted(every_kind() - {errors.CorruptRecords, errors.OffsetOutOfRange}, key=str)
)
def test_an_answer_maps_back_to_its_kind(cls: type[StreamError]) -> None:
    sent = cls("x")
    received = errors.error_from_response(errors.http_status(sent), {"error": "x", "type": sent.kind})
    assert received.kind == sent.kind


def test_errors_with_details_round_trip() -> None:
    corrupt = errors.CorruptRecords(5, 4, 9)
    body = {"type": corrupt.kind, **corrupt.details()}
    back = errors.error_from_response(410, body)
    assert isinstance(back, errors.CorruptRecords)
    assert (back.requested, back.first, back.next_offset) == (5, 4, 9)
    gone = errors.OffsetOutOfRange(1, 10, 20)
    again = errors.error_from_response(400, {"type": gone.kind, **gone.details()})
    assert isinstance(again, errors.OffsetOutOfRange)
    assert again.details() == gone.details()


def test_an_answer_without_a_kind_maps_by_status() -> None:
    assert isinstance(errors.error_from_response(404, {"error": "gone"}), errors.NotFound)
    assert isinstance(errors.error_from_response(401, {}), errors.Unauthorized)  # an AuthError too
    assert type(errors.error_from_response(418, {})) is StreamError


def test_group_kinds_are_also_the_generic_kinds_they_are() -> None:
    from meshplane.core.groups import GroupNotEmpty, UnknownMember

    back = errors.error_from_response(409, {"error": "live members", "type": GroupNotEmpty.kind})
    assert isinstance(back, GroupNotEmpty)
    assert isinstance(back, errors.Conflict)  # what a client catches
    assert isinstance(UnknownMember("m"), errors.NotFound)
