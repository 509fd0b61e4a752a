"""Helpers shared by the test suite (the replay server among them)."""
