"""The ticket desk, release 1 (`tests/support/releases/README.md`)."""

RELEASE = "r1"
