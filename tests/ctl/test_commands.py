"""ferryctl's one table of commands: the parser and the dispatch are built from it alone."""

from __future__ import annotations

import argparse

import pytest

from ferry_cli.ctl.main import BY_NAME, COMMANDS, Command, build_parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_the_parser_has_the_tables_commands_in_its_order() -> None:
    assert list(_subcommands(build_parser())) == [c.name for c in COMMANDS]
    assert len(BY_NAME) == len(COMMANDS), "a name twice in the table"


def test_a_command_over_the_admin_api_takes_the_connection_options_and_one_without_does_not() -> None:
    parsers = _subcommands(build_parser())
    for command in COMMANDS:
        options = {o for a in parsers[command.name]._actions for o in a.option_strings}
        assert ("--control-plane" in options) == (command.remote is not None), command.name


@pytest.mark.parametrize("name", ["what-if", "tune"])
def test_what_if_and_tune_run_here_unless_since_asks_for_the_recording(name: str) -> None:
    parser = build_parser()
    command = BY_NAME[name]
    files = ["--traffic", "t.jsonl"] + (["--config", "c.toml"] if name == "what-if" else [])
    assert not command.needs_control_plane(parser.parse_args([name, *files]))
    since = ["--since", "1h"] + (["--config", "c.toml"] if name == "what-if" else [])
    assert command.needs_control_plane(parser.parse_args([name, *since]))
    assert BY_NAME["status"].needs_control_plane(parser.parse_args(["status"]))
    assert not BY_NAME["completion"].needs_control_plane(parser.parse_args(["completion", "bash"]))


def test_a_row_without_a_handler_is_refused() -> None:
    with pytest.raises(ValueError, match="'x': give remote, local or both"):
        Command("x", "help", lambda parser: None)
    with pytest.raises(ValueError, match="'y': remote_if chooses"):
        Command("y", "help", lambda parser: None, remote=lambda stub, args: None, remote_if=lambda args: True)
