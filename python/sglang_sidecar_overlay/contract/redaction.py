"""The secret rule: which names hold secrets, and how server info and command lines hide them.

Defined once here: the server-info builder applies it, the probe checks served JSON against it,
and the schema's secret-name pattern is generated from it (``secret_name_pattern``; a test
keeps the packaged schema equal to it). Pure functions, no SGLang import.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

__all__ = [
    "REDACTED",
    "REDACTION_EXCEPTIONS",
    "SECRET_WORDS",
    "is_secret_name",
    "redact",
    "redact_launch_command",
    "secret_name_pattern",
]

REDACTED = "<redacted>"
SECRET_WORDS = frozenset(
    {"key", "secret", "token", "password", "passwd", "credential", "credentials"}
)
# Field names of the supported releases that end in a secret word but hold no secret.
REDACTION_EXCEPTIONS = frozenset(
    {"bucket_time_to_first_token", "kt_max_deferred_experts_per_token"}
)

_ENV_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)


def secret_name_pattern() -> str:
    """The JSON Schema ``patternProperties`` regex matching exactly the secret names.

    Case-insensitive per letter (JSON Schema regexes have no flags), the exceptions excluded.
    """
    exceptions = "|".join(f"{re.escape(name)}$" for name in sorted(REDACTION_EXCEPTIONS))
    words = "|".join(
        "".join(f"[{ch.upper()}{ch.lower()}]" for ch in word) for word in sorted(SECRET_WORDS)
    )
    return f"^(?!{exceptions})(.*[_-])?({words})$"


def is_secret_name(name: str) -> bool:
    """A name whose last ``_``/``-``-separated word names a secret, minus the exceptions."""
    normalized = name.strip().lstrip("-").replace("-", "_").lower()
    if normalized in REDACTION_EXCEPTIONS:
        return False
    return normalized.rsplit("_", 1)[-1] in SECRET_WORDS


def redact(value: Any) -> Any:
    """A copy with secret-named keys at any depth hidden, ``launch_command`` included.

    ``None`` stays ``None``: an unset secret reveals nothing, and consumers can still tell
    "not configured" from "configured".
    """
    if isinstance(value, Mapping):
        return {key: _redact_item(key, item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, tuple):
        return tuple(redact(item) for item in value)
    return value


def _redact_item(key: Any, item: Any) -> Any:
    if isinstance(key, str) and is_secret_name(key):
        return None if item is None else REDACTED
    if key == "launch_command" and isinstance(item, str):
        return redact_launch_command(item)
    return redact(item)


def redact_launch_command(command: str) -> str:
    """The command line with secret ``--flag value`` / ``--flag=value`` values hidden.

    Also hides ``NAME=value`` environment assignments and secret keys inside JSON-valued
    arguments. Returns the input unchanged when nothing needed hiding.
    """
    try:
        words = shlex.split(command)
    except ValueError:
        # Unbalanced quotes: fall back to whitespace so a secret is still found.
        words = command.split()
    redacted = _redact_words(words)
    if redacted == words:
        return command
    return shlex.join(redacted)


def _redact_words(words: list[str]) -> list[str]:
    result: list[str] = []
    hide_next = False
    for word in words:
        if hide_next and not word.startswith("--"):
            result.append(REDACTED)
            hide_next = False
            continue
        hide_next = (
            word.startswith("-")
            and "=" not in word
            and not _has_space(word)
            and is_secret_name(word)
        )
        result.append(word if hide_next else _redact_word(word))
    return result


def _redact_word(word: str) -> str:
    """One argument: ``--flag=value``, ``NAME=value``, JSON, or a quoted nested command."""
    name, eq, value = word.partition("=")
    if eq and not _has_space(name) and (word.startswith("-") or _ENV_ASSIGNMENT.match(word)):
        if is_secret_name(name):
            return f"{name}={REDACTED}"
        inner = _redact_word(value)
        return word if inner == value else f"{name}={inner}"
    if word.startswith("{"):
        redacted_json = _redact_json_word(word)
        if redacted_json is not None:
            return redacted_json
    if _has_space(word):
        # A quoted argument can carry a whole command line of its own.
        return redact_launch_command(word)
    return word


def _has_space(text: str) -> bool:
    return any(char.isspace() for char in text)


def _redact_json_word(word: str) -> str | None:
    """The JSON argument with secret keys hidden; None when the word is not JSON."""
    try:
        parsed = json.loads(word)
    except ValueError:
        return None
    cleaned = redact(parsed)
    return word if cleaned == parsed else json.dumps(cleaned, ensure_ascii=False)
