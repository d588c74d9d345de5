"""The library API that the CLI and the tests call: ``inspect``, ``plan``, ``diff``, ``snapshot``,
``probe`` (its options: ``ProbeOptions``), ``verify``, ``gate``; the rule files (``list_rules``,
``family_rule``, ``validate_rules``); the GPU catalog and split checks the CLI validates options with
(``gpus``, ``find_gpu``, ``split_problem``); what the error messages quote (``hub_endpoint``,
``cached_files``).

Each function takes a model reference (a directory, ``org/name[@revision]`` or a ``.json.gz``
snapshot) and returns plain records; rendering lives in ``ckptinspect.render``. ``probe`` is the only
one that imports torch, and only when called, so ``inspect`` (the ``report`` path) stays torch-free.
The CLI (``ckptinspect/cli``) imports nothing from the package but this module, ``render``, ``cli``,
``settings`` and ``errors``. A function that reads a checkpoint takes ``settings=`` (ckptinspect/settings.py)
and hands it down; without it, the environment is read once (``settings.or_environ``), as the CLI does.
"""

from __future__ import annotations

import errno
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from ckptinspect.errors import (CkptInspectError, GgufQuantChoice, NotFoundError, PlanError, PlanNotPossible,
                                ProbeError, probe_install_hint)
from ckptinspect.lookups import (family_rule, find_gpu, gpus, list_rules, split_gpu_count, split_problem,
                                 validate_rules)
from ckptinspect.records import VERDICT_RANK
from ckptinspect.refs import check_ref, looks_like_repo_id, normalize_ref
from ckptinspect.probe.options import ProbeOptions  # torch-free: the CLI builds one before torch loads
from ckptinspect.settings import Settings, or_environ

if TYPE_CHECKING:  # the return types, named without importing their stages at import time
    from ckptinspect.diff import CheckpointDiff
    from ckptinspect.pipeline import Report
    from ckptinspect.records import Checkpoint
    from ckptinspect.plan import GpuSpec, Plan, PlanFailure
    from ckptinspect.plan.llamacpp import LlamaCppPlan
    from ckptinspect.audit import AuditRow, RepoRef
    from ckptinspect.probe.result import ProbeResult
    from ckptinspect.plan.mtp_cost import MtpCost
    from ckptinspect.records import RawCheckpoint

# `--fail-on LEVEL`: the verdict rank at and above which a gate trips.
FAIL_ON = {"degraded": VERDICT_RANK["degraded"], "unusable": VERDICT_RANK["unusable"]}
FAIL_ON_CHOICES = (*sorted(FAIL_ON), "error")  # "error": any error-severity finding
ENGINES = ("sglang", "vllm")


