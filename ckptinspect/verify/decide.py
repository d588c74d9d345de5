"""The engine's own dry-load next to the rules' verdict (`report` / `audit --verify-engine`): one truth.

Where the dry-load ran for the engine version the rules judged, it decides that engine's verdict: a draft
that ``loads`` is ``ready`` / ``degraded`` (the rules' grade kept when they agree, else ``ready``); one with
``defects``, that raised (``load failed``) or that is the target model itself (``target copy``) is
``unusable`` (``absent`` kept when the rules found no MTP layer). When the rules said otherwise, the
report says so in a ``rules-disagree-with-engine`` warning naming the modules, never silently and never as
two verdicts. Where the dry-load could not decide (the
engine refused this machine, a step could not run here, the checkpoint could not be offered to it, or the
installed version is not the one the rules judged), the verdict stays the rules' and the report says
"not decided by the engine: <why>" (an ``engine-check-not-decided`` info finding).

One function decides (``engine_check``); ``apply_to_report`` puts it in a pipeline.Report and
``apply_to_doc`` in a report JSON document (an audit row's, which may come from the audit cache), with
the same finding either way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from ckptinspect.records import Finding
from ckptinspect.verify.records import VerifyResult

# dry-load outcome -> the rules' verdicts that say the same; a ``target copy`` (the engine built the target
# model itself as the draft, no MTP tensor in it) loads, but it is no MTP head: nothing to serve as one
AGREEING = {"loads": ("ready", "degraded"), "target copy": ("unusable", "absent"),
            "defects": ("unusable", "absent"), "load failed": ("unusable", "absent")}
DISAGREE_CODE = "rules-disagree-with-engine"
NOT_DECIDED_CODE = "engine-check-not-decided"
REFERENCE = "docs/verify.md"


@dataclass(frozen=True)
class EngineCheck:
    """One engine's dry-load for a report, and what it decided."""

    engine: str
    engine_version: str | None  # the installed engine's version (None: the dry-load gave no answer)
    outcome: str | None  # VerifyResult.outcome; None when this checkpoint had no dry-load answer
    decided: bool  # the dry-load decides the verdict
    rules_verdict: str  # the rules' verdict for this engine and version
    verdict: str  # the verdict the report shows: the dry-load's where decided, else the rules'
    agrees: bool | None  # None when not decided
    not_decided: str | None  # why the engine did not decide
    modules: tuple[str, ...]  # what the dry-load (or, when it loads, the rules) found wrong, by module
    seconds: float | None

    def line(self) -> str:
        """The one line text / markdown show for this engine."""
        name = f"{self.engine} {self.engine_version}" if self.engine_version else self.engine
        if not self.decided:
            return f"not decided by the engine: {self.not_decided}; verdict {self.verdict} from the rules"
        where = f" ({', '.join(self.modules[:3])}{', ...' if len(self.modules) > 3 else ''})" if self.modules else ""
        if self.agrees:
            return f"{name} dry-load: {self.outcome}{where}; verdict {self.verdict}, the rules agree"
        return (f"{name} dry-load: {self.outcome}{where}; verdict {self.verdict} from the engine "
                f"(the rules said {self.rules_verdict}: {DISAGREE_CODE})")


def not_decided(engine: str, rules_verdict: str, why: str) -> EngineCheck:
    return EngineCheck(engine=engine, engine_version=None, outcome=None, decided=False, rules_verdict=rules_verdict,
                       verdict=rules_verdict, agrees=None, not_decided=why, modules=(), seconds=None)


def engine_check(engine: str, rules_verdict: str, rules_version: str | None, result: VerifyResult | str, *,
                 rules_modules: Sequence[str] = ()) -> EngineCheck:
    """The decision for one engine: ``result`` is its dry-load (or the one line of why this checkpoint had
    none); ``rules_modules`` the modules the rules found this engine builds unlike stored (named when the
    rules say unusable and the engine loads the draft)."""
    if isinstance(result, str):
        return not_decided(engine, rules_verdict, result)
    if result.outcome not in AGREEING:
        failed = [s for s in result.steps if not s.ok]
        why = "; ".join(f"{s.step}: {s.error}" for s in failed) or "the dry-load stopped before loading"
        if any(s.platform for s in failed):
            why = f"the engine refused this machine ({why})"
        return replace(not_decided(engine, rules_verdict, why), engine_version=result.engine_version,
                       outcome=result.outcome, seconds=result.seconds)
    if rules_version is not None and result.engine_version != rules_version:
        why = (f"the dry-load ran {engine} {result.engine_version}, the rules answered for {engine} {rules_version}")
        return replace(not_decided(engine, rules_verdict, why), engine_version=result.engine_version,
                       outcome=result.outcome, seconds=result.seconds)
    agrees = rules_verdict in AGREEING[result.outcome]
    if agrees:
        verdict = rules_verdict
    else:
        verdict = "ready" if result.outcome == "loads" else "unusable"
    return EngineCheck(engine=engine, engine_version=result.engine_version, outcome=result.outcome, decided=True,
                       rules_verdict=rules_verdict, verdict=verdict, agrees=agrees, not_decided=None,
                       modules=_modules(result) or (() if agrees else tuple(rules_modules)), seconds=result.seconds)


def target_copy_line(result: VerifyResult) -> str:
    """What a ``target copy`` outcome means, in one line (the report's module entry, verify's text)."""
    return (f"draft is the target model, not an MTP head: {result.engine} built {result.draft_class or '-'} (the "
            f"target's own architecture {', '.join(result.target_architectures)}) as the draft, "
            f"{len(result.other_tensors_loaded):,} of the target's tensors loaded into it, 0 MTP tensors")


