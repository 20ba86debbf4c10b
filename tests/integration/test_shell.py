"""A machine whose shell start-up puts other Pythons first (pyenv's `eval "$(pyenv init -)"` in
~/.bashrc): `make shell` still gives this venv's `python` and `meshplane`, and the README's Spark
snippet runs with Spark's Python workers on the interpreter that called `register(spark)`."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from meshplane.launchers import StreamsServerProcess
from meshplane.streams.client import StreamsClient
from tests.support.cli import MESHPLANE

ROOT = Path(__file__).parents[2]
VENV_BIN = Path(sys.executable).parent
# The interpreter the venv was made from: no meshplane, no pyspark, as a pyenv shim's python
BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"


def pyenv_like_home(tmp_path: Path) -> Path:
    """A HOME whose rc files put a shims folder (python, python3: another interpreter) first on PATH."""
    home = tmp_path / "home"
    shims = home / "shims"
    shims.mkdir(parents=True)
    for name in ("python", "python3"):
        shim = shims / name
        shim.write_text(f'#!/bin/sh\nexec {BASE_PYTHON} "$@"\n')
        shim.chmod(0o755)
    prepend = f'export PATH="{shims}:$PATH"\n'
    for rc in (".bashrc", ".shrc"):
        (home / rc).write_text(prepend)
    return home


def user_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "NATS_", "ETCD_", "MESHPLANE_"))}
    env.pop("VIRTUAL_ENV", None)
    # a login shell's PATH: no venv on it (make finds .venv/bin/meshplane itself)
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != VENV_BIN and p
    )
    env["HOME"] = str(home)
    return env


@pytest.mark.parametrize("shell", ["/bin/bash", "/bin/sh"])
def test_make_shell_puts_the_venv_first_after_the_users_rc_files(tmp_path: Path, shell: str) -> None:
    """Issue 57: on a pyenv machine `make shell` gave pyenv's python: No module named 'meshplane'."""
    home = pyenv_like_home(tmp_path)
    env = {**user_env(home), "SHELL": shell, "ENV": str(home / ".shrc")}
    commands = (
        "command -v python\npython -c \"import meshplane; print('IMPORTED', meshplane.__name__)\"\nexit\n"
    )
    result = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "shell"],
        input=commands,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "IMPORTED meshplane" in result.stdout, result.stdout + result.stderr
    assert str(VENV_BIN / "python") in result.stdout
    assert os.environ.get("PATH", "").split(os.pathsep)[0] != str(home / "shims")  # ours untouched


README_SPARK = re.search(
    r"```python\n(from meshplane\.spark import register\n.*?)```", (ROOT / "README.md").read_text(), re.DOTALL
)


@pytest.mark.spark_jvm  # the snippet starts a Spark session
@pytest.mark.timeout(500)  # its waits add up to 480 s
def test_the_readme_spark_snippet_runs_on_the_context_behind_pyenv_shims(tmp_path: Path) -> None:
    """Issue 57: the README's snippet hard-coded the URL and, behind pyenv's shims, failed in Spark's
    Python worker (`python3` from PATH, without meshplane): register() did not set the worker's Python."""
    assert README_SPARK is not None, "the README's Spark snippet moved"
    token = "spark-snippet-t0ken-0123"
    home = pyenv_like_home(tmp_path)
    env = user_env(home)
    env["PATH"] = f"{home / 'shims'}{os.pathsep}{env['PATH']}"  # what ~/.bashrc did to this shell
    with StreamsServerProcess(env={"MESHPLANE_STREAMS_TOKEN": token}) as server:
        server.start()

        async def publish() -> None:
            async with StreamsClient(server.url, token=token) as client:
                await client.create_topic("demo-events", 2)
                await client.publish_batch("demo-events", [{"event_type": "e", "data": i} for i in range(7)])

        asyncio.run(publish())
        # The context another shell would have (as `up` saves it), selected; nothing in the environment.
        saved = {**env, "MESHPLANE_STREAMS_URL": server.url, "MESHPLANE_STREAMS_TOKEN": token}
        for argv in (["context", "save", "snippet"], ["context", "select", "snippet"]):
            subprocess.run([*MESHPLANE, *argv], env=saved, check=True, timeout=60, capture_output=True)
        script = tmp_path / "job.py"
        script.write_text(
            "from pyspark.sql import SparkSession\n"
            'spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")'
            ".getOrCreate()\n"
            + README_SPARK[1]
            + 'query = events.writeStream.format("memory").queryName("events")'
            ".trigger(availableNow=True).start()\n"
            "query.awaitTermination()\n"
            'print("rows", spark.sql("select count(*) from events").first()[0])\n'
            "spark.stop()\n"
        )
        try:
            result = subprocess.run(
                [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env
            )
        finally:
            subprocess.run([*MESHPLANE, "context", "rm", "snippet"], env=env, timeout=60, capture_output=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rows 7" in result.stdout, result.stdout + result.stderr[-3000:]
