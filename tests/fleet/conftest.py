"""The real API server of the agents' tests, for the roll's (one more per session)."""

from tests.agents.conftest import api  # noqa: F401  (a fixture, used by name)
