"""`python -m eaglekit` (what torchrun -m eaglekit and --tp N start)."""

import sys

from .cli import main

sys.exit(main())
