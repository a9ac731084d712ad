"""The one exception type the command line turns into a one-line error."""


class DproError(Exception):
    """Bad input or a state dpro refuses to act in, said in one line (exit code 1, no traceback)."""
