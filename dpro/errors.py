"""The one exception type the command line turns into a one-line error."""


class DproError(Exception):
    """Bad input or a state dpro refuses to act in, said in one line (exit code 1, no traceback)."""


class PartialRunWarning(UserWarning):
    """A run is analysed without some of its ranks (a trace that cannot be decoded, say); the
    command line prints it as one ``Warning:`` line, and ``--strict`` makes it an error."""
