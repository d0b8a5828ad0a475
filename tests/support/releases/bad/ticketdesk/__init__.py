"""The ticket desk, release 1 with an incompatible state change
(`tests/support/releases/README.md`)."""

RELEASE = "bad"