@contextmanager
def _not_found_context(ref: str) -> Iterator[None]:
    """A repo id the Hub does not know that could have been a mistyped relative path says so."""
    try:
        yield
    except NotFoundError as exc:
        if isinstance(exc, GgufQuantChoice):  # the repo is there: it holds several quants
            raise
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
            gpu: "str | GpuSpec | None" = None, gpus: int | None = None, context: int | None = None,
            engine: str = "both", engine_versions: "dict[str, str] | None" = None,
            verify_engine: str | None = None, engine_python: str | None = None,
            engine_pythonpath: str | None = None, settings: Settings | None = None) -> "Report":
    """The `report` of ``ref`` (``None``: the bundled example) as a ``pipeline.Report``.

    ``tp`` (and ``ep``) add the MTP layer's cost per GPU; ``gpu`` with ``gpus`` add a deployment plan;
    ``engine_versions`` ({"vllm": "0.33.0"}) answers for those releases instead of the rules' newest;
    ``verify_engine`` ("sglang" / "vllm", with ``engine_python`` / ``engine_pythonpath`` as for ``verify``)
    also dry-loads the draft through that engine's own code, judges the rules for the installed version and
    lets the dry-load decide that engine's verdict (verify/decide.py; ``Report.engine_checks``); an engine
    environment that is missing or gives no answer is an ``EngineEnvError``, never a rules-only answer.
    ``settings`` (ckptinspect/settings.py; None: the environment's, read once now) bound the Hub reads and,
    with ``verify_engine``, the whole command (``deadline_s``).
    """
    import time

    from ckptinspect.pipeline import build_report

    if (gpu is None) != (gpus is None):
        raise PlanError("--gpu and --gpus go together")
    settings = or_environ(settings)
    started = time.monotonic()
    if verify_engine is not None:  # the engine's environment is checked before anything is read
        engine_versions = _verified_versions(verify_engine, engine_python, engine_pythonpath, engine_versions)
    ref = example_ref() if ref is None else check_ref(ref)
    ref, revision = normalize_ref(ref, revision)
    with _not_found_context(ref):
        report = build_report(ref, rules_dirs=rules_dirs, revision=revision, token=token, progress=progress,
                              engine_versions=engine_versions, settings=settings)
    if verify_engine is not None:
        from ckptinspect.verify import verify_ref as verify
        from ckptinspect.verify.decide import apply_to_report

        if report.checkpoint.format == "gguf":
            raise CkptInspectError("--verify-engine dry-loads safetensors checkpoints through SGLang / vLLM; this "
                                   "is GGUF (llama.cpp)", path=ref)
        result = verify(ref, verify_engine, engine_python=engine_python, engine_pythonpath=engine_pythonpath,
                        deadline=_left(settings, started), revision=revision, token=token, progress=progress,
                        settings=settings)
        report = apply_to_report(report, {verify_engine: result})
    return _with_sections(report, ref, tp=tp, ep=ep, gpu=gpu, gpus=gpus, context=context, engine=engine)


def _verified_versions(engine: str, engine_python: str | None, engine_pythonpath: str | None,
                       given: "dict[str, str] | None") -> dict[str, str]:
    """``given`` with ``engine`` at its installed version (the one the dry-load runs: the rules answer for
    the same release); an ``--engine-version`` for it naming another release is refused."""
    from ckptinspect.errors import ConfigError
    from ckptinspect.verify import engine_version

    installed = engine_version(engine, engine_python=engine_python, engine_pythonpath=engine_pythonpath)
    asked = (given or {}).get(engine)
    if asked is not None and asked != installed:
        raise ConfigError(f"--engine-version {engine}={asked} and --verify-engine {engine}: the installed {engine} "
                          f"is {installed}, and the dry-load answers for that release only",
                          hint=f"drop --engine-version {engine}=..., or point --engine-python at {engine} {asked}")
    return {**(given or {}), engine: installed}


def _left(settings: Settings, started: float) -> float:
    """What is left of the command's deadline (``settings.deadline_s``) since ``started``."""
    import time

    return max(1.0, settings.deadline_s - (time.monotonic() - started))


def _with_sections(report: "Report", ref: str, *, tp: int | None, ep: int | None, gpu: "str | GpuSpec | None",
                   gpus: int | None, context: int | None, engine: str) -> "Report":  # MTP cost, plan
    if report.checkpoint.format == "gguf" and tp is not None:
        raise PlanError("--tp / --ep describe SGLang / vLLM deployments; a GGUF runs on llama.cpp: "
                        "`--gpu GPU --gpus N` adds its llama-server plan", path=ref)
    if tp is not None:
        from ckptinspect.plan.mtp_cost import mtp_cost

        report = replace(report, mtp_costs=(mtp_cost(report.checkpoint, report.mtp, tp, ep or tp),))
    if gpu is not None and gpus is not None:
        report = replace(report, plan=_plan_section(report, gpu=gpu, gpus=gpus, context=context, engine=engine))
    return report


