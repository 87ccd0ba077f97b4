"""`python -m eaglekit` (what torchrun -m eaglekit and --tp N start)."""

from .cli import entry

entry()
