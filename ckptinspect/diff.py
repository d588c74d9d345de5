"""Compare two checkpoints (typically a BF16 original and its quantized export).

Works on modules, not tensors: a quantized export renames or adds parameters (``weight_packed``,
``weight_scale``, ...) but keeps module names, so modules are matched by (module pattern, leading
index) and summarised per pattern (``model.layers.{}.mlp.experts.{}.down_proj``) with the layers
they occur in. Reports scheme changes, modules that disappeared (above all the MTP layer) or
appeared, declared exclude-list differences and the size change. Rendering: render/diff_out.py;
loading both checkpoints: ckptinspect.api.diff.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Iterable

from ckptinspect.records import VERDICT_RANK, Checkpoint, Finding, MtpAssessment, TensorGroup

_WEIGHT_ROLES = ("weight", "other")


@dataclass(frozen=True)
class ModuleState:
    component: str
    scheme: str
    tensors: int
    bytes: int
    params: int
    mtp: bool


@dataclass(frozen=True)
class PatternChange:
    """One module pattern whose state differs between A and B, over the layers listed."""

    component: str
    module: str  # pattern with {} for numeric segments
    layers: tuple[int, ...]  # leading indices (decoder / MTP layer); empty for non-layer modules
    before: str | None  # scheme in A (None: absent from A)
    after: str | None  # scheme in B (None: absent from B)
    bytes_a: int
    bytes_b: int
    mtp: bool


@dataclass(frozen=True)
class Side:
    ref: str
    family: str | None
    label: str | None  # declared quantization label
    tensors: int
    params: int
    bytes: int
    mtp_layers: int
    mtp_tensors: int
    mtp_bytes: int
    excludes: tuple[str, ...]


@dataclass(frozen=True)
class CheckpointDiff:
    a: Side
    b: Side
    scheme_changes: tuple[PatternChange, ...]
    removed: tuple[PatternChange, ...]
    added: tuple[PatternChange, ...]
    excludes_only_a: tuple[str, ...]
    excludes_only_b: tuple[str, ...]
    findings: tuple[Finding, ...]

    @property
    def bytes_delta(self) -> int:
        return self.b.bytes - self.a.bytes


def canonical_module(g: TensorGroup) -> str:
    """Routed experts compare as one ``...experts`` container per layer, so per-expert
    (``experts.{}.down_proj``) and grouped (``experts.down_proj``) storage are the same module."""
    if g.component == "routed_expert":
        cut = g.module.find(".experts")
        if cut >= 0:
            return g.module[: cut + len(".experts")]
    return g.module


def module_states(groups: Iterable[TensorGroup]) -> dict[tuple[str, int | None], ModuleState]:
    """(module pattern, index) -> state; the scheme is the weights', sizes include companions."""
    acc: dict[tuple[str, int | None], dict[str, Any]] = {}
    for g in groups:
        key = (canonical_module(g), g.index)
        st = acc.setdefault(key, {"component": g.component, "schemes": set(), "fallback": g.scheme, "tensors": 0,
                                  "bytes": 0, "params": 0, "mtp": False})
        st["tensors"] += g.tensors
        st["bytes"] += g.bytes
        st["params"] += g.params
        st["mtp"] = st["mtp"] or g.mtp_layer is not None
        if g.role in _WEIGHT_ROLES:
            st["schemes"].add(g.scheme)
    return {k: ModuleState(component=v["component"], scheme="/".join(sorted(v["schemes"])) or v["fallback"],
                           tensors=v["tensors"], bytes=v["bytes"], params=v["params"], mtp=v["mtp"])
            for k, v in acc.items()}


def _summarise(items: list[tuple[tuple[str, int | None], ModuleState | None, ModuleState | None]]) -> list[PatternChange]:
    buckets: dict[tuple[Any, ...], dict[str, Any]] = defaultdict(lambda: {"layers": set(), "a": 0, "b": 0})
    for (module, index), sa, sb in items:
        ref = sa or sb
        assert ref is not None
        key = (ref.component, module, sa.scheme if sa else None, sb.scheme if sb else None, ref.mtp)
        bucket = buckets[key]
        if index is not None:
            bucket["layers"].add(index)
        bucket["a"] += sa.bytes if sa else 0
        bucket["b"] += sb.bytes if sb else 0
    out = [PatternChange(component=k[0], module=k[1], layers=tuple(sorted(v["layers"])), before=k[2], after=k[3],
                         bytes_a=v["a"], bytes_b=v["b"], mtp=k[4]) for k, v in buckets.items()]
    return sorted(out, key=lambda c: (not c.mtp, -(c.bytes_a + c.bytes_b), c.module))


def _side(ck: Checkpoint, mtp: MtpAssessment | None) -> Side:
    excludes = tuple(sorted({e for lst in ck.declared.excludes for e in lst.entries}))
    return Side(ref=ck.ref, family=ck.family, label=ck.declared.label, tensors=ck.inventory.totals.tensors,
                params=ck.inventory.totals.params, bytes=ck.inventory.totals.bytes,
                mtp_layers=mtp.present_layers if mtp else len({g.mtp_layer for g in ck.inventory.mtp_groups()}),
                mtp_tensors=sum(g.tensors for g in ck.inventory.mtp_groups()),
                mtp_bytes=sum(g.bytes for g in ck.inventory.mtp_groups()), excludes=excludes)


