"""Frozen records passed between pipeline stages.

The pipeline is::

    sources (local dir, HF cache, Hub, snapshot)      -> RawCheckpoint
    header parser (pure, bounded)                     -> per-shard tensor entries
    inventory / grouping                              -> Inventory of TensorGroup
    quantization (detected per group, declared lists) -> scheme per group, DeclaredQuant
    rules (MTP readiness per engine)                  -> MtpAssessment
    plan (memory, TP/EP, launch flags)                -> Plan (ckptinspect.plan)
    render (text / json / markdown)

Every stage hands the next one these records; raw header dicts never leave the parser and the
inventory builder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, Iterator, Mapping

SEVERITIES = ("error", "warning", "info")

# Quantization scheme vocabulary of the JSON contract (schema_version 1).
SCHEMES = (
    "bf16", "fp16", "fp32", "fp8_block", "fp8_channel", "fp8_tensor", "nvfp4", "mxfp4",
    "int4_awq", "int4_gptq", "int4_pack", "int8", "other",
)

# Components a tensor group can belong to.
COMPONENTS = (
    "embedding", "lm_head", "attention", "mlp", "router", "shared_expert", "routed_expert",
    "norm", "vision", "mtp_fusion", "other",
)

VERDICTS = ("ready", "degraded", "unusable", "absent")  # best to worst, see VERDICT_RANK
VERDICT_RANK = {"ready": 0, "absent": 0, "degraded": 1, "unusable": 2}

# The files a checkpoint's tokenizer comes in (any one of them, or a *.tiktoken file): the probe needs
# one, so a report suggests the probe only for checkpoints that ship it.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tiktoken.model")


def has_tokenizer(names: Iterable[str]) -> bool:
    """Whether the top level of a checkpoint (``names``: its file names) holds a tokenizer file."""
    return any(n in TOKENIZER_FILES or (n.endswith(".tiktoken") and "/" not in n) for n in names)


@dataclass(frozen=True)
class Finding:
    """One observation about the checkpoint, with a stable kebab-case ``code``."""

    code: str
    severity: str  # "error" | "warning" | "info"
    message: str
    engine: str | None = None  # "sglang" | "vllm" when engine specific
    subject: str | None = None  # tensor / module / file the finding is about
    reference: str | None = None  # issue / source file behind the rule
    hint: str | None = None  # the remedy, when there is one


@dataclass(frozen=True)
class ShardInfo:
    """One safetensors file as seen through its header."""

    name: str
    header_length: int  # N, the JSON length after the 8-byte prefix
    file_size: int | None  # None when unknown (never for local files)
    tensors: int
    data_bytes: int


@dataclass(frozen=True)
class TensorGroup:
    """Tensors that share one name pattern and one leading index.

    ``pattern`` is the tensor name with every dotted numeric segment replaced by ``{}``;
    ``index`` is the value of the first such segment (the decoder layer for
    ``model.layers.{}.…``, the MTP layer for ``mtp.layers.{}.…``), None when the name has none.
    ``subs`` holds the remaining numeric segments of every member (e.g. expert ids) as the scan
    produced them (nothing, one int per member, or one tuple per member); ``sub_indices`` is the
    same as a set of tuples, built on first use (370k members on large MoE checkpoints), so
    ``name(index, *sub)`` rebuilds each tensor name exactly.
    """

    pattern: str
    index: int | None
    component: str  # one of COMPONENTS
    role: str  # weight | bias | scale | scale_2 | input_scale | zero_point | g_idx | kv_scale | other
    module: str  # pattern of the owning module (pattern minus the parameter suffix)
    layer: int | None  # main-model decoder layer, None for MTP / non-layer tensors
    mtp_layer: int | None  # k when the group belongs to MTP layer k
    dtypes: tuple[str, ...]
    shape: tuple[int, ...]  # shape of one member (members of a group normally share it)
    tensors: int
    bytes: int
    elements: int  # stored elements (packed U8 counts bytes, not logical values)
    params: int  # logical weight elements; 0 for scales / zero points / companions
    scheme: str  # one of SCHEMES; companions carry the scheme of their weight
    shards: frozenset[str]
    subs: tuple[Any, ...] = ()
    shapes_vary: bool = False  # True when members have different shapes
    kind: str = ""  # attention: mla|gqa|mha|linear|sliding; routed_expert: per_expert|grouped
    experts: int | None = None  # routed-expert weight groups: experts held (ids, or dim 0 when grouped)
    # Each member's stored scheme in ``subs`` order, only on a weight group whose members' dtypes give
    # different schemes (one routed expert stored BF16 among block-FP8 ones); ``scheme`` is then the
    # scheme of the most common dtype. Empty otherwise.
    member_schemes: tuple[str, ...] = ()

    @cached_property
    def sub_indices(self) -> frozenset[tuple[int, ...]]:
        """Remaining numeric segments of every member, as tuples (``{()}`` when there are none)."""
        if not self.subs:
            return frozenset({()})
        if isinstance(self.subs[0], int):
            return frozenset(zip(self.subs))
        return frozenset(self.subs)

    def name(self, *indices: int) -> str:
        """The concrete tensor name for ``indices`` (index first, then sub-indices)."""
        return self.pattern.format(*indices)

    def names(self) -> Iterator[str]:
        """Every tensor name of the group (order: sorted sub-indices)."""
        if self.index is None:
            if not self.sub_indices or self.sub_indices == frozenset({()}):
                yield self.pattern
                return
            for sub in sorted(self.sub_indices):
                yield self.pattern.format(*sub)
            return
        for sub in sorted(self.sub_indices):
            yield self.pattern.format(self.index, *sub)


@dataclass(frozen=True)
class Totals:
    tensors: int
    params: int
    bytes: int


@dataclass(frozen=True)
class ModelConfig:
    """The language-model facts of config.json, normalised (text_config flattened)."""

    architecture: str
    model_type: str
    text_model_type: str | None  # text_config.model_type of multimodal wrappers
    text_config_path: str  # "" when the LM keys are top level, "text_config" otherwise
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int | None
    num_attention_heads: int | None
    num_key_value_heads: int | None
    head_dim: int | None
    intermediate_size: int | None
    moe_intermediate_size: int | None
    routed_experts: int | None  # None for dense models
    experts_per_token: int | None
    shared_experts: int | None  # 0 for an MoE without shared experts, None for dense
    shared_expert_intermediate_size: int | None
    first_dense_layers: int  # first_k_dense_replace and friends; 0 when all layers are MoE
    layer_types: tuple[str, ...]  # per layer: full_attention | linear_attention | sliding_attention
    attention_kind: str  # mla | gqa | mha | hybrid_linear | sliding_hybrid
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    qk_nope_head_dim: int | None
    v_head_dim: int | None
    max_position_embeddings: int | None
    sliding_window: int | None
    tie_word_embeddings: bool
    torch_dtype: str | None
    has_remote_code: bool  # auto_map present
    has_vision: bool
    raw: Mapping[str, Any]  # the whole config.json
    text: Mapping[str, Any]  # the dict the LM keys were read from (raw or raw["text_config"])

    def get(self, dotted: str, default: Any = None) -> Any:
        """Read a key by dotted path from the raw config (``text_config.mtp_num_hidden_layers``)."""
        node: Any = self.raw
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return node


@dataclass(frozen=True)
class ExcludeList:
    """A declared list of modules left unquantized (or, for ``include``, the ones quantized)."""

    source: str  # e.g. "config.json:quantization_config.ignore"
    semantics: str  # modelopt_glob | ct_regex | glob | include_map | gptq_dynamic
    entries: tuple[str, ...]


@dataclass(frozen=True)
class DeclaredQuant:
    """What the checkpoint's config files say about quantization."""

    label: str | None  # "<method>" or "<method>:<algo>" (contract), None when unquantized
    method: str | None
    algo: str | None
    group_size: int | None
    block_size: tuple[int, ...] | None
    scale_fmt: str | None
    kv_cache: str | None
    sources: tuple[str, ...]  # files/keys the declaration was read from
    excludes: tuple[ExcludeList, ...]
    quantized_layers: Mapping[str, str] = field(default_factory=dict)  # MIXED_PRECISION
    raw: Mapping[str, Any] = field(default_factory=dict)  # the quantization dict used
    # producer.name of the dict vLLM reads (config.json's quantization_config, else hf_quant_config.json);
    # its ModelOpt algo check runs only for a "modelopt" producer (readiness/engine_methods.py)
    producer: str | None = None


