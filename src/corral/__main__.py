"""`python -m corral`: the same as the `corral` command."""

from __future__ import annotations

import sys

from corral.cli import main

if __name__ == "__main__":
    sys.exit(main())
