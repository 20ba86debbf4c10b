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


def test_a_publisher_made_from_the_package_alone_gets_its_own_plane() -> None:
    probe = (
        "import asyncio\n"
        "from meshplane import EventPublisher, PlaneConfig, Scope\n"
        "async def main():\n"
        "    config = PlaneConfig(event_plane='mem', discovery_backend='mem')\n"
        "    pub = await EventPublisher.create(Scope.namespace('n'), 't', config=config)\n"
        "    await pub.close()\n"
        "    print('made')\n"
        "asyncio.run(main())\n"
    )
    made = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert made.stdout.strip() == "made", made.stderr