@dataclass(frozen=True)
class Inventory:
    """Every tensor of the checkpoint, grouped."""

    groups: tuple[TensorGroup, ...]
    shards: tuple[ShardInfo, ...]
    totals: Totals

    def mtp_groups(self, k: int | None = None) -> tuple[TensorGroup, ...]:
        return tuple(g for g in self.groups if g.mtp_layer is not None and (k is None or g.mtp_layer == k))

    def main_groups(self) -> tuple[TensorGroup, ...]:
        return tuple(g for g in self.groups if g.mtp_layer is None)

    def experts_per_layer(self) -> dict[int, int]:
        """Routed experts held by each main-model MoE layer (the most any of its expert weights has)."""
        counts: dict[int, int] = {}
        for g in self.groups:
            if g.component == "routed_expert" and g.experts is not None and g.layer is not None:
                counts[g.layer] = max(counts.get(g.layer, 0), g.experts)
        return counts


@dataclass(frozen=True)
class IndexSummary:
    """What the report needs from model.safetensors.index.json, in a few kilobytes (header/index.py)."""

    shards: tuple[str, ...]  # unique shard files in first-seen order
    counts: Mapping[str, int]  # shard -> tensor names mapped to it
    name_bytes: Mapping[str, int]  # shard -> total length of those names (sizes the Hub header reads)
    name_hashes: Mapping[str, int]  # shard -> sum of hash(name) & 2**64-1 (same process family only)
    total_size: int | None  # metadata.total_size as written