def _plan_section(report: "Report", *, gpu: "str | GpuSpec", gpus: int, context: int | None,
                  engine: str) -> "Plan | PlanFailure":
    # Exactly one planner call: a plan that cannot be made is a report section saying why (the
    # planner owns that text); the report's exit code does not change.
    from ckptinspect.plan import plan_or_failure

    if report.checkpoint.format == "gguf":  # a GGUF runs on llama.cpp: its llama-server plan
        from ckptinspect.plan.llamacpp import plan_llamacpp

        return plan_llamacpp(report.checkpoint, report.mtp, gpu=gpu, gpus=gpus, context=context)
    return plan_or_failure(report.checkpoint, report.mtp, gpu=gpu, gpus=gpus, context=context, engine=engine)


def plan(ref: str, *, gpu: "str | GpuSpec", gpus: int, context: int | None = None, goal: str = "latency",
         engine: str = "both", probe_report: dict | None = None, max_context: bool = False, concurrency: int = 1,
         rules_dirs: Sequence[Path] = (), revision: str | None = None, token: str | None = None,
         progress: bool = False, stats: dict | None = None, settings: Settings | None = None) -> "Plan | LlamaCppPlan":
    """Fit ``ref`` on ``gpus`` x ``gpu``: a ``plan.Plan`` (memory, KV capacity, launch commands), or a
    ``LlamaCppPlan`` for a GGUF. Nothing that runs is ``errors.PlanNotPossible`` (a PlanError, as for an
    unknown GPU) whose ``failure`` holds the options tried. ``max_context``: solve for the longest context
    ``concurrency`` requests get. ``gpu``: a name or a ``GpuSpec`` (``find_gpu``); ``stats``: a dict to
    fill with how the checkpoint was read."""
    from ckptinspect.pipeline import build_report
    from ckptinspect.plan import find_gpu, plan_or_failure

    find_gpu(gpu)  # fail on a bad GPU name before reading any checkpoint
    ref, revision = normalize_ref(check_ref(ref), revision)
    with _not_found_context(ref):
        report = build_report(ref, rules_dirs=rules_dirs, revision=revision, token=token, progress=progress,
                              settings=or_environ(settings))
    if stats is not None:  # how the checkpoint was read (--verbose)
        stats.update(report.checkpoint.stats)
    if report.checkpoint.format == "gguf":  # GGUF runs on llama.cpp (plan/llamacpp.py)
        if engine not in ("both", "llamacpp"):
            raise PlanError(f"{ref} is a GGUF checkpoint: plans are made for llama.cpp (--engine llamacpp), not {engine}")
        from ckptinspect.plan.llamacpp import plan_llamacpp

        return plan_llamacpp(report.checkpoint, report.mtp, gpu=gpu, gpus=gpus, context=context)
    if engine == "llamacpp":
        raise PlanError(f"{ref} is not a GGUF checkpoint: llama.cpp plans are made for GGUF files")
    result = plan_or_failure(report.checkpoint, report.mtp, gpu=gpu, gpus=gpus, context=context, goal=goal,
                             engine=engine, probe_report=probe_report, max_context=max_context,
                             concurrency=concurrency)
    if not result.ok:
        raise PlanNotPossible(result.message, hint=result.hint, failure=result)
    return result


def diff(ref_a: str, ref_b: str, *, rules_dirs: Sequence[Path] = (), progress: bool = False,
         token: str | None = None, stats: dict | None = None, settings: Settings | None = None) -> "CheckpointDiff":
    """``diff.CheckpointDiff`` of checkpoint A (reference, e.g. BF16) against B (e.g. its quant); ``stats``:
    a dict to fill with how each was read ({"A": ..., "B": ...})."""
    from ckptinspect.diff import diff_checkpoints
    from ckptinspect.pipeline import build_report

    settings = or_environ(settings)
    ref_a, _ = normalize_ref(check_ref(ref_a))
    ref_b, _ = normalize_ref(check_ref(ref_b))
    with _not_found_context(ref_a):
        ra = build_report(ref_a, rules_dirs=tuple(rules_dirs), progress=progress, token=token, settings=settings)
    with _not_found_context(ref_b):
        rb = build_report(ref_b, rules_dirs=tuple(rules_dirs), progress=progress, token=token, settings=settings)
    if stats is not None:
        stats.update(A=dict(ra.checkpoint.stats), B=dict(rb.checkpoint.stats))
    a, b = _with_head(ra), _with_head(rb)
    if a.format != b.format:  # safetensors vs GGUF: compare under the converter's Hugging Face names
        from ckptinspect.inventory.gguf_names import hf_view

        # a GGUF matches no family rule: take the other side's, so the layouts are compared, not the rule match
        a = replace(hf_view(a), family=b.family) if a.format == "gguf" else a
        b = replace(hf_view(b), family=a.family) if b.format == "gguf" else b
    return diff_checkpoints(a, b, ra.mtp, rb.mtp)


