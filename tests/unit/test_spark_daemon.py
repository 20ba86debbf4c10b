"""The worker daemon `spark_session()` names: a worker whose JVM hung up ends without a traceback."""

from __future__ import annotations

from typing import Any

import pytest

from meshplane.spark import daemon


def _raising(exc: BaseException) -> Any:
    def worker(sock: Any, authenticated: bool) -> int:
        raise exc

    return worker


@pytest.mark.parametrize("broken", [BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")])
def test_a_broken_connection_to_the_jvm_ends_the_worker_quietly(
    monkeypatch: pytest.MonkeyPatch, broken: OSError
) -> None:
    monkeypatch.setattr(daemon, "_worker", _raising(broken))
    assert daemon.quiet_worker(None, True) == 1  # nonzero: the daemon's loop ends this worker


def test_other_errors_and_codes_are_pysparks_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon, "_worker", _raising(ValueError("a bug")))
    with pytest.raises(ValueError, match="a bug"):
        daemon.quiet_worker(None, True)
    monkeypatch.setattr(daemon, "_worker", lambda sock, authenticated: 0)
    assert daemon.quiet_worker(None, True) == 0
