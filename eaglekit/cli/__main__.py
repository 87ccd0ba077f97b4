"""`python -m eaglekit.cli`: the `eaglekit` command, as the console script runs it."""

from . import entry

entry()
