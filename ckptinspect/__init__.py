"""ckptinspect: what is in an LLM checkpoint, is its MTP draft layer usable, how to launch it.

Library use (the CLI calls the same functions)::

    import ckptinspect
    report = ckptinspect.inspect("nvidia/Qwen3.5-397B-A17B-NVFP4")   # pipeline.Report, no torch
    report.mtp.verdicts["sglang"].verdict                            # "ready" | "degraded" | ...
    from ckptinspect import api
    plan = api.plan("./my-model", gpu="rtx-pro-6000", gpus=8)         # plan.Plan; nothing fits: PlanNotPossible
    result = api.probe("./my-model", api.ProbeOptions(device="cuda:0"))  # imports torch, only here
    from ckptinspect.settings import Settings
    report = ckptinspect.inspect("org/name", settings=Settings(deadline_s=30))  # no environment read

``plan``, ``diff`` and ``probe`` are reached through ``ckptinspect.api`` because the package already
has subpackages of those names (``ckptinspect.plan``, ...), which an attribute of the same name would
shadow. Renderers for every command and format: ``ckptinspect.render``.
"""

from typing import Any

__version__ = "0.2.0"  # the release scheme and what each version changed: CHANGELOG.md

# What `from ckptinspect import *` and a notebook's tab completion offer; resolved lazily below, so
# `import ckptinspect` (and `ckptinspect --help`) stays cheap. ``plan``, ``diff``, ``probe`` and
# ``audit`` are subpackages: call them as ``ckptinspect.api.plan`` etc.
_API = ("inspect", "gate", "snapshot", "find_gpu", "gpus", "list_rules", "family_rule", "validate_rules")
_ERRORS = ("CkptInspectError", "SourceError", "NotFoundError", "GgufQuantChoice", "AccessError", "NetworkError",
           "HeaderError", "ConfigError", "RuleError", "PlanError", "PlanNotPossible", "ProbeError")
__all__ = ["__version__", "api", "errors", *_API, *_ERRORS]


def __getattr__(name: str) -> Any:
    if name in _API:
        from ckptinspect import api

        return getattr(api, name)
    if name in _ERRORS:
        from ckptinspect import errors

        return getattr(errors, name)
    if name in ("api", "errors"):
        import importlib

        return importlib.import_module(f"ckptinspect.{name}")
    raise AttributeError(f"module 'ckptinspect' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__} - {"Any"})
