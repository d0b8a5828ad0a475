"""The ticket desk, a release whose run() has a bug (`tests/support/releases/README.md`)."""

RELEASE = "fix1"
