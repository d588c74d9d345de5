"""Stand-in modules for packages an engine environment lacks, run inside the engine's Python (never
imported by ckptinspect): the engine scripts name each one they install in their answer."""

from __future__ import annotations

STUB_SOURCE = r"""
import importlib.abc, importlib.machinery, sys, types
class _Any(types.ModuleType):
    __path__ = []
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Any(f"{self.__name__}.{name}")
    def __call__(self, *a, **k):
        return _Any("call")
    def __mro_entries__(self, bases):
        return (object,)
    def __iter__(self):
        return iter(())
class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = names
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        return _Any(spec.name)
    def exec_module(self, module):
        pass
try:  # transformers decides "absent" once, before the stand-ins exist, and keeps that answer
    import transformers.utils.import_utils as _iu
    _iu.is_torchvision_available()
    import transformers.models.auto.image_processing_auto  # noqa: F401
except Exception:
    pass
sys.meta_path.insert(0, _Stubs(set(%r)))
"""


_STUBBED: list[str] = []


def stub_missing(names: list[str], scratch: str, shims: list[str], why: str) -> None:
    """Packages named in CKPTINSPECT_VERIFY_STUB_MISSING that this environment lacks become empty stand-in
    modules, in this process and (through a sitecustomize on PYTHONPATH) in the engine's own subprocesses.
    Test environments use it for a package the dry-load never runs (torchvision's image transforms)."""
    import importlib.util
    import os

    missing = [n for n in names if n and (n in _STUBBED or importlib.util.find_spec(n) is None)]
    if not missing:
        return
    if all(n in _STUBBED for n in missing):  # an earlier job of this process installed them
        shims.append(f"{', '.join(missing)} absent from this environment: stand-in modules ({why})")
        return
    _STUBBED.extend(missing)
    source = STUB_SOURCE % (missing,)
    directory = os.path.join(scratch, "stubs")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "sitecustomize.py"), "w", encoding="utf-8") as fh:
        fh.write(source)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (directory, os.environ.get("PYTHONPATH")) if p)
    exec(compile(source, "ckptinspect-stubs", "exec"), {})
    shims.append(f"{', '.join(missing)} absent from this environment: stand-in modules ({why})")
