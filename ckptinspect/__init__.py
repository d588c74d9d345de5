"""ckptinspect: what is in an LLM checkpoint, is its MTP draft layer usable, how to launch it.

Library use (the CLI calls the same functions)::

    import ckptinspect
    report = ckptinspect.inspect("nvidia/Qwen3.5-397B-A17B-NVFP4")   # pipeline.Report, no torch
    report.mtp.verdicts["sglang"].verdict                            # "ready" | "degraded" | ...
    from ckptinspect import api
    plan = api.plan("./my-model", gpu="rtx-pro-6000", gpus=8)         # plan.Plan
    result = api.probe("./my-model", device="cuda:0")                 # imports torch, only here
    from ckptinspect.settings import Settings
    report = ckptinspect.inspect("org/name", settings=Settings(deadline_s=30))  # no environment read

``plan``, ``diff`` and ``probe`` are reached through ``ckptinspect.api`` because the package already
has subpackages of those names (``ckptinspect.plan``, ...), which an attribute of the same name would
shadow. Renderers for every command and format: ``ckptinspect.render``.
"""

from typing import Any

__version__ = "0.2.0"  # the release scheme and what each version changed: CHANGELOG.md


def __getattr__(name: str) -> Any:
    # Lazy, so `import ckptinspect` (and `ckptinspect --help`) stays cheap.
    if name in ("inspect", "gate"):
        from ckptinspect import api

        return getattr(api, name)
    raise AttributeError(f"module 'ckptinspect' has no attribute {name!r}")
