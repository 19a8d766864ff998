"""The secret rule: which names hold secrets, and how server info and command lines hide them.

Defined once here: the server-info builder applies it, the probe checks served JSON against it,
and the schema's secret-name pattern is generated from it (``secret_name_pattern``; a test
keeps the packaged schema equal to it). Pure functions, no SGLang import.

What is hidden, in any string at any depth (server args, ``launch_command``, nested values):

- the value of a key whose name is secret (``is_secret_name``), in a mapping, in a JSON or
  Python-literal object held in a string, or (when such text does not parse) in its
  ``"name": value`` / ``name=value`` pairs;
- the argument after a secret flag (``--api-key X``), after ``=`` (``--api-key=X``), and the
  value of a secret ``NAME=value`` environment prefix, in command lines and argument lists;
- the user information of a URL (``scheme://user:password@host`` → ``scheme://<redacted>@host``);
- the value of a secret URL query parameter (``is_secret_query_name``: the secret words plus
  ``QUERY_SECRET_WORDS`` such as ``sig``, ``signature``, ``X-Amz-Signature``).

Anything else is returned byte-identical. Free text cannot be judged: a secret pasted where no
name, flag, URL or query parameter marks it stays visible.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

__all__ = [
    "QUERY_SECRET_WORDS",
    "REDACTED",
    "REDACTION_EXCEPTIONS",
    "SECRET_WORDS",
    "is_secret_name",
    "is_secret_query_name",
    "redact",
    "redact_launch_command",
    "redact_text",
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
# Last words of URL query parameters that carry a credential, on top of SECRET_WORDS: signed
# URLs (S3 ``X-Amz-Signature``/``Signature``, GCS ``X-Goog-Signature``, Azure SAS ``sig``),
# S3 v2 ``AWSAccessKeyId``, and the common ``auth``/``apikey``/``pwd`` spellings.
QUERY_SECRET_WORDS = frozenset(
    {"sig", "signature", "auth", "authorization", "apikey", "pwd", "awsaccesskeyid"}
)

_WORD_SEPARATORS = frozenset(" \t\r\n")
_ENV_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
# scheme://userinfo@ : the userinfo runs to the last '@' before the authority ends.
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^\s/?#\"'<>\\]*)@")
# ?name=value / &name=value; the value runs to the next separator ("<redacted>" included).
_QUERY_PARAM = re.compile(r"([?&])([^=&#\s?\"'<>]+)=([^&#\s\"']*)")
# "name": value / 'name': value / name=value pairs in text that does not parse as a whole.
_KEY_VALUE = re.compile(
    r"""(?P<q>["']?)(?P<name>[A-Za-z0-9_.-]+)(?P=q)(?P<sep>\s*[:=]\s*)"""
    r"""(?P<value>"(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?|[^\s,;&}\]"']+)"""
)
# Text longer than this is not parsed as a structure (the pair fallback still applies).
_MAX_STRUCTURED_CHARS = 1 << 20


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


def is_secret_query_name(name: str) -> bool:
    """A URL query parameter carrying a credential: a secret name or a QUERY_SECRET_WORDS one."""
    if is_secret_name(name):
        return True
    normalized = name.strip().replace("-", "_").lower()
    return normalized.rsplit("_", 1)[-1] in QUERY_SECRET_WORDS


# Passes until a command line's redaction settles (two in practice; the bound is a guard).
_MAX_COMMAND_PASSES = 4


def redact(value: Any) -> Any:
    """A copy with every secret hidden, at any depth (the module docstring lists the forms).

    ``None`` stays ``None``: an unset secret reveals nothing, and consumers can still tell
    "not configured" from "configured". Non-string scalars are returned as they are.
    """
    if isinstance(value, Mapping):
        return {key: _redact_item(key, item) for key, item in value.items()}
    if isinstance(value, list):
        return _redact_sequence(value)
    if isinstance(value, tuple):
        return tuple(_redact_sequence(list(value)))
    if isinstance(value, str):
        return redact_text(value)
    return value


def _redact_item(key: Any, item: Any) -> Any:
    if isinstance(key, str) and is_secret_name(key):
        return None if item is None else REDACTED
    return redact(item)


def _redact_sequence(items: list[Any]) -> list[Any]:
    """Items redacted one by one; a string after a secret flag (``["--api-key", "X"]``) hidden."""
    result: list[Any] = []
    hide_next = False
    for item in items:
        if hide_next and isinstance(item, str) and not item.startswith("--"):
            result.append(REDACTED)
            hide_next = False
            continue
        hide_next = isinstance(item, str) and _is_secret_flag(item)
        result.append(redact(item))
    return result


def _is_secret_flag(word: str) -> bool:
    return (
        word.startswith("-") and "=" not in word and not _has_space(word) and is_secret_name(word)
    )


def redact_text(text: str) -> str:
    """One string with its secrets hidden: a JSON/Python-literal structure, a command line, or a
    single word (flag, ``NAME=value``, URL). Returns ``text`` itself when nothing needed hiding.
    """
    structured = _redact_structured(text)
    if structured is not None:
        return structured
    if _has_space(text):
        return redact_launch_command(_redact_pairs(text) if _looks_structured(text) else text)
    return _redact_word(text)


def redact_launch_command(command: str) -> str:
    """The command line with secret ``--flag value`` / ``--flag=value`` values hidden.

    Also hides ``NAME=value`` environment assignments, secrets inside JSON-valued arguments and
    URL credentials. Returns the input unchanged when nothing needed hiding. The result is a
    fixed point (redacting it again changes nothing), so a consumer that checks for leftover
    secrets the same way finds none: a pass re-quotes the words it splits, and the quoting of
    a launcher that joined argv unquoted can take a second pass to settle.
    """
    text = command
    for _ in range(_MAX_COMMAND_PASSES):
        redacted = _redact_command_once(text)
        if redacted == text:
            break
        text = redacted
    return text


def _redact_command_once(command: str) -> str:
    # Pairs first, on the whole line: a launcher that joined argv without quoting leaves a JSON
    # argument in pieces ('{"secret_key":' 'value,'), which no single word reveals.
    paired = _redact_pairs(command)
    try:
        words = shlex.split(paired)
    except ValueError:
        # Unbalanced quotes: fall back to whitespace so a secret is still found.
        words = [word for word in re.split(r"[ \t\r\n]+", paired) if word]
    redacted = _redact_words(words)
    if paired == command and redacted == words:
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
        hide_next = _is_secret_flag(word)
        result.append(word if hide_next else _redact_word(word))
    return result


def _redact_word(word: str) -> str:
    """One argument: ``--flag=value``, ``NAME=value``, a structure, a nested command, a URL."""
    name, eq, value = word.partition("=")
    assignment = word.startswith("-") or _ENV_ASSIGNMENT.match(word)
    if eq and name and not _has_space(name) and assignment:
        if is_secret_name(name):
            return f"{name}={REDACTED}"
        inner = redact_text(value)
        return word if inner == value else f"{name}={inner}"
    if _has_space(word):
        # A quoted argument can carry a whole command line or an object of its own.
        return redact_text(word)
    structured = _redact_structured(word)
    if structured is not None:
        return structured
    return _redact_pairs(word) if _looks_structured(word) else _redact_urls(word)


def _redact_urls(text: str) -> str:
    """URL user information and secret query parameter values hidden."""
    if "://" in text:
        text = _URL_USERINFO.sub(lambda match: f"{match.group(1)}{REDACTED}@", text)
    if "=" in text:
        text = _QUERY_PARAM.sub(_query_replacement, text)
    return text


def _query_replacement(match: re.Match[str]) -> str:
    if not is_secret_query_name(match.group(2)):
        return str(match.group(0))
    return f"{match.group(1)}{match.group(2)}={REDACTED}"


def _has_space(text: str) -> bool:
    # shlex's word separators exactly: splitting on anything else could never shorten a word.
    return any(char in _WORD_SEPARATORS for char in text)


def _looks_structured(text: str) -> bool:
    return text.lstrip()[:1] in ("{", "[")


def _redact_structured(text: str) -> str | None:
    """A JSON or Python-literal object/array with its secrets hidden; None when not one.

    Text that starts like one but does not parse (or nests too deep to walk) is None too: the
    caller then hides its secret ``name: value`` pairs (``_redact_pairs``), flags and URLs, so
    it never comes back unexamined.
    """
    if not _looks_structured(text):
        return None
    stripped = text.strip()
    if len(stripped) > _MAX_STRUCTURED_CHARS:
        return None
    as_json = True
    try:
        parsed = json.loads(stripped)
    except (ValueError, RecursionError):
        as_json = False
        try:
            parsed = ast.literal_eval(stripped)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    if not isinstance(parsed, (dict, list, tuple)):
        return None
    try:
        cleaned = redact(parsed)
    except RecursionError:
        return None
    if cleaned == parsed:
        return text
    return json.dumps(cleaned, ensure_ascii=False) if as_json else repr(cleaned)


def _redact_pairs(text: str) -> str:
    """Fallback for text that looks structured but is not parsable: pairs and URLs."""

    def replace(match: re.Match[str]) -> str:
        if not is_secret_name(match.group("name")):
            return str(match.group(0))
        value = match.group("value")
        quote = value[:1] if value[:1] in ("'", '"') else ""
        head = match.group(0)[: match.start("value") - match.start(0)]
        return f"{head}{quote}{REDACTED}{quote}"

    return _redact_urls(_KEY_VALUE.sub(replace, text))
