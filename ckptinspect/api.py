"""The library API that the CLI and the tests call: ``inspect``, ``plan``, ``diff``, ``snapshot``,
``probe``, ``gate``; the rule files (``list_rules``, ``family_rule``, ``validate_rules``); the GPU catalog
and split checks the CLI validates options with (``gpus``, ``find_gpu``, ``split_problem``); what the
error messages quote (``hub_endpoint``, ``cached_files``).

Each function takes a model reference (a directory, ``org/name[@revision]`` or a ``.json.gz``
snapshot) and returns plain records; rendering lives in ``ckptinspect.render``. ``probe`` is the only
one that imports torch, and only when called, so ``inspect`` (the ``report`` path) stays torch-free.
The CLI (``ckptinspect/cli``) imports nothing from the package but this module, ``render``, ``cli``
and ``errors``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

from ckptinspect.errors import CkptInspectError, NotFoundError, PlanError, RuleError
from ckptinspect.records import VERDICT_RANK
from ckptinspect.refs import looks_like_repo_id, normalize_ref

# `--fail-on LEVEL`: the verdict rank at and above which a gate trips.
FAIL_ON = {"degraded": VERDICT_RANK["degraded"], "unusable": VERDICT_RANK["unusable"]}
FAIL_ON_CHOICES = (*sorted(FAIL_ON), "error")  # "error": any error-severity finding
ENGINES = ("sglang", "vllm")
# Files that live inside a model directory: naming one means the directory was meant.
_MODEL_DIR_FILES = ("config.json", "hf_quant_config.json", "model.safetensors.index.json",
                    "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def check_ref(ref: str) -> str:
    """Reject references that can only be a mistake, before any source is opened.

    An empty string (an unset shell variable) is never "the bundled example"; a file inside a model
    directory (``path/config.json``, a ``.safetensors`` shard) names the directory to pass instead.
    """
    if not ref.strip():
        raise NotFoundError("empty model reference (an unset shell variable?); pass a directory, org/name "
                            "or a .json.gz snapshot, or no argument at all for the bundled example",
                            path=repr(ref))
    path = Path(ref).expanduser()
    if path.is_file() and not ref.endswith(".json.gz"):
        name = path.name
        if name in _MODEL_DIR_FILES or name.endswith((".safetensors", ".safetensors.index.json")):
            parent = str(path.parent) or "."
            raise NotFoundError(f"is a file inside a model directory; pass the directory instead: {parent}",
                                path=ref)
    return ref


@contextmanager
def _not_found_context(ref: str) -> Iterator[None]:
    """A repo id the Hub does not know that could have been a mistyped relative path says so."""
    try:
        yield
    except NotFoundError as exc:
        if looks_like_repo_id(ref) and not Path(ref).exists() and not cached_files(ref)[2]:
            message = str(exc)
            if exc.path and message.startswith(f"{exc.path}: "):
                message = message[len(exc.path) + 2:]
            if exc.hint and message.endswith(f" ({exc.hint})"):
                message = message[: -len(f" ({exc.hint})")]
            raise type(exc)(f"{message}; no local directory of that name either", path=exc.path,
                            hint=exc.hint) from None
        raise


def example_ref() -> str:
    """The bundled example checkpoint (the layout of nvidia/Qwen3.5-397B-A17B-NVFP4, tiny dims), named as
    the user would type it from the current directory: relative below it (a checkout), else absolute
    (an installed wheel); like any typed path, the report's `location` is then that same path."""
    from ckptinspect.examples import EXAMPLE_DIR

    try:
        return str(EXAMPLE_DIR.relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):  # not below it, or the current directory is gone
        return str(EXAMPLE_DIR)


