"""What importing a part of meshplane costs: a Spark worker does not load the event plane."""

from __future__ import annotations

import subprocess
import sys

import pytest

import meshplane


def test_the_spark_source_loads_no_transport() -> None:
    probe = (
        "import sys, meshplane.spark.source\n"
        "print(sorted(m for m in ('zmq', 'nats', 'meshplane.plane') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_every_public_name_resolves_and_an_unknown_one_is_an_attribute_error() -> None:
    for name in meshplane.__all__:
        assert getattr(meshplane, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'EventPlanes'"):
        _ = meshplane.EventPlanes
