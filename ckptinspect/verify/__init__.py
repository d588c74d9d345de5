"""`ckptinspect verify`: the checkpoint's MTP draft dry-loaded through the installed engine's own code.

``verify_ref`` reads the checkpoint (headers only, any source), builds the request (request.py), runs the
engine's dry-load script in the engine's own Python (engine.py, engine_side/) and turns its answer into
a ``VerifyResult`` (records.py, outcome.py). docs/verify.md describes what runs and what is substituted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckptinspect.verify.records import OUTCOMES, ModuleOutcome, ParameterOutcome, StepOutcome, VerifyResult

if TYPE_CHECKING:
    from ckptinspect.settings import Settings

__all__ = ["OUTCOMES", "ModuleOutcome", "ParameterOutcome", "StepOutcome", "VerifyResult", "engine_version",
           "verify_many", "verify_ref"]


def engine_version(engine: str, *, engine_python: str | None = None, engine_pythonpath: str | None = None) -> str:
    """The version of ``engine`` the dry-load would run (its metadata, the engine not imported: a check of
    the environment before a long read); EngineEnvError when there is none."""
    from ckptinspect.errors import ConfigError
    from ckptinspect.verify.engine import SCRIPTS, engine_python as find_python, installed_version

    if engine not in SCRIPTS:
        raise ConfigError(f"--engine must be one of {', '.join(sorted(SCRIPTS))}, not {engine!r}")
    return installed_version(engine, find_python(engine, engine_python), pythonpath=engine_pythonpath)


def verify_ref(ref: str, engine: str, *, engine_python: str | None = None, engine_pythonpath: str | None = None,
               deadline: float | None = None, revision: str | None = None, token: str | None = None,
               progress: bool = False, method: str | None = None, trust_remote_code: bool = False,
               settings: "Settings | None" = None) -> VerifyResult:
    """``ref``'s draft dry-loaded by ``engine`` (docs/verify.md); EngineEnvError when there is no answer.
    ``settings`` (ckptinspect/settings.py): the Hub's limits, endpoint and caches for a repo id."""
    from ckptinspect.errors import ConfigError
    from ckptinspect.verify.engine import SCRIPTS

    if engine not in SCRIPTS:
        raise ConfigError(f"--engine must be one of {', '.join(sorted(SCRIPTS))}, not {engine!r}")
    return _run(engine, engine_python, engine_pythonpath, deadline,
                [dict(ref=ref, revision=revision, token=token, progress=progress, method=method,
                      trust_remote_code=trust_remote_code, settings=settings)],
                batch=False)[0]  # type: ignore[return-value]


def verify_many(refs: list[str], engine: str, *, engine_python: str | None = None,
                engine_pythonpath: str | None = None, deadline: float | None = None,
                methods: "list[str | None] | None" = None, revisions: "list[str | None] | None" = None,
                token: str | None = None, settings: "Settings | None" = None) -> list[VerifyResult | str]:
    """Each ref dry-loaded in ONE engine process (the engine imported once): its VerifyResult, or the one
    line of the error that stopped it (its checkpoint unreadable, or the script's own failure).
    ``methods``: the speculative method per ref (None: the engine script's default, SGLang NEXTN);
    ``revisions``: the commit to read for each ref (an audit's rows: the commit its report read)."""
    methods = methods if methods is not None else [None] * len(refs)
    revisions = revisions if revisions is not None else [None] * len(refs)
    return _run(engine, engine_python, engine_pythonpath, deadline,
                [dict(ref=ref, method=method, revision=rev, token=token, settings=settings)
                 for ref, method, rev in zip(refs, methods, revisions, strict=True)], batch=True)


def _run(engine: str, engine_python: str | None, engine_pythonpath: str | None, deadline: float | None,
         asks: list[dict], *, batch: bool) -> list[VerifyResult | str]:
    """Start the engine's script (it imports the engine meanwhile), read the checkpoints, send the jobs."""
    import time

    from ckptinspect.errors import CkptInspectError
    from ckptinspect.verify.engine import engine_python as find_python, finish_dryload, kill_dryload, start_dryload
    from ckptinspect.verify.outcome import result_from_answer

    python = find_python(engine, engine_python)
    started = time.perf_counter()
    proc = start_dryload(engine, python, pythonpath=engine_pythonpath)
    raws, jobs, errors = {}, [], {}
    try:
        for i, ask in enumerate(asks):
            try:
                raws[i], request = _request(**ask)
                jobs.append(request)
            except CkptInspectError as exc:
                if not batch:
                    raise
                errors[i] = str(exc)
    except BaseException:
        kill_dryload(proc)
        raise
    answer, seconds = finish_dryload(proc, engine, python, {"jobs": jobs} if batch else jobs[0],
                                     deadline=deadline, started=started)
    answers = iter(answer["results"] if batch else [answer])
    out: list[VerifyResult | str] = []
    for i in range(len(asks)):
        if i in errors:
            out.append(errors[i])
            continue
        one = next(answers)
        out.append(f"the {engine} dry-load script failed: {one['internal_error']}" if "internal_error" in one
                   else result_from_answer(raws[i].ref, raws[i].location, engine, python, one,
                                           seconds / max(1, len(jobs))))
    return out


def _request(ref: str, *, revision: str | None = None, token: str | None = None, progress: bool = False,
             method: str | None = None, trust_remote_code: bool = False, settings: "Settings | None" = None):
    """(RawCheckpoint, dry-load request) of ``ref``, headers only."""
    from ckptinspect.config.normalize import normalize_config
    from ckptinspect.errors import ConfigError
    from ckptinspect.gc_pause import gc_paused
    from ckptinspect.inventory.mtp_prefix import compile_prefixes
    from ckptinspect.progress import as_progress
    from ckptinspect.readiness import GENERIC_MTP_PREFIXES, load_rules
    from ckptinspect.refs import check_ref
    from ckptinspect.sources import open_source
    from ckptinspect.verify.request import build_request

    status = as_progress(progress, label=ref)
    try:
        raw = open_source(check_ref(ref), revision=revision, token=token, progress=status, settings=settings)
    finally:
        status.end()
    if getattr(raw, "format", None) == "gguf":
        raise ConfigError("verify dry-loads safetensors checkpoints through SGLang / vLLM; this is GGUF",
                          path=raw.location)
    from ckptinspect.header.index import PARAMS, is_mistral_format

    if PARAMS in raw.json_files and is_mistral_format(raw.files):
        # the dry-load hands the engine config.json and Hugging Face names; vLLM reads this checkpoint from
        # params.json and consolidated*.safetensors instead (header/index.py), which it does not model yet
        raise ConfigError("is in Mistral's format (params.json, consolidated*.safetensors), which verify's dry-load "
                          "does not model yet; `ckptinspect report` reads it as vLLM does", path=raw.location)
    if "config.json" not in raw.json_files:
        raise ConfigError("no config.json in the checkpoint", path=raw.location)
    config = normalize_config(raw.json_files["config.json"], source=f"{raw.location}/config.json")
    # the MTP prefix templates the report's inventory uses (ckptinspect/pipeline.py checkpoint_from_raw)
    family = load_rules(()).match(config)
    templates = family.mtp_prefixes if family is not None else GENERIC_MTP_PREFIXES
    prefixes = compile_prefixes(tuple(templates), config.num_hidden_layers)
    with gc_paused():  # ~371k names and kinds of a 400B-class checkpoint: acyclic (gc_pause.py)
        request = build_request(raw, prefixes, config.num_hidden_layers, method=method,
                                trust_remote_code=trust_remote_code)
    return raw, request
