"""The one error a bad config raises: ConfigError, a ValueError whose message names the source (file, variable or
``--set``), the key and the rule broken."""

from __future__ import annotations

from abpo.redact import redact


class ConfigError(ValueError):
    """A bad config file, variable or override: the message names the source, the key and the rule, with any
    credentials in the value blanked out (abpo.redact)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))