def inspect(ref: str | None = None, *, rules_dirs: Sequence[Path] = (), revision: str | None = None,
            token: str | None = None, progress: bool = False, tp: int | None = None, ep: int | None = None,
            gpu: str | None = None, gpus: int | None = None, context: int | None = None,
            engine: str = "both") -> Any:
    """The `report` of ``ref`` (``None``: the bundled example) as a ``pipeline.Report``.

    ``tp`` (and ``ep``) add the MTP layer's cost per GPU; ``gpu`` with ``gpus`` add a deployment plan.
    """
    from ckptinspect.pipeline import build_report

    if (gpu is None) != (gpus is None):
        raise PlanError("--gpu and --gpus go together")
    ref = example_ref() if ref is None else check_ref(ref)
    ref, revision = normalize_ref(ref, revision)
    with _not_found_context(ref):
        report = build_report(ref, rules_dirs=rules_dirs, revision=revision, token=token, progress=progress)
    if tp is not None:
        report = replace(report, mtp_costs=(_mtp_cost(report, tp, ep),))
    if gpu is not None and gpus is not None:
        report = replace(report, plan=_plan_section(report, gpu=gpu, gpus=gpus, context=context, engine=engine))
    return report


def _mtp_cost(report: Any, tp: int, ep: int | None) -> Any:
    from ckptinspect.readiness.cost import mtp_cost

    return mtp_cost(report.checkpoint, report.mtp, tp, ep or tp)


def _plan_section(report: Any, *, gpu: str, gpus: int, context: int | None, engine: str) -> Any:
    # Exactly one planner call: a plan that cannot be made is a report section saying why (the
    # planner owns that text); the report's exit code does not change.
    from ckptinspect.plan import plan_or_failure

    return plan_or_failure(report.checkpoint, report.mtp, gpu=gpu, gpus=gpus, context=context, engine=engine)


def plan(ref: str, *, gpu: str, gpus: int, context: int | None = None, goal: str = "latency",
         engine: str = "both", probe_report: dict | None = None, max_context: bool = False, concurrency: int = 1,
         rules_dirs: Sequence[Path] = (), revision: str | None = None, token: str | None = None,
         progress: bool = False) -> Any:
    """Fit ``ref`` on ``gpus`` x ``gpu``: a ``plan.Plan`` (memory, KV capacity, launch commands) or, when
    nothing runs, a ``plan.PlanFailure`` saying why. ``max_context``: solve for the longest context
    ``concurrency`` requests get."""
    from ckptinspect.pipeline import build_report
    from ckptinspect.plan import find_gpu, plan_or_failure

    find_gpu(gpu)  # fail on a bad GPU name before reading any checkpoint
    ref, revision = normalize_ref(check_ref(ref), revision)
    with _not_found_context(ref):
        report = build_report(ref, rules_dirs=rules_dirs, revision=revision, token=token, progress=progress)
    return plan_or_failure(report.checkpoint, report.mtp, gpu=gpu, gpus=gpus, context=context, goal=goal,
                           engine=engine, probe_report=probe_report, max_context=max_context,
                           concurrency=concurrency)


def diff(ref_a: str, ref_b: str, *, rules_dirs: Sequence[Path] = (), progress: bool = False) -> Any:
    """``diff.CheckpointDiff`` of checkpoint A (reference, e.g. BF16) against B (e.g. its quant)."""
    from ckptinspect.diff import diff_checkpoints
    from ckptinspect.pipeline import build_report

    ref_a, _ = normalize_ref(check_ref(ref_a))
    ref_b, _ = normalize_ref(check_ref(ref_b))
    with _not_found_context(ref_a):
        ra = build_report(ref_a, rules_dirs=tuple(rules_dirs), progress=progress)
    with _not_found_context(ref_b):
        rb = build_report(ref_b, rules_dirs=tuple(rules_dirs), progress=progress)
    return diff_checkpoints(ra.checkpoint, rb.checkpoint, ra.mtp, rb.mtp)


def snapshot(ref: str, output: Path, *, revision: str | None = None, token: str | None = None,
             progress: bool = False) -> Any:
    """Write ``ref``'s config files, index and every shard header into ``output`` (.json.gz); returns the
    ``RawCheckpoint`` that was saved (its ``stats`` say how it was read)."""
    from ckptinspect.sources import open_source
    from ckptinspect.sources.snapshot import write_snapshot

    if not str(output).endswith(".json.gz"):
        raise CkptInspectError("the snapshot file name must end with .json.gz", path=str(output))
    from ckptinspect.snapshot_output import refuse_protected_output, write_error

    ref, revision = normalize_ref(check_ref(ref), revision)
    with _not_found_context(ref):
        raw = open_source(ref, revision=revision, token=token, progress=progress)
    refuse_protected_output(raw, output)
    try:
        write_snapshot(raw, output)
    except OSError as exc:
        raise write_error(exc, output) from None
    return raw