@dataclass(frozen=True)
class RawCheckpoint:
    """What every source delivers (sources/interface.py ``Source``), complete and eager: plain dicts already
    read, so no consumer needs to know which kind of source made it and no access does I/O.

    ``headers`` holds every shard the engines load, in the index's first-seen order (else the single
    ``model.safetensors``, else every top-level safetensors file, sorted); ``file_sizes`` has the same keys.
    ``index_summary`` is the index's one summary (header/index.py), made by the source that parsed it;
    None exactly when there is no index.
    """

    ref: str  # what the user typed
    kind: str  # local | hf-cache | hub | snapshot (or a registered kind's name)
    location: str  # directory, repo@revision, or snapshot file
    files: tuple[str, ...]  # every file name of the checkpoint (relative)
    json_files: Mapping[str, Any]  # parsed config.json, hf_quant_config.json, index, generation_config
    headers: Mapping[str, bytes]  # shard -> header JSON bytes (without the 8-byte prefix)
    file_sizes: Mapping[str, int | None]  # shard -> total file size when known
    revision: str | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)  # requests, bytes fetched, ...
    index_summary: IndexSummary | None = None
    # draft checkpoints read from subfolders the matched family declares (rules: draft_subfolders), by name:
    # each a complete record of its own (files relative to the subfolder); only the names the source was asked
    # for and found (sources/subfolders.py)
    subfolders: Mapping[str, "RawCheckpoint"] = field(default_factory=dict)


