"""`complyroute experiments ...`: the control plane's command line finds the experiments' command
through the entry point pyproject.toml declares (group complyroute.commands), without importing
the experiments itself (tests/unit/test_layers.py)."""

import importlib.metadata
import tomllib

from complyroute import __main__ as cli
from complyroute.topology.manifest import REPO

DECLARED = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][cli.COMMANDS_GROUP]


def test_pyproject_declares_the_experiments_command():
    assert DECLARED == {"experiments": "experiments.__main__:main"}


def declared_only(monkeypatch):
    """The entry points as pyproject.toml declares them, whatever the installed metadata holds
    (an environment installed before they were declared has none)."""
    entries = [importlib.metadata.EntryPoint(name, value, cli.COMMANDS_GROUP) for name, value in DECLARED.items()]
    monkeypatch.setattr(cli, "added_commands", lambda: {entry.name: entry for entry in entries})


def test_the_experiments_command_runs_with_its_own_parser(monkeypatch, capsys):
    declared_only(monkeypatch)
    monkeypatch.setattr(cli, "program_name", lambda: "complyroute")
    try:
        cli.main(["experiments", "--help"])
    except SystemExit as stop:
        assert stop.code == 0
    shown = capsys.readouterr().out
    assert shown.startswith("usage: complyroute experiments [-h] [--results RESULTS]")
    assert "capacity" in shown and "compare" in shown


def test_the_control_planes_help_lists_it(monkeypatch, capsys):
    declared_only(monkeypatch)
    try:
        cli.main(["--help"])
    except SystemExit as stop:
        assert stop.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "experiments the commands of experiments: `experiments --help` lists them" in shown


def test_without_the_entry_point_there_is_no_such_command(monkeypatch, capsys):
    monkeypatch.setattr(cli, "added_commands", dict)
    try:
        cli.main(["experiments", "--help"])
    except SystemExit as stop:
        assert stop.code == 2
    assert "invalid choice: 'experiments'" in capsys.readouterr().err
