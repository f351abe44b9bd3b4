"""The harness's one error: something the user can act on, said in one line."""


class HarnessError(Exception):
    """A component the harness runs could not be started or did not do what was waited for: one line,
    what and how to fix."""
