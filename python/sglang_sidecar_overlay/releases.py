"""Which SGLang releases the overlay supports, which adapter serves each one, and which of
them CI tests: the one place these are written (the plugin, ``status``, the test-env script
and the Makefile all read it).

Pure metadata lookups, standard library only: nothing here imports SGLang (so ``status`` can
answer even where importing SGLang would take seconds or fail), and ``scripts/`` load this
file by path before the package is installed.
"""

from __future__ import annotations

from importlib import metadata

# One adapter module per SGLang API generation (see docs/compatibility.md).
_ADAPTER_BY_VERSION = {
    "0.5.19": "sglang_sidecar_overlay.adapters.v0_5_19",
    "0.5.20": "sglang_sidecar_overlay.adapters.v0_5_19",
    "0.5.21": "sglang_sidecar_overlay.adapters.v0_5_19",
    "0.5.22": "sglang_sidecar_overlay.adapters.v0_5_22",
    "0.5.23": "sglang_sidecar_overlay.adapters.v0_5_22",
}

SUPPORTED_VERSIONS = tuple(_ADAPTER_BY_VERSION)
# The newest supported release (the table above is in release order): the one the demo, the
# stress run, the benchmark's upstream comparison and the patch series use.
NEWEST_RELEASE = SUPPORTED_VERSIONS[-1]
SUPPORTED_RANGE = f"{SUPPORTED_VERSIONS[0]}–{NEWEST_RELEASE}"
# The releases ``make test`` runs the SGLang tier on: the newest of each adapter generation.
CI_RELEASES = ("0.5.21", "0.5.23")


def release_of(version: str) -> str:
    """``0.5.21.post1`` and ``0.5.21rc0`` belong to release ``0.5.21``."""
    parts = version.split(".")
    if len(parts) < 3:
        return version
    # Keep only the leading digits of the patch field ("21rc0" -> "21").
    digits = ""
    for ch in parts[2]:
        if not ch.isdigit():
            break
        digits += ch
    return ".".join([parts[0], parts[1], digits])


def adapter_for(version: str) -> str | None:
    """The adapter module for an SGLang version, or None when it is not supported."""
    return _ADAPTER_BY_VERSION.get(release_of(version))


def installed_sglang_version() -> str | None:
    """The installed SGLang distribution's version, read without importing SGLang."""
    try:
        dist = metadata.distribution("sglang")
    except metadata.PackageNotFoundError:
        return None
    # ``dist.version`` parses the whole METADATA file, description included (~30 KB for
    # SGLang, about 2 ms), in every process that loads the plugin: read the header instead.
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    return _header_version(text) or dist.version


def _header_version(text: str) -> str | None:
    """The ``Version`` field of a core-metadata header (which ends at the first blank line)."""
    for line in text.splitlines():
        if not line.strip():
            return None
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == "version":
            return value.strip()
    return None
