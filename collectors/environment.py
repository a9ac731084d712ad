"""The job's environment variables, with the values of secret-looking ones redacted."""

from __future__ import annotations

import re
from collections.abc import Mapping

REDACTED = "<redacted>"
_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|_PWD$|CREDENTIAL|(^|_)AUTH|COOKIE|SESSION|"
    r"PRIVATE|(API|ACCESS|SIGNING|ENCRYPTION|SECRET)_?KEY|(^|_)KEY$|_KEY_|DSN$|CONN(ECTION)?_?STR)",
    re.IGNORECASE,
)
_URL_PASSWORD = re.compile(r"(?<=://)([^/:@\s]+):([^/@\s]+)@")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name suggests it holds a secret."""
    return bool(_SECRET_NAME.search(name))


def redact_environment(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with secret values replaced by ``<redacted>``.

    Secret-looking names (tokens, keys, passwords...) lose their value; passwords embedded in
    URLs (``scheme://user:password@host``) are redacted in every value.

    >>> redact_environment({"HF_TOKEN": "abc", "DB": "pg://u:pw@h/db", "RANK": "0"})
    {'DB': 'pg://u:<redacted>@h/db', 'HF_TOKEN': '<redacted>', 'RANK': '0'}
    """
    out = {}
    for name in sorted(env):
        value = env[name]
        out[name] = REDACTED if is_secret_name(name) else _URL_PASSWORD.sub(rf"\1:{REDACTED}@", value)
    return out
