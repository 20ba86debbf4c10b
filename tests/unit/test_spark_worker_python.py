"""Spark's Python processes import the installed PySpark, not the zips Spark puts first on their path."""

from __future__ import annotations

import os
from pathlib import Path

from meshplane.spark.worker_python import with_quiet_daemon, without_bundled_zips


def _pip_installed_pyspark(site: Path) -> tuple[str, str]:
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "py4j").mkdir()
    for package in ("pyspark", "py4j"):
        (site / package / "__init__.py").write_text("")
    return str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")


def test_the_zips_of_the_installed_pyspark_are_left_out_and_the_rest_kept_in_order(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    pyspark_zip, py4j_zip = _pip_installed_pyspark(site)
    path = os.pathsep.join([pyspark_zip, py4j_zip, "/opt/app", "/opt/deps.zip"])
    assert without_bundled_zips(path, ["/usr/lib/python3.11", str(site)]) == os.pathsep.join(
        ["/opt/app", "/opt/deps.zip"]
    )


def test_zips_of_a_pyspark_this_interpreter_cannot_import_are_kept(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    pyspark_zip, py4j_zip = _pip_installed_pyspark(site)
    path = os.pathsep.join([pyspark_zip, py4j_zip])
    assert without_bundled_zips(path, ["/usr/lib/python3.11"]) == path  # another installation's
    (site / "py4j" / "__init__.py").unlink()  # py4j only in its zip
    assert without_bundled_zips(path, [str(site)]) == py4j_zip


def test_a_spark_home_that_is_no_pip_install_is_kept(tmp_path: Path) -> None:
    lib = tmp_path / "spark-4.0.0" / "python" / "lib"
    lib.mkdir(parents=True)
    path = os.pathsep.join([str(lib / "pyspark.zip"), ""])
    assert without_bundled_zips(path, [str(tmp_path)]) == path


def test_pyspark_s_own_daemon_is_started_as_meshplane_s_quiet_one() -> None:
    lookup = ["-m", "pyspark.daemon", "pyspark.sql.worker.lookup_data_sources"]
    assert with_quiet_daemon(lookup) == [
        "-m",
        "meshplane.spark.daemon",
        "pyspark.sql.worker.lookup_data_sources",
    ]
    for kept in (
        ["-m", "pyspark.worker"],
        ["-m", "meshplane.spark.daemon", "pyspark.worker"],
        ["-c", "pass"],
        [],
    ):
        assert with_quiet_daemon(kept) == kept
