"""Every setting of the tool in one frozen record, built once at the edge.

``VARIABLES`` is the table (data, not code paths) of every environment variable the tool reads: its
name, the ``Settings`` field it sets, its kind, its finite bounds, its default, the flag that overrides
it and its documentation line. docs/security.md, docs/hub_and_wire.md and CONTRIBUTING.md show the
table through a generated block (scripts/gen_docs.py), so the documentation cannot drift from it.

Where settings come from, first match wins: a command-line flag, then the environment, then the
default. Each value is parsed once, here: an empty value, a word where a number belongs, ``nan``,
``inf``, ``1e309`` (which Python reads as infinity), a number outside the bounds, or a switch that is
not one of ``1 / 0 / true / false / yes / no / on / off`` is a ``SettingsError`` naming the variable
and the problem (the CLI prints it as one line, exit 2). A set variable is checked even when a flag
overrides it, so a broken environment is seen at once, not when the flag is dropped.

Who reads the environment: only this module (``Settings.from_environ``), called by the CLI
(ckptinspect/cli) and by the ``ckptinspect.api`` functions a library caller calls without
``settings=``. Everything below them gets its settings as parameters, never from ``os.environ``
(tests/test_settings.py checks the source tree for it). huggingface_hub still reads its own variables
(HF_TOKEN, HF_HUB_OFFLINE, HF_HOME / HF_HUB_CACHE, proxies, ...) itself, and the tool follows
huggingface_hub's reading of them (its ``constants``).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from ckptinspect.errors import CkptInspectError

GIB = 1024 ** 3
MIB = 1024 ** 2
BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")  # no nan / inf / hex / "1_000"


class SettingsError(CkptInspectError):
    """A setting (environment variable or flag) whose value cannot be used."""

    detail = ""


@dataclass(frozen=True)
class Settings:
    """What a command (or a library call) runs with; ``Settings()`` is every default, no environment.

    ``cache_dir`` None: no on-disk cache of the tool's own (Hub headers, audit reports) is read or
    written; the CLI always names one (CKPTINSPECT_CACHE_DIR, else ``$XDG_CACHE_HOME/ckptinspect``, else
    ``~/.cache/ckptinspect``). ``endpoint`` None: huggingface_hub's own (``constants.ENDPOINT``).
    """

    deadline_s: float = 300.0
    request_timeout_s: float = 60.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 10.0
    retry_wait_s: float = 30.0
    max_bytes: int = 2 * GIB
    http_attempts: int = 4
    http_backoff_s: float = 0.25
    max_workers: int = 20
    endpoint: str | None = None
    cache_dir: Path | None = None
    cache_key_file: Path | None = None  # the per-user key of the caches' MACs (ckptinspect/cache_auth.py)
    header_cache: bool = True
    header_cache_max_bytes: int = 512 * MIB
    gpu_spec: Path | None = None
    probe_memory_limit: int | None = None
    probe_host_memory_limit: int | None = None
    probe_generate: str = "eager"
    debug: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """The settings ``environ`` (default ``os.environ``, read once now) gives over the defaults;
        SettingsError naming the first variable that cannot be used."""
        env = dict(os.environ if environ is None else environ)
        values: dict[str, Any] = {"cache_dir": default_cache_dir(env), "cache_key_file": default_key_file(env)}
        for variable in VARIABLES:
            if variable.name in env:
                values[variable.field] = parse(variable, env[variable.name])
        return cls(**values)


@dataclass(frozen=True)
class Variable:
    """One row of the settings table."""

    name: str  # the environment variable
    field: str  # the Settings attribute it sets
    kind: str  # "seconds", "whole seconds", "bytes", "count" (numbers), "switch", "path", "directory", "url", "choice"
    default: str  # the default as documented (the Settings field's default is the value)
    doc: str
    low: float | None = None  # numbers: the smallest allowed value
    high: float | None = None  # numbers: the largest allowed value
    low_open: bool = False  # the smallest value itself is not allowed (a time limit of 0)
    flag: str | None = None  # the command-line flag that overrides it
    choices: tuple[str, ...] = ()  # "choice": the words allowed (lower case)

    def bounds(self) -> str:
        """The allowed values in words, for errors and the docs."""
        if self.kind == "switch":
            return "1, 0, true, false, yes, no, on or off"
        if self.kind == "path":
            return "a file path"
        if self.kind == "directory":
            return "an absolute directory path"
        if self.kind == "url":
            return "an http:// or https:// URL"
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        low = ">" if self.low_open else ">="
        return f"{low} {_number(self.low)} and <= {_number(self.high)}"


def _number(value: float | None) -> str:
    if value is None:
        return "?"
    if value == int(value) and value >= 1024 and int(value) % 1024 == 0:
        return f"{int(value):,}"
    return f"{value:g}"


# The table. Bounds are finite everywhere: a time limit has no "off" value, so 1e309 or inf cannot
# switch one off; the upper bounds are far beyond any use and keep arithmetic on them exact.
DAY_S = 86400.0
VARIABLES: tuple[Variable, ...] = (
    Variable("CKPTINSPECT_DEADLINE_S", "deadline_s", "seconds", "300",
             "every Hub request of one command together (an audit: all its repos)", 0, 7 * DAY_S, True, "--deadline"),
    Variable("CKPTINSPECT_REQUEST_TIMEOUT_S", "request_timeout_s", "seconds", "60",
             "one Hub request's whole answer: connect, redirects, headers, body", 0, DAY_S, True,
             "--request-timeout"),
    Variable("CKPTINSPECT_CONNECT_TIMEOUT_S", "connect_timeout_s", "seconds", "10",
             "TCP connect and TLS handshake of one request", 0, 3600, True),
    # huggingface_hub reads it too, as a whole number (int() at its import: "0.5" would be its traceback)
    Variable("HF_HUB_DOWNLOAD_TIMEOUT", "read_timeout_s", "whole seconds", "10",
             "one socket read (huggingface_hub's variable; the Hub reader uses it too)", 1, 3600),
    Variable("CKPTINSPECT_RETRY_WAIT_S", "retry_wait_s", "seconds", "30",
             "backoff and Retry-After waits of one request together", 0, DAY_S, True),
    Variable("CKPTINSPECT_MAX_BYTES", "max_bytes", "bytes", f"{2 * GIB:,} (2 GiB)",
             "body bytes one command receives from the Hub, all requests together", 1, 1024 * GIB),
    Variable("CKPTINSPECT_HTTP_ATTEMPTS", "http_attempts", "count", "4",
             "attempts per Hub request (timeouts, resets, 408 / 429 / 5xx are retried)", 1, 100),
    Variable("CKPTINSPECT_HTTP_BACKOFF_S", "http_backoff_s", "seconds", "0.25",
             "first backoff between attempts (doubled each time, with jitter)", 0, 60),
    Variable("CKPTINSPECT_MAX_WORKERS", "max_workers", "count", "20",
             "header requests in flight at once for one repo", 1, 256),
    Variable("HF_ENDPOINT", "endpoint", "url", "https://huggingface.co",
             "the Hub (huggingface_hub's variable; the Hub reader and listing use it too)"),
    Variable("CKPTINSPECT_CACHE_DIR", "cache_dir", "directory", "$XDG_CACHE_HOME/ckptinspect, else ~/.cache/ckptinspect",
             "the tool's own caches: hub-headers/ (Hub headers), audit/ (audit reports)"),
    Variable("CKPTINSPECT_CACHE_KEY_FILE", "cache_key_file", "path",
             "$XDG_CONFIG_HOME/ckptinspect/cache-key, else ~/.config/ckptinspect/cache-key",
             "the per-user key every cache entry is authenticated with (created 0600 on first use; never inside "
             "the cache directory, never restored with it: docs/security.md)"),
    Variable("CKPTINSPECT_HEADER_CACHE", "header_cache", "switch", "on",
             "keep headers read from the Hub by commit and etag, so a second report asks only the repo info"),
    Variable("CKPTINSPECT_HEADER_CACHE_MAX_BYTES", "header_cache_max_bytes", "bytes", f"{512 * MIB:,} (512 MiB)",
             "the header cache's size; the oldest entries go first", 0, 1024 * GIB),
    Variable("CKPTINSPECT_GPU_SPEC", "gpu_spec", "path", "none",
             "a YAML / JSON file of extra GPU entries (report, plan, probe)", flag="--gpu-spec"),
    Variable("CKPTINSPECT_PROBE_MEMORY_LIMIT", "probe_memory_limit", "bytes", "the device's free memory",
             "probe: device memory to plan batches for, instead of the free memory measured", 1, 1 << 50),
    Variable("CKPTINSPECT_PROBE_HOST_MEMORY_LIMIT", "probe_host_memory_limit", "bytes", "half the host memory",
             "probe: host memory the streamed run may hold its hidden states in", 1, 1 << 50),
    Variable("CKPTINSPECT_PROBE_GENERATE", "probe_generate", "choice", "eager",
             "probe --mode greedy: how transformers generates the continuations: eager (dynamic KV cache) or static "
             "(static KV cache, the decode step compiled with CUDA graphs on a GPU; where that is refused the run "
             "generates eagerly and says so in the JSON's generate object)", choices=("eager", "static")),
    Variable("CKPTINSPECT_DEBUG", "debug", "switch", "off",
             "print the traceback of an error instead of one line", flag="--debug"),
)
BY_NAME = {v.name: v for v in VARIABLES}
BY_FIELD = {v.field: v for v in VARIABLES}
assert set(BY_FIELD) == {f.name for f in fields(Settings)}, "a Settings field without a row in the table"


def parse(variable: Variable, text: str) -> Any:
    """``text`` as ``variable``'s value, or SettingsError: "NAME='text': problem (allowed: ...)"; its
    ``detail`` is the message without the name (a flag's error names the flag instead)."""
    raw = text.strip()
    shown = repr(text if len(text) <= 40 else text[:40] + "...")

    def fail(problem: str) -> SettingsError:
        if variable.kind == "url":  # an endpoint may carry a password: never echoed
            detail = f"{problem} (allowed: {variable.bounds()})"
            error = SettingsError(f"{variable.name}: {detail}")
        else:
            detail = f"{shown}: {problem} (allowed: {variable.bounds()}; unset: {variable.default})"
            error = SettingsError(f"{variable.name}={detail}")
        error.detail = detail
        return error

    if not raw:
        raise fail("empty")
    if variable.kind == "switch":
        if raw.lower() not in BOOL_WORDS:
            raise fail("not a switch")
        return BOOL_WORDS[raw.lower()]
    if variable.kind in ("path", "directory"):
        if "\0" in raw:
            raise fail("a path cannot hold a NUL byte")
        path = Path(raw).expanduser()
        if variable.kind == "directory" and not path.is_absolute():  # as XDG_CACHE_HOME: never below the cwd
            raise fail("not an absolute path")
        return path
    if variable.kind == "choice":
        if raw.lower() not in variable.choices:
            raise fail("not one of the choices")
        return raw.lower()
    if variable.kind == "url":
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s]*)?", raw, flags=re.IGNORECASE):
            raise fail("not an http(s) URL with a host")
        return raw
    if variable.kind in ("count", "bytes", "whole seconds"):
        if not _INTEGER.fullmatch(raw):
            raise fail("not a whole number")
        if len(raw.lstrip("+-")) > 30:  # beyond every bound here; int() of 4,301 digits would raise besides
            raise fail("out of range")
        value: float = int(raw) if variable.kind != "whole seconds" else float(int(raw))
    else:
        if not _DECIMAL.fullmatch(raw):
            raise fail("not a number")
        value = float(raw)
        if not math.isfinite(value):
            raise fail("not a finite number")
    assert variable.low is not None and variable.high is not None
    if value > variable.high or value < variable.low or (variable.low_open and value == variable.low):
        raise fail("out of range")
    return value


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """Where the tool's caches live unless CKPTINSPECT_CACHE_DIR says: ``$XDG_CACHE_HOME/ckptinspect``,
    else ``~/.cache/ckptinspect`` (an empty or relative XDG_CACHE_HOME counts as unset, as the XDG Base
    Directory spec says: a cache never lands below the current directory)."""
    base = Path(environ.get("XDG_CACHE_HOME", "").strip() or "~/.cache").expanduser()
    return (base if base.is_absolute() else Path.home() / ".cache") / "ckptinspect"


def default_key_file(environ: Mapping[str, str]) -> Path:
    """Where the caches' key lives unless CKPTINSPECT_CACHE_KEY_FILE says: the config directory, not the
    cache directory (CI restores caches, and a key restored with one authenticates nothing):
    ``$XDG_CONFIG_HOME/ckptinspect/cache-key``, else ``~/.config/ckptinspect/cache-key``."""
    base = Path(environ.get("XDG_CONFIG_HOME", "").strip() or "~/.config").expanduser()
    return (base if base.is_absolute() else Path.home() / ".config") / "ckptinspect" / "cache-key"


DEFAULTS = Settings()


def or_environ(settings: Settings | None) -> Settings:
    """``settings``, else the environment's, read once now: the library's edge (ckptinspect.api)."""
    return settings if settings is not None else Settings.from_environ()

__all__ = ["Settings", "SettingsError", "Variable", "VARIABLES", "BY_NAME", "BY_FIELD", "BOOL_WORDS", "DEFAULTS",
           "parse", "default_cache_dir", "default_key_file", "or_environ"]
