"""The one error a bad config raises: ConfigError, a ValueError whose message names the source (file, variable or
``--set``), the key and the rule broken."""

from __future__ import annotations

from abpo.redact import redact

# The longest refusal printed: a message names the source, the key and the rule, and shows what it read only as a
# short excerpt (abpo.yamlfile.excerpt); this bound holds whatever a message was given.
MAX_MESSAGE_CHARS = 4000


class ConfigError(ValueError):
    """A bad config file, variable or override: the message names the source, the key and the rule, with any
    credentials in the value blanked out (abpo.redact), at most :data:`MAX_MESSAGE_CHARS` characters."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(_bounded(redact(a)) if isinstance(a, str) else a for a in args))


def _bounded(text: str) -> str:
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return f"{text[:MAX_MESSAGE_CHARS]}... ({len(text)} characters in all)"
