"""Tools for the repository itself (docs build, source views), never installed."""