def _with_head(report: "Report") -> "Checkpoint":
    """The checkpoint with a companion-file MTP head's groups counted, as `report` counts that head."""
    ck = report.checkpoint
    if not report.head_groups:
        return ck
    from ckptinspect.records import Inventory, Totals

    head, t = report.head_groups, ck.inventory.totals
    groups = (*ck.inventory.groups, *head)
    totals = Totals(tensors=t.tensors + sum(g.tensors for g in head), params=t.params + sum(g.params for g in head),
                    bytes=t.bytes + sum(g.bytes for g in head))
    return replace(ck, inventory=Inventory(groups=groups, shards=ck.inventory.shards, totals=totals))


def snapshot(ref: str, output: str | Path, *, revision: str | None = None, token: str | None = None,
             progress: bool = False, settings: Settings | None = None) -> "RawCheckpoint":
    """Write ``ref``'s config files, index and every shard header into ``output`` (.json.gz); returns the
    ``RawCheckpoint`` that was saved (its ``stats`` say how it was read)."""
    from ckptinspect.snapshot_output import refuse_output_in, refuse_protected_output, write_error
    from ckptinspect.sources import open_source
    from ckptinspect.sources.snapshot import write_snapshot

    if not str(output).endswith(".json.gz"):  # also refuses "x.json.gz/" (a directory's name)
        raise CkptInspectError("the snapshot file name must end with .json.gz", path=str(output))
    output = Path(output)
    # Before any read: a path in a Hugging Face cache repo folder is refused as such (not sent off to create
    # a folder there), and a missing folder is not grown (a typo must not make a directory tree).
    refuse_output_in((), output, "a snapshot")
    if output.parent.exists() and not output.parent.is_dir():
        raise write_error(NotADirectoryError(errno.ENOTDIR, "Not a directory"), output)
    if not output.parent.is_dir():
        raise CkptInspectError(f"refusing to write: the directory {output.parent} does not exist (create "
                               "it first; snapshot never creates directories)",
                               path=str(output))

    ref, revision = normalize_ref(check_ref(ref), revision)
    with _not_found_context(ref):
        raw = open_source(ref, revision=revision, token=token, progress=progress, settings=or_environ(settings))
    if getattr(raw, "format", None) == "gguf":
        raise CkptInspectError("snapshots hold safetensors headers; a GGUF checkpoint is reported from its files",
                               path=ref)
    refuse_protected_output(raw, output)
    try:
        write_snapshot(raw, output)
    except OSError as exc:
        raise write_error(exc, output) from None
    return raw


