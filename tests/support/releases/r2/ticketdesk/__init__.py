"""The ticket desk, release 2 (`tests/support/releases/README.md`)."""

RELEASE = "r2"