def probe(ref: str, **options: Any) -> Any:
    """Measure MTP draft acceptance (``probe.runner.run_probe``); imports torch, needs the 'probe' extra."""
    from ckptinspect.errors import ProbeError

    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ProbeError(f"probe needs torch and transformers: pip install 'ckptinspect[probe]' "
                         f"({exc.name} missing)") from exc
    from ckptinspect.probe.runner import run_probe

    return run_probe(check_ref(ref), **options)


def gate(report: Any, fail_on: str, engine: str = "both") -> list[str]:
    """What trips ``--fail-on`` (empty: the gate passes): ``engine=verdict`` for each engine whose MTP
    verdict is ``fail_on`` or worse, or for ``fail_on="error"`` the code of each error finding."""
    if fail_on == "error":
        return [f.code for f in (*report.checkpoint.findings, *(report.mtp.findings if report.mtp else ()))
                if f.severity == "error"]
    if report.mtp is None:
        return []
    engines = ENGINES if engine == "both" else (engine,)
    return [f"{e}={report.mtp.verdicts[e].verdict}" for e in engines
            if e in report.mtp.verdicts and VERDICT_RANK[report.mtp.verdicts[e].verdict] >= FAIL_ON[fail_on]]


def diff_gate(result: Any, fail_on: str) -> list[str]:
    """``code (severity)`` for each diff finding at or above ``fail_on`` ("warning" or "error")."""
    levels = {"error": ("error",), "warning": ("error", "warning")}[fail_on]
    return [f"{f.code} ({f.severity})" for f in result.findings if f.severity in levels]


def read_probe_report(path: Path) -> dict:
    """A probe JSON file for ``plan(probe_report=...)``: a JSON object whose recommendation's step and
    token counts, where given, are positive integers; anything else is a PlanError naming the file."""
    from ckptinspect.guarded_file import MAX_PROBE_REPORT_BYTES, read_json

    data = read_json(path, what="probe report", cap=MAX_PROBE_REPORT_BYTES, error=PlanError)
    if not isinstance(data, dict):
        raise PlanError("probe report is not a JSON object", path=str(path))
    rec = data.get("recommendation")
    if rec is not None and not isinstance(rec, dict):
        raise PlanError("probe report 'recommendation' is not an object", path=str(path))
    for engine, keys in (("sglang", ("num_steps", "eagle_topk", "num_draft_tokens")),
                         ("vllm", ("num_speculative_tokens",))):
        values = (rec or {}).get(engine) or {}
        for key in keys:
            if key in values and (not isinstance(values[key], int) or values[key] < 1):
                raise PlanError(f"recommendation.{engine}.{key} must be a positive integer, got {values[key]!r}",
                                path=str(path))
    return data


# -- GPU catalog and parallel splits (option checks before any checkpoint is read) -----------------
def gpus() -> tuple[Any, ...]:
    """Every GPU of rules/gpus.yaml (``plan.GpuSpec``)."""
    from ckptinspect.plan import load_gpus

    return tuple(load_gpus())


def find_gpu(name: str) -> Any:
    """The catalog GPU named ``name`` (name or alias, case / space / '_' insensitive); PlanError if none."""
    from ckptinspect.plan import find_gpu as find

    return find(name)


def gpu_name_keys(name: str) -> list[str]:
    """The spellings ``find_gpu`` tries for ``name`` (as typed, without vendor, without packaging words)."""
    from ckptinspect.plan.gpus import name_keys

    return name_keys(name)


def split_problem(tp: int, ep: int | None) -> str:
    """Why SGLang / vLLM refuse ``--tp tp --ep ep``, or "" when both accept it."""
    from ckptinspect.plan import split_problem as problem

    return problem(tp, ep)