def probe(ref: str, options: ProbeOptions | None = None, settings: Settings | None = None) -> "ProbeResult":
    """Measure MTP draft acceptance of ``ref`` with ``options`` (``ProbeOptions``; None: every default):
    in process (``probe.runner.run_probe``), or through the running engine at ``options.engine``
    (``probe.engine_client.run_engine``). ``settings`` (None: the environment's, read once now) fill in
    the options left unset: ``memory_limit`` / ``host_memory_limit`` (Settings.probe_memory_limit /
    probe_host_memory_limit) and, in process, ``generate`` (Settings.probe_generate). Imports torch, needs
    the 'probe' extra."""
    if options is None:
        options = ProbeOptions()
    elif not isinstance(options, ProbeOptions):
        raise TypeError(f"api.probe(ref, options, settings): options is a ProbeOptions, not "
                        f"{type(options).__name__}")
    settings = or_environ(settings)
    options = replace(options, memory_limit=(settings.probe_memory_limit if options.memory_limit is None
                                             else options.memory_limit),
                      host_memory_limit=(settings.probe_host_memory_limit if options.host_memory_limit is None
                                         else options.host_memory_limit))
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ProbeError(probe_install_hint(exc.name)) from exc
    if options.engine:  # the engine at this URL measures; the checkpoint gives tokenizer, readiness and cost model
        from ckptinspect.probe.engine_client import run_engine

        return run_engine(check_ref(ref), options, settings=settings)
    from ckptinspect.probe.runner import run_probe
    from ckptinspect.sources.gguf_local import looks_like_gguf

    if looks_like_gguf(ref):
        raise ProbeError("the probe runs safetensors checkpoints with transformers; GGUF files are not probed "
                         "(llama-server logs its draft acceptance)", path=ref)
    if options.generate is None:  # in-process transformers only (not --engine)
        options = replace(options, generate=settings.probe_generate)
    return run_probe(check_ref(ref), options, settings=settings)


def gate(report: "Report", fail_on: str, engine: str = "both") -> list[str]:
    """What trips ``--fail-on`` (empty: the gate passes): ``engine=verdict`` for each engine whose MTP
    verdict is ``fail_on`` or worse, or for ``fail_on="error"`` the code of each error finding. A draft the
    family declares in a subfolder (MiniMax-M3's ``dspark/``) and the checkpoint ships is gated too, as
    ``dspark/ engine=verdict`` and ``code (dspark/)``: a release whose shipped draft is broken is not ready
    for that draft. A subfolder the checkpoint does not ship (``absent``: the target serves without it) or
    a source cannot read (``not read``: its info finding says so) adds nothing."""
    drafts = [d for d in report.drafts if d.status == "present"]
    if fail_on == "error":
        return [f.code for f in (*report.checkpoint.findings, *(report.mtp.findings if report.mtp else ()))
                if f.severity == "error"] + [f"{f.code} ({d.subfolder}/)" for d in drafts for f in d.findings
                                             if f.severity == "error"]
    if report.mtp is None:
        return []
    # "both" gates every engine judged (sglang and vllm, or llamacpp for a GGUF); naming an engine that was
    # not judged is an error, never a silent pass
    engines = tuple(report.mtp.verdicts) if engine == "both" else (engine,)
    if any(e not in report.mtp.verdicts for e in engines):
        raise CkptInspectError(f"--fail-on: no {engine} verdict for this checkpoint (judged: "
                               f"{', '.join(report.mtp.verdicts)})")
    return [f"{e}={report.mtp.verdicts[e].verdict}" for e in engines
            if e in report.mtp.verdicts and VERDICT_RANK[report.mtp.verdicts[e].verdict] >= FAIL_ON[fail_on]] + [
        f"{d.subfolder}/ {e}={d.verdicts[e].verdict}" for d in drafts for e in engines
        if e in d.verdicts and VERDICT_RANK[d.verdicts[e].verdict] >= FAIL_ON[fail_on]]


def diff_gate(result: "CheckpointDiff", fail_on: str) -> list[str]:
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


# -- what error messages quote ---------------------------------------------------------------------
def hub_endpoint(settings: Settings | None = None) -> str:
    """The Hub endpoint requests go to (HF_ENDPOINT or the default), without any userinfo password."""
    from ckptinspect.sources.hub_session import hub_endpoint as endpoint
    from ckptinspect.sources.redact import redact_url

    return redact_url(endpoint(or_environ(settings).endpoint))


