"""MTP (NextN) readiness of a GGUF checkpoint for llama.cpp, decided by rules/engines/llamacpp.yaml.

Where is the head? llama.cpp stores NextN layers as the last ``{arch}.nextn_predict_layers`` blocks of
``{arch}.block_count`` (gguf-py constants.py ``Keys.LLM.NEXTN_PREDICT_LAYERS``), each a full decoder
block plus ``blk.{bid}.nextn.*`` tensors (convert_hf_to_gguf.py maps ``eh_proj``, ``enorm``,
``hnorm``, ``embed_tokens``, ``shared_head.head``, ``shared_head.norm``; gguf-py tensor_mapping.py
``MODEL_TENSOR.NEXTN_*``). A block counts as present when its ``eh_proj``, ``enorm`` and ``hnorm`` are
(the tensors every NextN architecture has; ``embed_tokens`` / ``shared_head_head`` are often shared
with the trunk and dropped). The head is ``inside`` the model, in a ``companion`` file
(``mtp-*.gguf``, loaded with ``-md``), ``missing`` (declared, absent) or ``none``.
The rule file's first matching verdict decides; its message names the file, type and flag.
"""

from __future__ import annotations

import re
from typing import Any

from ckptinspect.config.gguf_config import nextn_layers
from ckptinspect.header.gguf import GgufHeader
from ckptinspect.header.gguf_types import FLOAT_TYPES, GGML_TYPE_BY_NAME, INTEGER_TYPES
from ckptinspect.readiness.gguf_conditions import GgufHeadFacts, version_in
from ckptinspect.records import Checkpoint, EngineVerdict, Finding, MtpAssessment, MtpLayerInfo
from ckptinspect.rules.conditions import evaluate
from ckptinspect.rules.gguf_engine import ENGINE, gguf_engine_rules

REQUIRED = ("eh_proj", "enorm", "hnorm")
_NEXTN = re.compile(r"^blk\.(\d+)\.nextn\.([a-z_0-9]+)\.")
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _nextn_parts(tensors) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for t in tensors:
        m = _NEXTN.match(t.name)
        if m:
            out.setdefault(int(m.group(1)), set()).add(m.group(2))
    return out


def _complete(parts: dict[int, set[str]], bids: list[int]) -> bool:
    return bool(bids) and all(set(REQUIRED) <= parts.get(b, set()) for b in bids)


def locate_head(checkpoint: Checkpoint, parts: tuple, companions: tuple) -> dict[str, Any]:
    """Where the NextN head is, which blocks and tensors it has, and the file that holds it."""
    first: GgufHeader = parts[0][1]
    arch = checkpoint.config.architecture
    declared = nextn_layers(first, arch)
    layers = checkpoint.config.num_hidden_layers
    main = _nextn_parts(t for _, h in parts for t in h.tensors)
    bids = list(range(layers, layers + declared)) if declared else sorted(main)
    if _complete(main, bids):
        tensors = [(f, t) for f, h in parts for t in h.tensors if _bid(t.name) in bids]
        return {"head": "inside" if declared else "undeclared", "declared": declared, "bids": bids, "tensors": tensors, "companion": None,
                "missing": []}
    for name, header in companions:
        found = _nextn_parts(header.tensors)
        cbids = bids if declared else sorted(found)
        if _complete(found, cbids):
            tensors = [(name, t) for t in header.tensors if _bid(t.name) in cbids]
            return {"head": "companion", "declared": declared, "bids": cbids, "tensors": tensors,
                    "companion": name, "missing": []}
    for name, header in companions:
        # A separate draft model of its own architecture (Gemma 4's mtp-*.gguf "assistant"): no nextn.*
        # names, the whole file is the head; its blocks are numbered from 0.
        own = header.metadata.get("general.architecture")
        if not found_nextn(header) and isinstance(own, str) and own != arch and header.tensors:
            cbids = sorted({b for t in header.tensors if (b := _bid(t.name)) is not None}) or [0]
            return {"head": "companion", "declared": declared, "bids": cbids, "companion": name, "missing": [],
                    "tensors": [(name, t) for t in header.tensors]}
    missing = [f"blk.{b}.nextn.{r}" for b in bids for r in REQUIRED if r not in main.get(b, set())]
    head = "missing" if declared or main else "none"
    return {"head": head, "declared": declared, "bids": bids, "tensors": [], "companion": None, "missing": missing}
    # "undeclared": NextN tensors inside, {arch}.nextn_predict_layers absent (llama.cpp sizes the head from the key)


