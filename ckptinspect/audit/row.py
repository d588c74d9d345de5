"""One row of an audit: what someone choosing among a base model's quants compares, read from that
repo's own `report --format json` document (never recomputed here, so a row always says what `report`
says), or the one-line error that stopped the repo's report.

Rows are plain frozen records; render/audit_out.py lays them out. ``sort_key`` puts the usable, fitting
quants first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ckptinspect.records import VERDICT_RANK

SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class RepoError:
    """Why a repo has no report: ``kind`` is the exception class (AccessError, NotFoundError,
    NetworkError, HeaderError, ConfigError, ...), ``message`` the one line `report` would print."""

    kind: str
    message: str


@dataclass(frozen=True)
class AuditRow:
    """One repo of an audit. ``report`` is the repo's `report --format json` document (without its
    per-run ``source.stats``) or None when ``error`` says why there is none."""

    repo: str
    revision: str | None  # the commit the report read (the listing's sha when the report failed)
    error: RepoError | None = None
    report: Mapping[str, Any] | None = None
    cached: bool = False  # the report came from the audit cache (same commit, code, rules, options)
    fields: Mapping[str, Any] = field(default_factory=dict)  # row_fields(report), empty on error

    @property
    def ok(self) -> bool:
        return self.error is None


def row_from_report(repo: str, doc: Mapping[str, Any], *, cached: bool = False) -> AuditRow:
    return AuditRow(repo=repo, revision=doc["source"].get("revision"), report=doc, cached=cached,
                    fields=row_fields(doc))


def error_row(repo: str, revision: str | None, exc: BaseException | RepoError) -> AuditRow:
    err = exc if isinstance(exc, RepoError) else RepoError(type(exc).__name__, " ".join(str(exc).split()))
    return AuditRow(repo=repo, revision=revision, error=err)


def row_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The compared columns, each taken from the report document as is."""
    quant, mtp, totals = doc["quantization"], doc["mtp"], doc["totals"]
    files = doc["shards"]["files"]
    schemes = quant["schemes"]
    stored = sorted(schemes, key=lambda k: (-schemes[k]["bytes"], k))  # largest share of bytes first
    findings = sorted(doc["findings"], key=lambda f: SEVERITY_RANK.get(f["severity"], 9))
    worst = findings[0] if findings else None
    return {
        "format": doc.get("format") or _format(files),  # the report's own key where it has one
        "declared": quant["declared"],
        "stored_schemes": stored,
        "stored_shares": {k: schemes[k]["bytes"] for k in stored},  # bytes per scheme (the quant column)
        "bytes": totals["bytes"],
        "params": totals["params"],
        "family": doc["model"]["family"],
        "mtp_declared": mtp["declared_layers"],
        "mtp_present": mtp["present_layers"],
        "mtp_complete": mtp["complete"],
        "mtp_schemes": sorted(mtp["schemes"]),
        "verdicts": dict(mtp["verdict"]),
        # --verify-engine: each dry-load's answer as the report gives it (verify/decide.py)
        "engine_checks": {e: v["dry_load"] for e, v in (mtp.get("engines") or {}).items() if "dry_load" in v},
        "errors": sum(1 for f in doc["findings"] if f["severity"] == "error"),
        "worst_finding": None if worst is None else {k: worst[k] for k in ("code", "severity", "message")},
        "fit": _fit(doc.get("plan")),
    }


def _format(files: list[str]) -> str:
    suffixes = {f.rsplit(".", 1)[-1].lower() for f in files if "." in f}
    if not files:
        return "none"
    return "+".join(sorted(suffixes)) if len(suffixes) > 1 else next(iter(suffixes))


