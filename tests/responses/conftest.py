"""The Responses tests' fixtures: the thread tests' stores of each kind (SQLite in a temporary
file, PostgreSQL in a schema of this run's) serve the response store too."""

from tests.threads.conftest import postgres, store_kind, url

__all__ = ["postgres", "store_kind", "url"]
