"""`python -m vime.cli`: the `vime` command."""

import sys

from vime.cli import main

sys.exit(main())