def _modules(result: VerifyResult) -> tuple[str, ...]:
    """Where the dry-load went wrong: the parameters mis-loaded or never loaded, else the step that raised;
    for a target copy, that the draft is the target model."""
    if result.outcome == "target copy":
        return (target_copy_line(result),)
    bad = tuple(f"{m.module}.{p.name}: {p.status}" for m in result.modules for p in m.parameters
                if p.status in ("mismatch", "never loaded"))
    if bad:
        return bad
    return tuple(f"{s.step}: {s.error}" + (f" at {s.where}" if s.where else "")
                 + (f" loading {s.tensor}" if s.tensor else "") for s in result.steps if not s.ok)


def finding(check: EngineCheck, reasons: Sequence[str] = ()) -> Finding | None:
    """The finding a check adds to the report: the rules' disagreement (warning) or why it is not decided
    (info); None when the dry-load agrees with the rules."""
    if not check.decided:
        return Finding(code=NOT_DECIDED_CODE, severity="info", engine=check.engine,
                       message=f"not decided by the engine: {check.not_decided}; the verdict is the rules' "
                               f"({check.verdict})", reference=REFERENCE)
    if check.agrees:
        return None
    because = f" ({', '.join(reasons)})" if reasons else ""
    shown = "; ".join(check.modules[:4]) + (f"; and {len(check.modules) - 4} more" if len(check.modules) > 4 else "")
    return Finding(code=DISAGREE_CODE, severity="warning", engine=check.engine,
                   subject=", ".join(m.split(":", 1)[0] for m in check.modules[:4]) or None,
                   message=f"the rules say {check.rules_verdict}{because} for {check.engine} {check.engine_version}, "
                           f"its own dry-load says {check.outcome}" + (f": {shown}" if shown else "") +
                           f"; the verdict follows the dry-load ({check.verdict})", reference=REFERENCE)


def check_json(check: EngineCheck) -> dict[str, Any]:
    """``mtp.engines.<engine>.dry_load`` of the report JSON (render/report.schema.json)."""
    return {"decided": check.decided, "engine_version": check.engine_version, "outcome": check.outcome,
            "rules_verdict": check.rules_verdict, "agrees": check.agrees, "not_decided": check.not_decided,
            "modules": list(check.modules), "seconds": check.seconds, "line": check.line()}


def _misfits(modules: Sequence[Any], engine: str) -> tuple[str, ...]:
    return tuple(m.module for m in modules if not m.matches.get(engine, True))


def apply_to_report(report: Any, results: Mapping[str, VerifyResult | str]) -> Any:
    """``report`` (a pipeline.Report) with each engine's dry-load deciding, as the module docstring says."""
    mtp = report.mtp
    if mtp is None:
        return report
    verdicts, findings, checks = dict(mtp.verdicts), list(mtp.findings), []
    for engine, result in results.items():
        rules = verdicts.get(engine)
        if rules is None:
            continue
        check = engine_check(engine, rules.verdict, rules.engine_version, result,
                             rules_modules=_misfits(mtp.modules, engine))
        checks.append(check)
        verdicts[engine] = replace(rules, verdict=check.verdict, reasons=_reasons(check, rules.reasons))
        extra = finding(check, rules.reasons)
        if extra is not None:
            findings.append(extra)
    return replace(report, mtp=replace(mtp, verdicts=verdicts, findings=tuple(findings)),
                   engine_checks=tuple(checks))


def apply_to_doc(doc: dict[str, Any], results: Mapping[str, VerifyResult | str],
                 finding_json: Callable[[Finding], dict[str, Any]]) -> dict[str, Any]:
    """A report JSON document (an audit row's) with each engine's dry-load deciding: ``mtp.verdict``,
    ``mtp.engines.<engine>`` (``verdict``, ``basis``, ``dry_load``) and the finding, as ``apply_to_report``
    and render/json_out.py give them for a report (``finding_json``: render/findings.py's, passed in: the
    renderers import this module, not the other way)."""
    mtp = doc.get("mtp") or {}
    engines = mtp.get("engines") or {}
    for engine, result in results.items():
        entry = engines.get(engine)
        if entry is None:
            continue
        misfits = tuple(m["module"] for m in mtp.get("modules", ())
                        if not m["engines"].get(engine, {}).get("matches_stored", True))
        check = engine_check(engine, entry["verdict"], entry.get("engine_version"), result, rules_modules=misfits)
        extra = finding(check, entry.get("reasons", ()))
        mtp["verdict"][engine] = check.verdict
        engines[engine] = {**entry, **engine_json(check), "reasons": list(_reasons(check, entry.get("reasons", ())))}
        if extra is not None:
            doc["findings"].append(finding_json(extra))
    return doc


def _reasons(check: EngineCheck, reasons: Sequence[str]) -> tuple[str, ...]:
    """The verdict's reasons: the rules' where they agree or did not decide; the dry-load's finding where
    it overruled them (the rules' reasons are then in that finding's message)."""
    return (DISAGREE_CODE,) if check.decided and not check.agrees else tuple(reasons)


def engine_json(check: EngineCheck) -> dict[str, Any]:
    """The keys a check sets in ``mtp.engines.<engine>``."""
    return {"verdict": check.verdict, "basis": "engine" if check.decided else "rules", "dry_load": check_json(check)}
