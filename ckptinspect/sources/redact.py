"""Credentials never leave the process: the userinfo of a URL (``http://user:pass@host``, e.g. in
HF_ENDPOINT or a proxy variable) and access tokens are removed from everything printed or stored
(the report's ``source.location``, ``--verbose`` statistics, snapshot files, error lines)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

# scheme://userinfo@ -> scheme://; userinfo is everything up to the last "@" before the host part.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s@]*@")


def redact_url(url: str) -> str:
    """``url`` without its userinfo (``http://user:pass@host:8080/x`` -> ``http://host:8080/x``)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def scrub(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` with URL userinfo removed and each of ``secrets`` (tokens, passwords) replaced by ``***``."""
    text = _USERINFO.sub(lambda m: m.group("scheme"), text)
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text
