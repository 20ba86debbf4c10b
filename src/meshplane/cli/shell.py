"""``meshplane shell`` (what ``make shell`` runs): the user's own shell, with this installation's bin
folder first on PATH *after* the shell's start-up files have run.

Prepending to PATH before starting the shell is not enough: a ``~/.bashrc`` that runs
``eval "$(pyenv init -)"`` (or conda's, or asdf's) puts its shims first again, and ``python`` is then
an interpreter without meshplane. So the shell gets start-up code of its own that runs the user's
files first and prepends the bin folder last: bash ``--rcfile``, zsh a ``ZDOTDIR`` whose ``.zshrc``
sources the real one, fish ``--init-command`` (run after its config), other shells ``$ENV``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


def add_shell_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shell",
        default=None,
        metavar="PATH",
        help="the shell to start (default $SHELL, else /bin/sh): bash, zsh, fish or a POSIX sh",
    )


def _prepend(bin_dir: Path, prefix: Path) -> str:
    return (
        f'export PATH={shlex.quote(str(bin_dir))}:"$PATH"\n'
        f"export VIRTUAL_ENV={shlex.quote(str(prefix))}\n"
        "hash -r 2>/dev/null || true\n"
    )


def shell_command(shell: str, bin_dir: Path, prefix: Path, folder: Path) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start ``shell`` interactively with ``bin_dir`` first on PATH once
    its start-up files have run; files it needs are written to ``folder``."""
    env = dict(os.environ)
    name = Path(shell).name
    last = _prepend(bin_dir, prefix)
    if name == "bash":
        rc = folder / "bashrc"
        rc.write_text(
            '[ -f /etc/bash.bashrc ] && . /etc/bash.bashrc\n[ -f "$HOME/.bashrc" ] && . "$HOME/.bashrc"\n'
            + last
            + 'PS1="(meshplane) ${PS1-}"\n'
        )
        return [shell, "--rcfile", str(rc), "-i"], env
    if name == "zsh":
        original = env.get("ZDOTDIR") or env.get("HOME", "")
        quoted = shlex.quote(original)
        (folder / ".zshenv").write_text(f"[ -f {quoted}/.zshenv ] && . {quoted}/.zshenv\n")
        (folder / ".zshrc").write_text(
            f"ZDOTDIR={quoted}\n[ -f {quoted}/.zshrc ] && . {quoted}/.zshrc\n" + last
        )
        env["ZDOTDIR"] = str(folder)
        return [shell, "-i"], env
    if name == "fish":
        command = (
            f"set -gx PATH {shlex.quote(str(bin_dir))} $PATH; set -gx VIRTUAL_ENV {shlex.quote(str(prefix))}"
        )
        return [shell, "-i", "--init-command", command], env
    rc = folder / "env.sh"  # a POSIX sh reads $ENV when interactive
    previous = env.get("ENV")
    rc.write_text(
        (f"[ -f {shlex.quote(previous)} ] && . {shlex.quote(previous)}\n" if previous else "") + last
    )
    env["ENV"] = str(rc)
    return [shell, "-i"], env


def run_shell(args: argparse.Namespace) -> int:
    shell = args.shell or os.environ.get("SHELL") or "/bin/sh"
    if shutil.which(shell) is None:
        from meshplane.cli.errors import CliError

        raise CliError(f"no shell {shell!r}: name one with --shell PATH")
    bin_dir = Path(sys.executable).parent
    print(f"meshplane is on PATH in this shell ({bin_dir} first); exit to leave it", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="meshplane-shell-") as folder:
        argv, env = shell_command(shell, bin_dir, Path(sys.prefix), Path(folder))
        # The shell owns the terminal: Ctrl-C is for what runs in it, not for us waiting on it. A handler,
        # not SIG_IGN: an ignored signal would stay ignored in the shell's children.
        previous = signal.signal(signal.SIGINT, lambda *_: None)
        try:
            return subprocess.run(argv, env=env, check=False).returncode
        finally:
            signal.signal(signal.SIGINT, previous)
