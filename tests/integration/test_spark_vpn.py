"""The Spark source and sink in a Message VPN (issue 58): the ``vpn`` option sends ``X-Meshplane-Vpn``
on every request, so the server's operator reads and writes a VPN's topics; a VPN's own token needs
none, and naming another VPN with it is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from meshplane.launchers import StreamsServerProcess
from meshplane.streams.client import StreamsClient
from tests.spark_support import collect_available_now, reader, run

pytestmark = pytest.mark.spark_jvm

A = "spark-team-a-token-00001"
OPERATOR = "spark-operator-token-002"


@pytest.fixture(scope="module")
def vpn_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamsServerProcess]:
    root = tmp_path_factory.mktemp("spark-vpn")
    (root / "vpns.toml").write_text("[vpns.team-a]\n")
    (root / "tokens.toml").write_text(
        f'[tokens.a]\ntoken = "{A}"\nvpn = "team-a"\n[tokens.operator]\ntoken = "{OPERATOR}"\n'
    )
    files = ("--mesh-vpns", str(root / "vpns.toml"), "--token-file", str(root / "tokens.toml"))
    with StreamsServerProcess(extra_args=files) as proc:
        yield proc.start()
        proc.stop()
        assert "Traceback" not in proc.log_path.read_text()


async def _topics(url: str, token: str) -> list[str]:
    async with StreamsClient(url, token=token) as client:
        return await client.topics()


@pytest.mark.timeout(330)  # a Spark session started, a write, two reads and a query (loaded machine: minutes)
def test_the_operators_source_and_sink_work_in_the_vpn_it_names(
    spark: SparkSession, vpn_server: StreamsServerProcess, tmp_path: Path
) -> None:
    url = vpn_server.url
    frame = spark.createDataFrame([("k1", "one"), ("k2", "two")], "key string, value string")
    writer = frame.write.format("meshplane").option("url", url).option("token", OPERATOR)
    writer.option("vpn", "team-a").option("topic", "sparked").mode("append").save()
    assert "sparked" in run(_topics(url, A))  # team-a's topic ...
    assert "sparked" not in run(_topics(url, OPERATOR))  # ... not the default VPN's

    def values(**options: Any) -> list[bytes]:
        read = spark.read.format("meshplane").option("url", url).option("topic", "sparked")
        for name, value in options.items():
            read = read.option(name, value)
        return sorted(bytes(row["value"]) for row in read.load().collect())

    assert values(token=OPERATOR, vpn="team-a") == [b"one", b"two"]
    assert values(token=A) == [b"one", b"two"]  # its own VPN's, with no option
    streamed = reader(spark, url, "sparked", token=OPERATOR, vpn="team-a", startingOffsets="earliest")
    rows, _ = collect_available_now(streamed, tmp_path / "ckpt")
    assert sorted(bytes(row["value"]) for row in rows) == [b"one", b"two"]
    with pytest.raises(Exception, match="works in its VPN only"):
        values(token=A, vpn="default")