def _fit(plan: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """None without --gpu/--gpus; else whether the requested context runs on the GPUs given, how many the
    plan uses and the fewest known to hold it, never more than it uses. A plan that loads only at a
    context the max-context solver cut down does not fit. A GGUF's plan is llama.cpp's: it fits when
    every block is on the GPUs."""
    if plan is None:
        return None
    if plan.get("engine") == "llamacpp":
        return _gguf_fit(plan)
    gpu = plan["gpu"]["name"]
    if plan["status"] != "ok":
        return {"fits": False, "gpu": gpu, "gpus": plan["gpus"], "gpus_used": None, "min_gpus": None,
                "reason": plan.get("reason")}
    least = (plan.get("min_gpus") or {}).get("count")  # the fewest GPUs holding it at default settings
    used = plan["gpus_used"]
    requested, context = plan.get("requested_context") or plan["context"], plan["context"]
    solver = (plan.get("max_context") or {}).get("chosen")
    if context < requested:
        return {"fits": False, "gpu": gpu, "gpus": plan["gpus"], "gpus_used": used, "min_gpus": least,
                "reason": f"only a {context:,}-token context fits on {used} (requested {requested:,})"}
    if least is not None and least <= used:
        return {"fits": True, "gpu": gpu, "gpus": plan["gpus"], "gpus_used": used, "min_gpus": least, "reason": None}
    # the requested context runs on `used` GPUs only with the max-context solver's step (main printed
    # "yes, 4 used, min 8": min_gpus counts default settings); no smaller count was tried with that step
    return {"fits": True, "gpu": gpu, "gpus": plan["gpus"], "gpus_used": used, "min_gpus": used,
            "reason": f"with the max-context solver's '{solver}' settings (default settings need "
                      f"{least if least is not None else 'more'} GPUs)"}


def _gguf_fit(plan: Mapping[str, Any]) -> dict[str, Any]:
    on_gpu, total = plan["gpu_layers"], plan["total_layers"]
    whole = on_gpu >= total
    return {"fits": whole, "gpu": plan["gpu"], "gpus": plan["gpus"], "gpus_used": plan["gpus"], "min_gpus": None,
            "reason": None if whole else f"llama.cpp offloads {on_gpu} of {total} blocks; the rest run on the CPU"}


def judged(verdicts: Mapping[str, str], engine: str) -> tuple[str, ...]:
    """The engines ``engine`` names for a report: "both" is every engine the report judged (SGLang and
    vLLM for safetensors; a report may judge others), as `report --fail-on` reads it."""
    return tuple(verdicts) if engine == "both" else (engine,)


def best_verdict(row: AuditRow, engine: str = "both") -> str | None:
    """The best MTP verdict among the engines ``engine`` names; None when none of them was judged."""
    if not row.ok:
        return None
    verdicts = row.fields["verdicts"]
    ranked = [verdicts[e] for e in judged(verdicts, engine) if e in verdicts]
    return min(ranked, key=lambda v: VERDICT_RANK[v]) if ranked else None


def sort_key(row: AuditRow, engine: str = "both") -> tuple:
    """Usable (read, no error finding) and fitting first, then the best MTP verdict, the smallest
    checkpoint; repos that could not be read last; the repo id breaks ties."""
    if not row.ok:
        return (3, 0, 0, 0, row.repo)
    f = row.fields
    fit = f["fit"]
    tier = 2 if f["errors"] else (0 if fit is None or fit["fits"] else 1)
    verdict = best_verdict(row, engine)
    rank = VERDICT_RANK[verdict] if verdict is not None else max(VERDICT_RANK.values()) + 1  # not judged: last
    return (tier, rank, (fit or {}).get("min_gpus") or 0, f["bytes"], row.repo)


def sort_rows(rows: list[AuditRow], engine: str = "both") -> list[AuditRow]:
    return sorted(rows, key=lambda r: sort_key(r, engine))


def gate(row: AuditRow, fail_on: str, engine: str = "both") -> list[str]:
    """What trips ``--fail-on`` for one row, as `report --fail-on` decides it from the same document
    (``engine=verdict`` at or past ``fail_on``, or the codes of error findings); a repo that could not
    be read always trips it (an organization's CI must not pass a quant nobody could read)."""
    if not row.ok:
        return [f"unreadable ({row.error.kind})"]
    doc = row.report
    # the drafts a family declares in subfolders and the repo ships (mtp.drafts[]), as api.gate gates them
    drafts = [d for d in (doc.get("mtp") or {}).get("drafts", ()) if d["status"] == "present"]
    if fail_on == "error":
        return [f["code"] for f in doc["findings"] if f["severity"] == "error"] + [
            f"{f['code']} ({d['subfolder']}/)" for d in drafts for f in d["findings"] if f["severity"] == "error"]
    threshold = VERDICT_RANK[fail_on]
    verdicts = doc["mtp"]["verdict"]
    engines = judged(verdicts, engine)
    missing = [e for e in engines if e not in verdicts]
    if missing:  # `report --fail-on` refuses this too: never a silent pass
        return [f"no {missing[0]} verdict (judged: {', '.join(verdicts)})"]
    return [f"{e}={verdicts[e]}" for e in engines if VERDICT_RANK[verdicts[e]] >= threshold] + [
        f"{d['subfolder']}/ {e}={d['verdict'][e]}" for d in drafts for e in engines
        if e in d["verdict"] and VERDICT_RANK[d["verdict"][e]] >= threshold]