def cached_files(ref: str) -> tuple[str, Path, list[str]]:
    """(repo id, HF cache directory, sorted file names the cache's snapshots hold for ``ref``'s repo)."""
    from ckptinspect.sources import split_repo_ref
    from ckptinspect.sources.hf_cache import cached_repo_files, hub_cache_dir

    repo_id, _ = split_repo_ref(ref)
    return repo_id, hub_cache_dir(), cached_repo_files(repo_id)  # huggingface_hub's scan_cache_dir


# -- audit: many repos at once (ckptinspect/audit) ---------------------------------------------------
def audit_select(*, ids: Sequence[str] = (), ids_file: Path | None = None, quantized_from: str | None = None,
                 author: str | None = None, search: str | None = None, limit: int | None = None,
                 token: str | None = None, settings: Settings | None = None) -> "list[RepoRef]":
    """The repos an audit reads (``audit.RepoRef``): ``ids``, the ids in ``ids_file``, and one Hub listing
    (``HfApi.list_models``) narrowed by ``quantized_from`` (the ``base_model:quantized:`` relation),
    ``author`` and ``search`` together."""
    from ckptinspect.audit import Selection, select_repos

    return select_repos(Selection(ids=tuple(ids), ids_file=ids_file, quantized_from=quantized_from, author=author,
                                  search=search, limit=limit), token=token, endpoint=hub_endpoint(settings))


def audit(refs: "Sequence[str | RepoRef]", *, gpu: str | None = None, gpus: int | None = None, context: int | None = None,
          engine: str = "both", rules_dirs: Sequence[Path] = (), token: str | None = None, jobs: int = 8,
          max_requests: int = 64, deadline_s: float | None = None, cache: bool = True,
          verify_engine: str | None = None, engine_python: str | None = None, engine_pythonpath: str | None = None,
          settings: Settings | None = None) -> "Iterator[AuditRow]":
    """An iterator of ``audit.AuditRow``, one per repo of ``refs`` (repo ids or ``audit.RepoRef``), in the order
    they finish; each row's report is ``inspect(repo, gpu=..., gpus=...)``'s, or the error that stopped it.

    ``verify_engine`` (with ``engine_python`` / ``engine_pythonpath``): the rules judge that engine at its
    installed version, and once every report is in, every readable repo's draft is dry-loaded in ONE engine
    process (``verify.verify_many``) within what is left of the audit's deadline; each row's verdict then
    follows ``inspect(verify_engine=...)``'s rule (verify/decide.py). The rows come all at once at the end;
    an engine environment that is missing or gives no answer is an ``EngineEnvError``."""
    import time

    from ckptinspect.audit import AuditOptions, RepoRef, run_audit

    if (gpu is None) != (gpus is None):
        raise PlanError("--gpu and --gpus go together")
    if gpu is not None:
        find_gpu(gpu)
    list_rules(rules_dirs)  # a bad --rules-dir is the command's error, not one error row per repo
    settings = or_environ(settings)
    started = time.monotonic()
    versions = _verified_versions(verify_engine, engine_python, engine_pythonpath, None) if verify_engine else None
    wanted = [r if isinstance(r, RepoRef) else RepoRef(check_ref(r)) for r in refs]
    options = AuditOptions(gpu=gpu, gpus=gpus, context=context, engine=engine, rules_dirs=tuple(rules_dirs),
                           token=token, jobs=jobs, max_requests=max_requests, deadline_s=deadline_s, cache=cache,
                           endpoint=hub_endpoint(settings), settings=settings, engine_versions=versions)
    from ckptinspect.audit.gguf_quants import expand_gguf_quants, repo_files

    rows = expand_gguf_quants(run_audit(wanted, options, _audit_report),
                              lambda more: run_audit(more, options, _audit_report),
                              lambda repo: repo_files(repo, token=token, endpoint=options.endpoint, settings=settings))
    if verify_engine is None:
        return rows
    limit = deadline_s if deadline_s is not None else settings.deadline_s
    return _audit_verified(rows, verify_engine, engine_python, engine_pythonpath, token=token, settings=settings,
                           ends_at=started + limit)


