"""Every command answers --help: the parser builds, each command's options register without clashes, and the
help text renders (a broken option declaration fails here before any model loads)."""

import pytest

from eaglekit.cli import COMMANDS, main


def test_the_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_answers_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    assert f"eaglekit {name}" in capsys.readouterr().out
