"""`complyroute --version`: its own version, the checkout's revision and the tools' versions."""

import pytest

from complyroute.__main__ import main


def test_version_names_the_revision_and_the_tools_allowed(capsys):
    assert main(["--version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("complyroute 0.1.0 (") and [line.split(":")[0] for line in lines[1:]] == ["opa", "envoy", "node"]
    assert not any("not available" in line for line in lines), lines


def test_a_misspelt_flag_is_refused_denied(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["--versio"])
    assert refused.value.code == 2 and "--versio" in capsys.readouterr().err