def found_nextn(header: GgufHeader) -> bool:
    return any(_NEXTN.match(t.name) for t in header.tensors)


def _bid_or(name: str, default: int) -> int:
    bid = _bid(name)
    return default if bid is None else bid


def _bid(name: str) -> int | None:
    m = _BLOCK.match(name)
    return int(m.group(1)) if m else None


def _lowest(tensors: list) -> tuple[str | None, str | None, float | None]:
    """The head's lowest-precision quantized weight (matrices only: norms stay F32 in every quant)."""
    best = None
    for _, t in tensors:
        if len(t.shape) < 2 or t.ggml_type in INTEGER_TYPES:
            continue
        bits = GGML_TYPE_BY_NAME[t.ggml_type].bits
        if best is None or bits < best[2]:
            best = (t.ggml_type, t.name, bits)
    return best if best else (None, None, None)


def assess_gguf_mtp(checkpoint: Checkpoint, parts: tuple, companions: tuple, *,
                    version: str | None = None, engine: str = ENGINE) -> MtpAssessment:
    rules = gguf_engine_rules(engine)
    version = version or rules["version"]
    arch = checkpoint.config.architecture
    where = locate_head(checkpoint, parts, companions)
    lowest_type, lowest_tensor, lowest_bits = _lowest(where["tensors"])
    drafted = any(arch in d["arch"] and version_in(version, d["versions"]) for d in rules["drafts"])
    facts = GgufHeadFacts(arch=arch, head=where["head"], drafted=drafted, lowest_bits=lowest_bits, version=version)
    source = f"rules/engines/{engine}.yaml"
    rule = next(r for r in rules["verdicts"] if evaluate(r.get("when"), facts, "gguf", source=source))
    values = {"arch": arch, "declared": where["declared"], "companion": where["companion"] or "-",
              "lowest_type": lowest_type or "-", "lowest_tensor": lowest_tensor or "-",
              "missing": ", ".join(where["missing"][:3]) or "-", "version": version}
    hint = rule.get("hint")
    finding = Finding(rule["code"], rule["severity"], rule["message"].format_map(values), engine=engine,
                      subject=where["companion"] or lowest_tensor, reference=rule.get("reference"),
                      hint=hint.format_map(values) if hint else None)
    layers = _layers(where, checkpoint)
    schemes: dict[str, int] = {}
    for _, t in where["tensors"]:
        schemes[t.ggml_type] = schemes.get(t.ggml_type, 0) + 1
    verdict = EngineVerdict(engine=engine, verdict=rule["verdict"], engine_version=version, draft_architecture=arch,
                            method="draft-mtp", draft_quantization=lowest_type, layers_used=len(layers),
                            reasons=(rule["code"],))
    return MtpAssessment(
        family=None, declared_key=f"{arch}.nextn_predict_layers" if where["declared"] else None,
        declared_layers=where["declared"] or None, present_layers=len(layers),
        tensors=len(where["tensors"]), params=sum(t.elements for _, t in where["tensors"] if len(t.shape) > 1),
        bytes=sum(t.nbytes for _, t in where["tensors"]), schemes=schemes,
        complete=where["head"] in ("inside", "companion", "undeclared"), layers=tuple(layers), verdicts={engine: verdict},
        findings=(finding,),
    )


def _layers(where: dict[str, Any], checkpoint: Checkpoint) -> list[MtpLayerInfo]:
    out = []
    first_bid = min(where["bids"]) if where["bids"] else 0
    for bid in where["bids"]:
        tensors = [(f, t) for f, t in where["tensors"] if _bid_or(t.name, first_bid) == bid]
        if not tensors:
            continue
        schemes: dict[str, int] = {}
        for _, t in tensors:
            schemes[t.ggml_type] = schemes.get(t.ggml_type, 0) + 1
        experts = [t.shape[-1] for _, t in tensors if "_exps." in t.name and len(t.shape) == 3]
        out.append(MtpLayerInfo(
            k=bid - first_bid, prefix=f"blk.{bid}.", tensors=len(tensors),
            params=sum(t.elements for _, t in tensors if len(t.shape) > 1), bytes=sum(t.nbytes for _, t in tensors),
            schemes=schemes, missing=(), experts_present=max(experts) if experts else None,
            experts_expected=checkpoint.config.routed_experts if experts else None,
            shards=tuple(sorted({f for f, _ in tensors}))))
    return out


def is_float_type(name: str) -> bool:
    return name in FLOAT_TYPES
