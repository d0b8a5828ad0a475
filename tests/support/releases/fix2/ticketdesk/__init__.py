"""The ticket desk, the body-only fix of fix1's run() (`tests/support/releases/README.md`)."""

RELEASE = "fix2"
