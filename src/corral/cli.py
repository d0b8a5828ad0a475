"""The `corral` console script (`corral = "corral.cli:main"`); see `corral._cli`."""

from __future__ import annotations

from corral._cli import main

__all__ = ["main"]