@dataclass(frozen=True)
class Checkpoint:
    """A parsed checkpoint: config, inventory and declared quantization."""

    ref: str
    kind: str
    location: str
    files: tuple[str, ...]
    config: ModelConfig
    declared: DeclaredQuant
    inventory: Inventory
    findings: tuple[Finding, ...]  # findings of the parse / inventory / quantization stages
    family: str | None = None  # matched rule family id
    stats: Mapping[str, Any] = field(default_factory=dict)
    format: str = "safetensors"  # "gguf" for GGUF files (pipeline.py checkpoint_from_gguf; schemes are then ggml type names)


@dataclass(frozen=True)
class EngineVerdict:
    """Whether one serving engine would load and use the MTP layer as shipped."""

    engine: str  # sglang | vllm
    verdict: str  # one of VERDICTS
    engine_version: str  # e.g. "0.5.23"
    draft_architecture: str | None  # e.g. Qwen3_5ForCausalLMMTP
    method: str | None  # SGLang --speculative-algorithm value / vLLM speculative method
    # the declared scheme when the engine builds at least one MTP module with it (decided per module
    # with the engine's exclude semantics); None = every MTP module is built unquantized
    draft_quantization: str | None
    layers_used: int  # MTP layers the engine would use (vLLM reuses layer 0)
    reasons: tuple[str, ...]  # finding codes behind the verdict
    # what the engine builds per MTP weight group: (module pattern, declared label or None = unquantized)
    module_quantization: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class MtpModuleQuant:
    """One MTP weight group, three facts side by side: what the config declares for it, what the
    headers store, and what each engine builds (readiness/module_table.py)."""

    module: str  # module pattern, layer index filled ("mtp.layers.0.mlp.experts.{}.gate_proj")
    component: str
    declared: str  # declared scheme label, "excluded", "unlisted" (MIXED_PRECISION) or "none"
    stored: str  # scheme of the stored tensors
    built: Mapping[str, str]  # engine -> label / "unquantized" / "load error" / "no draft model"
    reasons: Mapping[str, str]  # engine -> one of readiness/draft_build.py REASONS (joined when mixed)
    causes: Mapping[str, str]  # engine -> the config entry or rule responsible ("" when generic)
    matches: Mapping[str, bool]  # engine -> what it builds fits what is stored


@dataclass(frozen=True)
class MtpLayerInfo:
    k: int
    prefix: str  # concrete prefix, e.g. "model.layers.61." or "mtp."
    tensors: int
    params: int
    bytes: int
    schemes: Mapping[str, int]  # scheme -> tensors
    missing: tuple[str, ...]  # required sub-tensors (patterns) not found
    experts_present: int | None
    experts_expected: int | None
    shards: tuple[str, ...]


@dataclass(frozen=True)
class MtpAssessment:
    family: str | None
    declared_key: str | None
    declared_layers: int | None
    present_layers: int
    tensors: int
    params: int
    bytes: int
    schemes: Mapping[str, int]
    complete: bool
    layers: tuple[MtpLayerInfo, ...]
    verdicts: Mapping[str, EngineVerdict]
    findings: tuple[Finding, ...]
    modules: tuple[MtpModuleQuant, ...] = ()  # per MTP weight group: declared / stored / built per engine


@dataclass(frozen=True)
class DraftAssessment:
    """A stand-alone draft the matched family declares in a subfolder of the checkpoint (rules:
    draft_subfolders; MiniMax-M3's ``dspark/``), which the engines find there themselves.

    ``status``: "present" (read and judged with its own family's rules: ``checkpoint`` and ``mtp`` are its
    own report), "absent" (no ``<subfolder>/config.json``: ``verdicts`` say what each engine does then),
    or "not read" (the source lists it but cannot read subfolders: a snapshot file)."""

    subfolder: str
    family: str  # the family its config.json must match (the rule's)
    status: str  # present | absent | not read
    location: str
    verdicts: Mapping[str, EngineVerdict]
    findings: tuple[Finding, ...]
    reference: str
    checkpoint: Checkpoint | None = None
    mtp: MtpAssessment | None = None

