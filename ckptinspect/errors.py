"""Exception tree. The CLI maps every CkptInspectError to one stderr line and exit code 2.

    CkptInspectError
    ├── SourceError            a model reference that cannot be read
    │   ├── NotFoundError      missing directory / repo / revision / file
    │   │   └── GgufQuantChoice  a GGUF directory / repo of several quants named without :TAG
    │   ├── AccessError        gated or private repo (401 / 403)
    │   └── NetworkError       timeouts, 5xx, resets, bad ranges after retries
    ├── HeaderError            a safetensors header that violates the format
    ├── ConfigError            config.json / hf_quant_config.json / index malformed
    ├── RuleError              a rule file that fails its schema
    ├── PlanError              impossible plan inputs (unknown GPU, no fit)
    │   └── PlanNotPossible    nothing runs on these GPUs (``failure``: the options tried, a hint)
    ├── ProbeError             probe inputs that cannot work (no MTP, no memory)
    ├── EngineEnvError         `verify`: the engine's Python environment is missing, broken or too slow
    └── SettingsError          a variable or flag whose value cannot be used (settings.py)
"""

from __future__ import annotations


class CkptInspectError(Exception):
    """Base class: ``str(err)`` is the one line the CLI prints."""

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None) -> None:
        self.path = path
        self.hint = hint
        text = f"{path}: {message}" if path else message
        if hint:
            text = f"{text} ({hint})"
        # One line, and no terminal control from a file name or a value the checkpoint chose (a newline in
        # a file name would make the second line attacker-written): ckptinspect/escape.py.
        from ckptinspect.escape import escape_controls

        super().__init__(escape_controls(text))


class SourceError(CkptInspectError):
    pass


class NotFoundError(SourceError):
    pass


class GgufQuantChoice(NotFoundError):
    """A directory or repo holding several GGUF quants, named without ``:TAG``; ``models`` are the quants'
    file sets (``audit`` reads each as a row of its own)."""

    def __init__(self, message: str, *, models: tuple[str, ...] = (), path: str | None = None,
                 hint: str | None = None) -> None:
        self.models = models
        super().__init__(message, path=path, hint=hint)


class AccessError(SourceError):
    pass


class NetworkError(SourceError):
    pass


class HeaderError(CkptInspectError):
    pass


class ConfigError(CkptInspectError):
    pass


class RuleError(CkptInspectError):
    pass


class PlanError(CkptInspectError):
    pass


class PlanNotPossible(PlanError):
    """``api.plan`` found no TP / EP split or context that runs on the GPUs given, as it raises PlanError
    for a GPU it does not know; ``failure`` is the ``plan.PlanFailure`` record (every option tried, why
    each fails, the smallest GPU count that works), which `plan --format json` prints."""

    def __init__(self, message: str, *, failure: object, hint: str | None = None) -> None:
        self.failure = failure
        super().__init__(message, hint=hint)


class ProbeError(CkptInspectError):
    pass


class EngineEnvError(CkptInspectError):
    pass


def probe_install_hint(missing: str | None) -> str:
    """What installs the probe's dependencies (pyproject.toml's 'probe' extra), from PyPI and from a checkout."""
    return (f"probe needs torch and transformers ({missing} missing): pip install 'ckptinspect[probe]', or "
            f"from a checkout of ckptinspect: pip install -e '.[probe]'")