def diff_checkpoints(a: Checkpoint, b: Checkpoint, mtp_a: MtpAssessment | None = None,
                     mtp_b: MtpAssessment | None = None) -> CheckpointDiff:
    """Compare ``a`` (reference, e.g. BF16) with ``b`` (e.g. its quant)."""
    sa, sb = module_states(a.inventory.groups), module_states(b.inventory.groups)
    changed = [(k, sa[k], sb[k]) for k in sa.keys() & sb.keys() if sa[k].scheme != sb[k].scheme]
    # Sorted, not set order: the first removed MTP module is quoted in a finding, and set order of
    # strings changes with PYTHONHASHSEED, so the message changed from run to run.
    removed = [(k, sa[k], None) for k in sorted(sa.keys() - sb.keys(), key=_module_key)]
    added = [(k, None, sb[k]) for k in sorted(sb.keys() - sa.keys(), key=_module_key)]
    side_a, side_b = _side(a, mtp_a), _side(b, mtp_b)
    only_a = tuple(e for e in side_a.excludes if e not in set(side_b.excludes))
    only_b = tuple(e for e in side_b.excludes if e not in set(side_a.excludes))
    findings = _findings(side_a, side_b, removed) + _readiness_findings(mtp_a, mtp_b)
    return CheckpointDiff(a=side_a, b=side_b, scheme_changes=tuple(_summarise(changed)),
                          removed=tuple(_summarise(removed)), added=tuple(_summarise(added)),
                          excludes_only_a=only_a, excludes_only_b=only_b, findings=tuple(findings))


def _module_key(key: tuple[str, int | None]) -> tuple[str, int]:
    return key[0], -1 if key[1] is None else key[1]


def _findings(a: Side, b: Side, removed: list[Any]) -> list[Finding]:
    out = []
    if a.mtp_layers and not b.mtp_layers:
        out.append(Finding("mtp-dropped", "error",
                           f"B has no MTP layer although A ships {a.mtp_layers} ({a.mtp_tensors} tensors, "
                           f"{a.mtp_bytes:,} bytes); speculative decoding with B would draft from missing weights",
                           hint="graft A's MTP tensors into B and add their prefix to B's exclude list",
                           reference="mtp_families.md D1"))
    elif b.mtp_layers < a.mtp_layers:
        out.append(Finding("mtp-layers-dropped", "warning",
                           f"B ships {b.mtp_layers} MTP layer(s), A {a.mtp_layers}"))
    mtp_removed = [k for k, sa_, _ in removed if sa_ is not None and sa_.mtp]
    if b.mtp_layers and mtp_removed:
        out.append(Finding("mtp-modules-dropped", "error",
                           f"{len(mtp_removed)} MTP module(s) of A are missing from B (e.g. {mtp_removed[0][0]})",
                           hint="re-export B with the complete MTP layer"))
    if a.family != b.family:
        out.append(Finding("family-differs", "warning", f"A matches family {a.family}, B {b.family}"))
    return out


def _readiness_findings(mtp_a: MtpAssessment | None, mtp_b: MtpAssessment | None) -> list[Finding]:
    """What B's own report says about its MTP layer, carried into the diff: a quant that re-quantized
    the MTP layer keeps every module (nothing disappears) yet no engine can use it, and a
    `diff --fail-on error` gate must trip on that exactly as `report --fail-on error` on B does.
    Each engine whose verdict got worse from A to B is a finding (an error when B is unusable), and
    B's error findings about the MTP layer are repeated with their engine, prefixed "B:"."""
    if mtp_b is None:
        return []
    out: list[Finding] = []
    for engine, vb in sorted(mtp_b.verdicts.items()):
        va = mtp_a.verdicts.get(engine) if mtp_a is not None else None
        if va is None or VERDICT_RANK[vb.verdict] <= VERDICT_RANK[va.verdict]:
            continue
        because = f" (because: {', '.join(vb.reasons)})" if vb.reasons else ""
        out.append(Finding("mtp-verdict-worse", "error" if vb.verdict == "unusable" else "warning",
                           f"{engine} MTP verdict {va.verdict.upper()} on A, {vb.verdict.upper()} on B{because}",
                           engine=engine, hint=f"run `ckptinspect report` on B for the {engine} findings"))
    if not mtp_b.present_layers:
        return out  # no MTP layer in B: mtp-dropped already says it, B's own errors only restate it
    a_errors = {(f.code, f.engine) for f in (mtp_a.findings if mtp_a is not None else ()) if f.severity == "error"}
    for f in mtp_b.findings:
        if f.severity == "error":
            also = " (A has it too)" if (f.code, f.engine) in a_errors else ""
            out.append(replace(f, message=f"B: {f.message}{also}"))
    return out
