"""The report pipeline: source -> headers -> inventory -> quantization -> rules -> (plan), for every
format: a safetensors checkpoint and a GGUF model take the same stages into the same records (GGUF
metadata stands in for config.json: config/gguf_config.py; its tensor infos for safetensors headers:
inventory/gguf_inventory.py; ``general.file_type`` for the declared quantization), and only the MTP
verdict differs: rules/engines/llamacpp.yaml (readiness/gguf_mtp.py) instead of the family rules, which
describe safetensors layouts.

``build_report`` opens the source from synchronous code; ``build_report_async`` is the same report for a
caller on an event loop (the audit: its repos' reads share that loop).

Never imports torch or transformers: ``tests/test_report.py`` (test_report_never_imports_torch_or_transformers) proves it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ckptinspect.config.mistral_params import adapt_params
from ckptinspect.config.normalize import normalize_config
from ckptinspect.config.quant_fields import check_quant_fields
from ckptinspect.errors import ConfigError
from ckptinspect.header.index import PARAMS, is_mistral_format
from ckptinspect.header.parser import parse_header
from ckptinspect.inventory.build import build_inventory
from ckptinspect.inventory.mtp_prefix import compile_prefixes
from ckptinspect.inventory.scan import ShardScan, scan_checkpoint
from ckptinspect.progress import SILENT, Progress, as_progress
from ckptinspect.quant.crosscheck import crosscheck
from ckptinspect.quant.declared import matcher_for, read_declared
from ckptinspect.records import (Checkpoint, DraftAssessment, EngineVerdict, Finding, IndexSummary, Inventory, ModelConfig, MtpAssessment,
                                 RawCheckpoint, TensorGroup)
from ckptinspect.settings import Settings
from ckptinspect.sources import open_source, open_source_async
from ckptinspect.sources.interface import CONFIG, HF_QUANT_CONFIG, INDEX, PICKLE_SUFFIXES, QUANT_MODEL_DESCRIPTION


@dataclass(frozen=True)
class Report:
    """Everything `report` renders."""

    checkpoint: Checkpoint
    mtp: MtpAssessment | None
    plan: Any = None  # ckptinspect.plan.Plan when --gpu/--gpus were given
    mtp_costs: tuple[Any, ...] = field(default_factory=tuple)
    # a GGUF's NextN head shipped in a companion mtp-*.gguf: its tensor groups (companion_head_groups), which
    # the checkpoint's inventory (the model's own files) does not hold
    head_groups: tuple[Any, ...] = field(default_factory=tuple)
    # stand-alone drafts the family declares in subfolders (rules: draft_subfolders), read with the checkpoint
    drafts: tuple[DraftAssessment, ...] = field(default_factory=tuple)
    # report --verify-engine: each engine's dry-load and what it decided (verify/decide.py EngineCheck)
    engine_checks: tuple[Any, ...] = field(default_factory=tuple)


def load_checkpoint(ref: str, *, rules_dirs: Sequence[Path] = (), revision: str | None = None,
                    token: str | None = None, progress: Progress | bool = True,
                    settings: Settings | None = None) -> Checkpoint:
    """Open ``ref`` (directory, snapshot, repo id) and build its Checkpoint (``progress``: ckptinspect/progress.py)."""
    progress = as_progress(progress, label=ref)
    raw = _open(ref, revision=revision, token=token, progress=progress, settings=settings)
    if getattr(raw, "format", None) == "gguf":
        return checkpoint_from_gguf(raw)
    checkpoint, _ = checkpoint_from_raw(raw, rules_dirs=rules_dirs, progress=progress)
    return checkpoint


def _open(ref: str, *, revision: str | None, token: str | None, progress: Progress,
          settings: Settings | None = None, subfolders: Any = None) -> Any:
    """open_source, with the progress line ended when the source fails (a scan that runs ends it itself)."""
    try:
        return open_source(ref, revision=revision, token=token, progress=progress, settings=settings,
                           subfolders=subfolders)
    except BaseException:
        progress.end()
        raise


def build_report(ref: str, *, rules_dirs: Sequence[Path] = (), revision: str | None = None,
                 token: str | None = None, progress: Progress | bool = True,
                 engine_versions: Mapping[str, str] | None = None, settings: Settings | None = None) -> Report:
    """Checkpoint plus its MTP assessment: the source's read, then the stages (checkpoint_from_raw);
    ``settings`` (ckptinspect/settings.py): the Hub's limits, endpoint and caches, when ``ref`` is read from
    the network (None: every default, no cache)."""
    progress = as_progress(progress, label=ref)
    rules = RulesOnce(rules_dirs)
    raw = _open(ref, revision=revision, token=token, progress=progress, settings=settings,
                subfolders=draft_subfolder_chooser(rules))
    if getattr(raw, "format", None) == "gguf":
        return gguf_report(raw)
    return report_from_raw(raw, rules_dirs=rules_dirs, progress=progress, engine_versions=engine_versions,
                           rules=rules)


async def build_report_async(ref: str, *, rules_dirs: Sequence[Path] = (), revision: str | None = None,
                             token: str | None = None, limiter: Any = None, ends_at: float | None = None,
                             hub_only: bool = False, settings: Settings | None = None,
                             engine_versions: Mapping[str, str] | None = None) -> Report:
    """``build_report`` on the caller's event loop (no progress line): the source's network reads are
    awaited there under ``limiter`` and ``ends_at`` (sources.open_source_async); the stages after it run
    as they do in ``build_report``."""
    rules = RulesOnce(rules_dirs)
    raw = await open_source_async(ref, revision=revision, token=token, limiter=limiter, ends_at=ends_at,
                                  hub_only=hub_only, settings=settings, subfolders=draft_subfolder_chooser(rules))
    if getattr(raw, "format", None) == "gguf":
        return gguf_report(raw)
    return report_from_raw(raw, rules_dirs=rules_dirs, engine_versions=engine_versions, rules=rules)


def gguf_report(raw: Any) -> Report:
    checkpoint = checkpoint_from_gguf(raw)
    mtp = assess_gguf(checkpoint, raw)
    return Report(checkpoint=checkpoint, mtp=mtp, head_groups=companion_head_groups(checkpoint, raw, mtp))


def report_from_raw(raw: RawCheckpoint, *, rules_dirs: Sequence[Path] = (), progress: Progress = SILENT,
                    engine_versions: Mapping[str, str] | None = None, rules: "RulesOnce | None" = None) -> Report:
    checkpoint, (ruleset, family) = checkpoint_from_raw(raw, rules_dirs=rules_dirs, progress=progress, rules=rules)
    from ckptinspect.readiness import assess_mtp

    mtp = assess_mtp(checkpoint, family, ruleset, engine_versions=engine_versions)
    drafts = assess_drafts(raw, family, ruleset, rules_dirs=rules_dirs, engine_versions=engine_versions)
    return Report(checkpoint=checkpoint, mtp=mtp, drafts=drafts)


class RulesOnce:
    """One report's rule set, loaded at its first use and then shared: the source asks for it (which draft
    subfolders to read) after reading config.json, the stages after the read. Loaded lazily, so a source's
    error still comes before a rules error; a load that fails is not kept (the stages raise it again)."""

    def __init__(self, rules_dirs: Sequence[Path] = ()) -> None:
        self.rules_dirs = tuple(rules_dirs)
        self._ruleset: Any = None

    def __call__(self) -> Any:
        if self._ruleset is None:
            from ckptinspect.readiness import load_rules

            self._ruleset = load_rules(self.rules_dirs)
        return self._ruleset


# -- drafts in subfolders (rules: a family's draft_subfolders) -------------------------------------------
def draft_subfolder_chooser(rules: RulesOnce) -> Callable[[Any], tuple[str, ...]]:
    """What a source is handed (sources/subfolders.py): from the parsed config.json, the subfolder names the
    matched family declares as drafts (none for a config no family matches or that does not parse: the
    report's own config stage then says why)."""

    def choose(config_json: Any) -> tuple[str, ...]:
        from ckptinspect.errors import CkptInspectError

        try:
            family = rules().match(normalize_config(config_json, source="config.json"))
        except CkptInspectError:
            return ()
        return tuple(d.path for d in family.draft_subfolders) if family is not None else ()

    return choose


def assess_drafts(raw: RawCheckpoint, family: Any, ruleset: Any, *, rules_dirs: Sequence[Path] = (),
                  engine_versions: Mapping[str, str] | None = None) -> tuple[DraftAssessment, ...]:
    """One DraftAssessment per subfolder ``family`` declares: the subfolder's own report when the source
    read it, else what each engine does without it (the rule's ``absent`` entries)."""
    if family is None or not family.draft_subfolders:
        return ()
    from ckptinspect.readiness import assess_mtp

    out = []
    for decl in family.draft_subfolders:
        sub_raw = raw.subfolders.get(decl.path)
        if sub_raw is not None:
            sub_ck, (_, sub_family) = checkpoint_from_raw(sub_raw, rules_dirs=rules_dirs, rules=lambda: ruleset)
            sub_mtp = assess_mtp(sub_ck, sub_family, ruleset, engine_versions=engine_versions)
            # the draft family's checks speak of a draft reported on its own ("serve the target"): not here.
            # The subfolder's own checkpoint findings (quantization cross-checks, ...) are the draft's too.
            own = {c.code for c in sub_family.checks} if sub_family is not None else set()
            findings = [f for f in (*sub_ck.findings, *sub_mtp.findings) if not (f.engine is None and f.code in own)]
            verdicts = sub_mtp.verdicts
            if sub_ck.family != decl.family:
                # The engines read the subfolder as THE draft of the target whatever it holds, and build the
                # declared draft only from its own architecture (the draft family's match; e.g. SGLang's
                # _config_draft_model and vLLM's hf_config_override rewrite only a DSparkMiniMaxDraftModel
                # config: rules/families/minimax_m3_dspark.yaml). Anything else is no draft they can serve:
                # the subfolder is broken, each engine's draft unusable (not the other family's verdicts).
                findings.append(Finding(
                    MISMATCH_CODE, "error",
                    f"{decl.path}/config.json matches family {sub_ck.family or 'none'}, not {decl.family}: the "
                    f"engines load {decl.path}/ as the target's {decl.family} draft, which this is not",
                    subject=f"{decl.path}/config.json", reference=decl.reference,
                    hint=f"ship the {decl.family} draft in {decl.path}/, or remove the subfolder"))
                verdicts = _declared_draft_verdicts(decl, ruleset, engine_versions, MISMATCH_CODE)
            out.append(DraftAssessment(decl.path, decl.family, "present", sub_raw.location, verdicts,
                                       tuple(findings), decl.reference, checkpoint=sub_ck, mtp=sub_mtp))
            continue
        listed = f"{decl.path}/config.json" in raw.files
        if listed:  # a source that cannot read subfolders (a snapshot file): no verdict is made up
            out.append(DraftAssessment(decl.path, decl.family, "not read", f"{raw.location}/{decl.path}", {},
                                       (Finding("draft-subfolder-not-read", "info",
                                                f"{decl.path}/ holds a draft this source cannot read; report the "
                                                "checkpoint from its directory, the HF cache or the Hub",
                                                subject=f"{decl.path}/"),), decl.reference))
            continue
        verdicts: dict[str, EngineVerdict] = {}
        findings = []
        draft_family = ruleset.get(decl.family)
        for engine, entries in decl.absent.items():
            rule = draft_family.engines.get(engine) if draft_family is not None else None
            version = (engine_versions or {}).get(engine, rule.version if rule is not None else "0")
            absent = decl.absent_rule(engine, version)
            if absent is None:
                continue
            from ckptinspect.readiness.assess import fill_template

            verdicts[engine] = EngineVerdict(
                engine=engine, verdict=absent.verdict, engine_version=version,
                draft_architecture=rule.draft_architecture if rule is not None else None,
                method=rule.method if rule is not None else None, draft_quantization=None, layers_used=0,
                reasons=(absent.code,))
            findings.append(Finding(absent.code, "info", fill_template(absent.message, {"version": version}),
                                    engine=engine, subject=f"{decl.path}/", reference=absent.reference,
                                    hint=absent.remedy))
        out.append(DraftAssessment(decl.path, decl.family, "absent", f"{raw.location}/{decl.path}", verdicts,
                                   tuple(findings), decl.reference))
    return tuple(out)


MISMATCH_CODE = "draft-subfolder-family-mismatch"


def _declared_draft_verdicts(decl: Any, ruleset: Any, engine_versions: Mapping[str, str] | None,
                             code: str) -> dict[str, EngineVerdict]:
    """``unusable`` for each engine the declared draft family judges, with ``code`` as the reason: what the
    engines do with a subfolder that holds something else."""
    draft_family = ruleset.get(decl.family)
    out: dict[str, EngineVerdict] = {}
    for engine, rule in (draft_family.engines.items() if draft_family is not None else ()):
        version = (engine_versions or {}).get(engine, rule.version)
        out[engine] = EngineVerdict(engine=engine, verdict="unusable", engine_version=version,
                                    draft_architecture=rule.draft_architecture, method=rule.method,
                                    draft_quantization=None, layers_used=0, reasons=(code,))
    return out


def engine_config(raw: RawCheckpoint) -> tuple[Any, str]:
    """The model config the engines read, and the file it comes from: in Mistral's format params.json, as vLLM's
    adapter turns it into a config (config/mistral_params.py; header/index.py is_mistral_format says when it
    wins over config.json), else config.json.

    Raises:
        ConfigError: neither file, or a params.json vLLM refuses (one line naming it).
    """
    if PARAMS in raw.json_files and is_mistral_format(raw.files):
        return adapt_params(raw.json_files[PARAMS], defaults=raw.json_files.get(CONFIG),
                            source=f"{raw.location}/{PARAMS}"), PARAMS
    if CONFIG not in raw.json_files:
        raise ConfigError("no config.json in the checkpoint", path=raw.location)
    return raw.json_files[CONFIG], CONFIG


def checkpoint_from_raw(raw: RawCheckpoint, *, rules_dirs: Sequence[Path] = (), progress: Progress = SILENT,
                        rules: Callable[[], Any] | None = None) -> tuple[Checkpoint, tuple]:
    """Parse a RawCheckpoint; returns the Checkpoint and (ruleset, family) for the rules stage (``rules``:
    the report's RulesOnce, else the rules of ``rules_dirs`` are loaded here).

    The stages run one after the other in this thread, each on what the one before returned: the
    config (config/), the family rule it matches (its MTP prefixes name the draft layers' tensors), the
    declared quantization (quant/declared.py), then the scan of every shard header (inventory/scan.py),
    the inventory built from it, and the checks over both. Config and quantization-file errors are
    therefore raised before any header is scanned, header errors in the record's shard order."""
    from ckptinspect.readiness import GENERIC_MTP_PREFIXES, load_rules

    config_json, config_name = engine_config(raw)
    config = normalize_config(config_json, source=f"{raw.location}/{config_name}")
    ruleset = rules() if rules is not None else load_rules(tuple(rules_dirs))
    family = ruleset.match(config)
    templates = family.mtp_prefixes if family is not None else GENERIC_MTP_PREFIXES
    prefixes = compile_prefixes(tuple(templates), config.num_hidden_layers)
    hf_quant = raw.json_files.get(HF_QUANT_CONFIG)
    check_quant_fields(config.raw, hf_quant, config_source=f"{raw.location}/{config_name}",
                       quant_source=f"{raw.location}/{HF_QUANT_CONFIG}")
    declared, decl_findings = read_declared(config.raw, hf_quant, raw.json_files.get(QUANT_MODEL_DESCRIPTION))
    matcher = matcher_for(declared)
    scans, index_summary = scan_checkpoint(raw, progress)
    findings: list[Finding] = []
    if index_summary is not None:
        findings.extend(_index_findings(raw, scans, index_summary))
    inventory, inv_findings = build_inventory(scans, config, prefixes)
    findings.extend(inv_findings)
    findings.extend(decl_findings)
    from ckptinspect.readiness.draft_build import runtime_only_names

    depth = 1 + max((g.mtp_layer for g in inventory.mtp_groups()), default=-1)
    findings.extend(crosscheck(inventory, declared, matcher,
                               runtime_only_names(family, config.num_hidden_layers, depth)))
    findings.extend(_expert_findings(inventory, config))
    findings.extend(_file_findings(raw, {scan.shard for scan in scans}))
    stats = dict(raw.stats)
    if raw.revision:
        stats["revision"] = raw.revision
    checkpoint = Checkpoint(
        ref=raw.ref, kind=raw.kind, location=raw.location, files=raw.files, config=config, declared=declared,
        inventory=inventory, findings=tuple(findings), family=family.id if family is not None else None,
        stats=stats,
    )
    # The crosscheck's generic reading of the lists, answered again by each engine's own procedure: one
    # truth for the findings, the per-module table and the verdicts (readiness/engine_crosscheck.py).
    from ckptinspect.readiness.engine_crosscheck import reconcile_crosscheck

    checkpoint = reconcile_crosscheck(checkpoint, family, ruleset)
    return checkpoint, (ruleset, family)


def _index_findings(raw: RawCheckpoint, scans: list[ShardScan], summary: IndexSummary) -> list[Finding]:
    """The index must name exactly the tensors the headers hold (engines load by the index)."""
    findings = []
    bad = [s for s in scans if summary.counts.get(s.shard, 0) != s.tensors
           or summary.name_hashes.get(s.shard, 0) != s.name_hash]
    if bad:
        # Rare: only now are the names themselves compared, to say which ones.
        weight_map = raw.json_files[INDEX]["weight_map"]
        for scan in bad:
            header_names = set(_header_names(raw, scan.shard))
            index_names = {n for n, s in weight_map.items() if s == scan.shard}
            missing, extra = sorted(index_names - header_names), sorted(header_names - index_names)
            parts = []
            if missing:
                parts.append(f"{len(missing)} indexed tensor(s) absent from the header (e.g. {missing[0]})")
            if extra:
                parts.append(f"{len(extra)} header tensor(s) not in the index (e.g. {extra[0]})")
            findings.append(Finding("index-header-mismatch", "error", f"{scan.shard}: " + "; ".join(parts),
                                    subject=scan.shard))
    data = sum(s.data_bytes for s in scans)
    if summary.total_size is not None and summary.total_size != data:
        findings.append(Finding("index-total-size-mismatch", "info",
                                f"index metadata.total_size is {summary.total_size:,} but the headers hold "
                                f"{data:,} bytes of tensors", subject=INDEX))
    return findings


def _header_names(raw: RawCheckpoint, shard: str) -> list[str]:
    """The tensor names of one shard, from the parser (header bytes never leave it as raw JSON)."""
    return parse_header(raw.headers[shard], source=shard, file_size=raw.file_sizes.get(shard)).names


def _expert_findings(inventory: Inventory, config: ModelConfig) -> list[Finding]:
    """Routed experts present per MoE layer vs the config's expert count."""
    expected = config.routed_experts
    if not expected:
        return []
    per_layer = inventory.experts_per_layer()
    short = {layer: n for layer, n in per_layer.items() if n < expected}
    findings = []
    # a draft-only checkpoint (IQuest Q1's iquest_q1_mtp) keeps its experts in the MTP layer, not in layers.N
    if not per_layer and not any(g.component == "routed_expert" for g in inventory.mtp_groups()):
        findings.append(Finding("no-routed-experts", "warning",
                                f"config declares {expected} routed experts but no routed-expert tensors were found"))
    elif short:
        sample = ", ".join(f"layer {k}: {v}" for k, v in sorted(short.items())[:4])
        findings.append(Finding("missing-experts", "error",
                                f"{len(short)} MoE layer(s) hold fewer than the {expected} configured experts ({sample})"))
    return findings


def _file_findings(raw: RawCheckpoint, shards: set[str]) -> list[Finding]:
    findings = []
    pickles = [f for f in raw.files if f.lower().endswith(PICKLE_SUFFIXES)]
    if not shards:
        # Without safetensors weights there is nothing to serve, size or check: never a clean report.
        # (The scanned shards, not len(raw.headers): that would parse a 41 MB index a second time.)
        only = (f"; only pickle-based weights ({', '.join(pickles[:3])}), which ckptinspect never loads"
                if pickles else "")
        findings.append(Finding("no-weights", "error", f"the checkpoint has no safetensors weight files{only}",
                                subject=raw.location,
                                hint="convert the weights to safetensors (engines and this tool read only those)"))
    if pickles:
        findings.append(Finding(
            "pickle-files-present", "warning",
            f"{len(pickles)} pickle-based file(s) present ({', '.join(pickles[:3])}); never loaded by ckptinspect, "
            "and loading them can execute code", subject=pickles[0]))
    unindexed = [f for f in raw.files if f.endswith(".safetensors") and "/" not in f and f not in shards]
    if unindexed:
        findings.append(Finding(
            "unindexed-shard", "info",
            f"{len(unindexed)} safetensors file(s) not referenced by the index, ignored by engines "
            f"({', '.join(unindexed[:3])})", subject=unindexed[0]))
    return findings


# -- GGUF: RawGguf -> Checkpoint (format "gguf") -> llama.cpp MTP verdict ---------------------------------
def checkpoint_from_gguf(raw: Any) -> Checkpoint:
    """The Checkpoint of a RawGguf (sources/gguf_files.py): the same record a safetensors source gives."""
    from ckptinspect.config.gguf_config import gguf_declared, gguf_model_config
    from ckptinspect.inventory.gguf_inventory import build_gguf_inventory

    first_name, first = raw.parts[0]
    names = {t.name for _, h in raw.parts for t in h.tensors}
    config = gguf_model_config(first, names, source=f"{raw.location}/{first_name}")
    inventory = build_gguf_inventory(raw.parts, config.num_hidden_layers)
    findings: list[Finding] = list(_expert_findings(inventory, config))
    projectors = [f for f in raw.files if f.rsplit("/", 1)[-1].lower().startswith("mmproj")]
    if projectors:
        findings.append(Finding("gguf-projector-present", "info",
                                f"vision projector file(s) next to the model ({', '.join(projectors[:3])}), "
                                "loaded with llama-server --mmproj; not part of this report", subject=projectors[0]))
    stats: dict[str, Any] = dict(raw.stats)
    stats["model_set"] = raw.model
    if raw.revision:
        stats["revision"] = raw.revision
    return Checkpoint(ref=raw.ref, kind=raw.kind, location=raw.location, files=raw.files, config=config,
                      declared=gguf_declared(first), inventory=inventory, findings=tuple(findings), family=None,
                      stats=stats, format="gguf")


def assess_gguf(checkpoint: Checkpoint, raw: Any, *, engine_version: str | None = None) -> MtpAssessment:
    from ckptinspect.readiness.gguf_mtp import assess_gguf_mtp

    return assess_gguf_mtp(checkpoint, raw.parts, raw.companions, version=engine_version)


def companion_head_groups(checkpoint: Checkpoint, raw: Any, mtp: MtpAssessment) -> tuple[TensorGroup, ...]:
    """The tensor groups of the NextN head when it ships in a companion ``mtp-*.gguf``, numbered as the
    trunk's blocks after the last (``diff`` compares them with a head inside the model). A head of its own
    architecture (blocks from 0: Gemma 4's assistant) is no NextN block of the trunk and gives none."""
    from ckptinspect.inventory.gguf_inventory import build_gguf_inventory

    model_files = {s.name for s in checkpoint.inventory.shards}
    head_files = {f for layer in mtp.layers for f in layer.shards} - model_files
    parts = [(name, header) for name, header in raw.companions if name in head_files]
    if not parts:
        return ()
    groups = build_gguf_inventory(parts, checkpoint.config.num_hidden_layers).groups
    return tuple(g for g in groups if g.mtp_layer is not None)