# -- rule files ------------------------------------------------------------------------------------
def list_rules(rules_dirs: Sequence[Path] = (), *, include_abstract: bool = False) -> tuple[Any, ...]:
    """The family rules (``readiness.FamilyRule``), built-ins plus ``rules_dirs``; abstract bases only
    with ``include_abstract``."""
    from ckptinspect.readiness import load_rules

    ruleset = load_rules(rules_dirs)
    return tuple(ruleset.families) if include_abstract else ruleset.concrete()


def family_rule(family: str, rules_dirs: Sequence[Path] = ()) -> Any:
    """One family rule with everything it inherits resolved; RuleError naming the known ids if none."""
    from ckptinspect.readiness import load_rules

    ruleset = load_rules(rules_dirs)
    fam = ruleset.get(family)
    if fam is None:
        known = ", ".join(f.id for f in ruleset.concrete())
        raise RuleError(f"unknown family {family!r} (known: {known})")
    return fam


@dataclass(frozen=True)
class RuleFileCheck:
    """One outcome of ``validate_rules``: ``path`` passed (error None) or the one-line error."""

    path: str
    error: str | None


def validate_rules(paths: Sequence[Path], rules_dirs: Sequence[Path] = ()) -> list[RuleFileCheck]:
    """Check rule files or directories of them, in order.

    A family file is checked against the family schema and resolved together with the built-ins and
    ``rules_dirs`` (unknown ``extends``, colliding claims, missing engine sections); a directory is
    schema-checked file by file, then resolved as a whole (its files may extend each other), and its
    files pass only when both hold. An engine (``kind: engine`` / ``common``) or GPU catalog file, or a
    directory of only such files (rules/engines/), is checked against its own schema.
    """
    from ckptinspect.readiness.loader import load_rules, read_rule_file, rule_files
    from ckptinspect.rules.documents import load_validated, plan_rule_schema

    out: list[RuleFileCheck] = []

    def passes(where: Path, action: Any) -> bool:
        try:
            action()
        except RuleError as exc:
            out.append(RuleFileCheck(str(where), str(exc)))
            return False
        return True

    for path in paths:
        path = Path(path)
        if path.is_dir():
            files = rule_files(path)
            schemas = {f: _plan_schema_or_none(f) for f in files}
            if files and all(schemas.values()):  # a directory of engine / GPU files (rules/engines/)
                out += [RuleFileCheck(str(f), None) for f in files
                        if passes(f, lambda f=f: load_validated(f, schemas[f]))]
                continue
            good = [f for f in files if passes(f, lambda f=f: read_rule_file(f))]
            if len(good) == len(files) and passes(path, lambda: load_rules((*rules_dirs, path))):
                out += [RuleFileCheck(str(f), None) for f in files]
            continue
        found: list[str | None] = []
        if not passes(path, lambda: found.append(plan_rule_schema(path))):
            continue
        schema = found[0]
        if schema is not None:
            if passes(path, lambda: load_validated(path, schema)):
                out.append(RuleFileCheck(str(path), None))
        elif passes(path, lambda: read_rule_file(path)) and \
                passes(path, lambda: load_rules(rules_dirs, extra_files=[path])):
            out.append(RuleFileCheck(str(path), None))
    return out


def _plan_schema_or_none(path: Path) -> str | None:
    from ckptinspect.rules.documents import plan_rule_schema

    try:
        return plan_rule_schema(path)
    except RuleError:
        return None  # unreadable: the family checks that follow report the error, once


# -- what error messages quote ---------------------------------------------------------------------
def hub_endpoint() -> str:
    """The Hub endpoint requests go to (HF_ENDPOINT or the default)."""
    from ckptinspect.sources.hub import hub_endpoint as endpoint

    return endpoint()


def cached_files(ref: str) -> tuple[str, Path, list[str]]:
    """(repo id, HF cache directory, sorted file names the cache's snapshots hold for ``ref``'s repo)."""
    from ckptinspect.sources import split_repo_ref
    from ckptinspect.sources.hf_cache import hub_cache_dir, repo_storage

    repo_id, _ = split_repo_ref(ref)
    snapshots = repo_storage(repo_id) / "snapshots"
    files = sorted({p.name for p in snapshots.glob("*/*")}) if snapshots.is_dir() else []
    return repo_id, hub_cache_dir(), files
