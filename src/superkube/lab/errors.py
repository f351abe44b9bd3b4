"""The lab's one error: something the user can act on, said in one line."""


class LabError(Exception):
    """Something the user can act on: one line, what and how to fix."""
