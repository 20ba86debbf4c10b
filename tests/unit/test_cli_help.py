"""Every command, subcommand, option and argument of `meshplane` says what it is for."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

from meshplane.cli.main import build_parser
from tests.support.cli import run_cli


def walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield path, action


def test_every_option_and_argument_is_explained() -> None:
    missing = [
        f"{path} {'/'.join(action.option_strings) or action.dest}"
        for path, action in walk(build_parser(), "meshplane")
        if not action.help
    ]
    assert missing == []


def test_every_subcommand_is_listed_with_what_it_does() -> None:
    def subcommands(parser: argparse.ArgumentParser, path: str) -> Iterator[str]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {choice.dest for choice in action._choices_actions if choice.help}
                for name, sub in action.choices.items():
                    if name not in helped:
                        yield f"{path} {name}"
                    yield from subcommands(sub, f"{path} {name}")

    assert list(subcommands(build_parser(), "meshplane")) == []


def test_shell_completion_completes_commands(tmp_path: Path) -> None:
    script = run_cli("completion", "bash")
    assert script.returncode == 0
    assert "meshplane" in script.stdout
    assert "complete" in script.stdout
    out = tmp_path / "completions"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "COMP_LINE": "meshplane to",
        "COMP_POINT": "12",
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    run_cli(env=env, timeout=30)
    assert "topic" in out.read_text().split()


def test_every_command_ends_its_help_with_examples() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        if name in ("stream", "topic", "group"):
            continue  # their main actions carry examples, below
        assert "examples:\n  " in command.format_help(), name
    for name in (
        "stream publish",
        "stream tail",
        "topic create",
        "topic consume",
        "topic produce",
        "group consume",
    ):
        *_, action = [p for path, p in subparsers(parser) if path == f"meshplane {name}"]
        assert action.description is not None
        assert "Example: " in action.description, name


def subparsers(
    parser: argparse.ArgumentParser, path: str = "meshplane"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{path} {name}", sub
                yield from subparsers(sub, f"{path} {name}")
