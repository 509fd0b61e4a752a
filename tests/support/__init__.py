"""Helpers shared by the test suite (the scripted upstream among them)."""