def _audit_verified(rows: "Iterator[AuditRow]", engine: str, engine_python: str | None,
                    engine_pythonpath: str | None, *, token: str | None, settings: Settings,
                    ends_at: float) -> "Iterator[AuditRow]":
    """Every row, then one dry-load for all readable safetensors repos, then the rows it decided."""
    import copy
    import time

    from ckptinspect.audit.row import row_from_report
    from ckptinspect.errors import EngineEnvError
    from ckptinspect.render.findings import finding_json
    from ckptinspect.verify import verify_many
    from ckptinspect.verify.decide import apply_to_doc

    try:
        done = list(rows)
    finally:
        close = getattr(rows, "close", None)
        if close is not None:
            close()
    asked = [row for row in done if row.ok and row.fields.get("format") == "safetensors"]
    results: dict[str, Any] = {}
    if asked:
        left = ends_at - time.monotonic()
        if left <= 0:
            raise EngineEnvError(f"the audit's deadline passed before the {engine} dry-load could run",
                                 hint="--deadline SECONDS")
        answers = verify_many([row.repo for row in asked], engine, engine_python=engine_python,
                              engine_pythonpath=engine_pythonpath, deadline=left,
                              revisions=[row.revision for row in asked], token=token, settings=settings)
        results = {row.repo: answer for row, answer in zip(asked, answers)}
    for row in done:
        if not row.ok:
            yield row
            continue
        result = results.get(row.repo, f"{row.fields.get('format')} checkpoints are not dry-loaded by {engine}")
        doc = apply_to_doc(copy.deepcopy(dict(row.report)), {engine: result}, finding_json)
        yield row_from_report(row.repo, doc, cached=row.cached)


async def _audit_report(repo_id: str, options: dict) -> str:
    """One audit row's `report REPO --format json`, on the audit's loop (``inspect``'s stages; network
    reads under the audit's ``limiter`` and ``ends_at``)."""
    from ckptinspect.pipeline import build_report_async
    from ckptinspect.render.report import render_report

    ref, revision = normalize_ref(check_ref(repo_id), None)
    with _not_found_context(ref):
        report = await build_report_async(ref, rules_dirs=tuple(Path(d) for d in options["rules_dirs"]),
                                          revision=revision, token=options["token"],
                                          limiter=options.get("limiter"), ends_at=options.get("ends_at"),
                                          hub_only=options.get("listed", False), settings=options["settings"],
                                          engine_versions=options.get("engine_versions"))
    return render_report(_with_sections(report, ref, tp=None, ep=None, gpu=options["gpu"], gpus=options["gpus"],
                                        context=options["context"], engine=options["engine"]), "json")


def audit_sort(rows: "Sequence[AuditRow]", engine: str = "both") -> "list[AuditRow]":
    """``rows`` with the usable, fitting repos first (``audit.sort_key``)."""
    from ckptinspect.audit import sort_rows

    return sort_rows(list(rows), engine)


def audit_gate(row: "AuditRow", fail_on: str, engine: str = "both") -> list[str]:
    """What trips ``--fail-on`` for one audit row (empty: it passes); an unreadable repo always does."""
    from ckptinspect.audit import gate as row_gate

    return row_gate(row, fail_on, engine)


def __getattr__(name: str) -> Callable[..., object]:
    """``verify`` (docs/verify.md; the engine runs in its own Python) and ``check_probe_outputs`` (where the
    probe's outputs may go, checked before a probe runs), imported when first asked for: the commands that
    use them ask, a ``report`` never loads them."""
    if name == "verify":
        from ckptinspect.verify import verify_ref

        return verify_ref
    if name == "check_probe_outputs":
        from ckptinspect.snapshot_output import refuse_probe_outputs

        return refuse_probe_outputs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
