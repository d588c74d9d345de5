"""GPU catalog (rules/gpus.yaml, extended or overridden by a user GPU file) -> GpuSpec, looked up by
name, alias or the name nvidia-smi / rocm-smi print.

A user GPU file (``--gpu-spec FILE``, or ``CKPTINSPECT_GPU_SPEC``) has the catalog's own schema
(rules/schema/gpus.schema.json): its entries are looked up before the built-in ones, so an entry with a
built-in card's name or alias replaces that card and any other entry adds one. ``--gpu-memory GIB``
replaces the usable memory of the chosen card (a MIG slice, a card shared with other jobs); every
memory figure of the plan reads ``GpuSpec.memory_gib``, so it changes fit, KV capacity and TP / EP alike.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from ckptinspect.errors import PlanError
from ckptinspect.plan.rules import gpu_rules


@dataclass(frozen=True)
class GpuSpec:
    name: str
    aliases: tuple[str, ...]
    vendor: str
    arch: str  # engine rule key: sm90, sm100, sm120, gfx942, ...
    compute_capability: str
    memory_gib: float
    bandwidth_tbps: float
    tflops_bf16: float | None
    tflops_fp8: float | None
    tflops_fp4: float | None
    interconnect: str  # nvlink | pcie | infinity_fabric | other
    interconnect_detail: str
    source: str
    spec_file: str = ""  # the user GPU file the entry came from ("" for the built-in catalog)
    catalog_memory_gib: float | None = None  # the catalog's figure when --gpu-memory replaced it


# Finite bounds for every number of a GPU entry, far above any real card (the largest has 288 GiB,
# 8 TB/s, ~20 PFLOPS of FP4): the schema says "a number > 0", which YAML's .inf and .nan and a
# 4,000-digit integer all are, and each ended in a traceback (StopIteration, OverflowError) or reached
# --format json as Infinity / NaN.
NUMBER_BOUNDS = {"memory_gib": 1e5, "bandwidth_tbps": 1e4, "tflops": 1e7}


def _number(value: Any, what: str, hi: float, where: str, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(f"GPU entry {what} must be a number, got {type(value).__name__}", path=where or None)
    try:
        number = float(value)
    except OverflowError:
        number = float("inf")
    if not 0 < number <= hi:  # also false for NaN
        shown = f"{value!r}" if isinstance(value, float) else f"an integer of {len(str(abs(value)))} digits" \
            if abs(value) > 10 ** 30 else f"{value!r}"
        raise PlanError(f"GPU entry {what} is {shown}; it must be a finite number in (0, {hi:g}]",
                        path=where or None)
    return number


def _spec(entry: Mapping[str, Any], spec_file: str = "") -> GpuSpec:
    tf = entry["tflops"]
    where = spec_file or "rules/gpus.yaml"
    name = entry["name"]
    for k in ("bf16", "fp8", "fp4"):  # checked; kept as written (the plan prints them as given)
        _number(tf.get(k), f"{name!r} tflops.{k}", NUMBER_BOUNDS["tflops"], where, optional=True)
    tflops = {k: tf.get(k) for k in ("bf16", "fp8", "fp4")}
    return GpuSpec(
        name=name, aliases=tuple(entry["aliases"]), vendor=entry["vendor"], arch=entry["arch"],
        compute_capability=str(entry["compute_capability"]),
        memory_gib=_number(entry["memory_gib"], f"{name!r} memory_gib", NUMBER_BOUNDS["memory_gib"], where),
        bandwidth_tbps=_number(entry["bandwidth_tbps"], f"{name!r} bandwidth_tbps", NUMBER_BOUNDS["bandwidth_tbps"],
                               where),
        tflops_bf16=tflops["bf16"], tflops_fp8=tflops["fp8"], tflops_fp4=tflops["fp4"],
        interconnect=entry["interconnect"],
        interconnect_detail=entry.get("interconnect_detail", ""), source=entry["source"], spec_file=spec_file,
    )


def load_gpus(spec_file: str | Path | None = None) -> tuple[GpuSpec, ...]:
    """The catalog: the user GPU file's entries (if any) first, then every built-in card none of them
    names (by name or alias)."""
    builtin = tuple(_spec(e) for e in gpu_rules()["gpus"])
    if not spec_file:
        return builtin
    user = load_gpu_file(spec_file)
    taken = {_key(s) for g in user for s in (g.name, *g.aliases)}
    return user + tuple(g for g in builtin if not taken & {_key(s) for s in (g.name, *g.aliases)})


def load_gpu_file(path: str | Path) -> tuple[GpuSpec, ...]:
    """The entries of a user GPU file (YAML or JSON in rules/gpus.yaml's schema), read through the
    guarded reader; any problem is one PlanError / RuleError line naming the file."""
    from ckptinspect.guarded_file import MAX_GPU_SPEC_BYTES, read_bytes
    from ckptinspect.rules.documents import parse_rule_document

    where = str(path)
    data = read_bytes(path, what="GPU file", cap=MAX_GPU_SPEC_BYTES, error=PlanError)
    doc = parse_rule_document(data, where, "gpus.schema.json")  # YAML 1.1 reads JSON too
    names: set[str] = set()
    for entry in doc["gpus"]:
        keys = {_key(s) for s in (entry["name"], *entry["aliases"])}
        if keys & names:
            raise PlanError(f"GPU file names {entry['name']!r} (or one of its aliases) twice", path=where)
        names |= keys
    return tuple(_spec(e, where) for e in doc["gpus"])


def _key(text: str) -> str:
    # "RTX PRO 6000", "rtx_pro_6000" and "rtx-pro-6000" all name the same card.
    return re.sub(r"[\s_]+", "-", text.strip().lower())


# nvidia-smi / rocm-smi spell a card with its vendor, its product line and its packaging
# ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA RTX PRO 6000 Blackwell Server Edition",
# "NVIDIA GeForce RTX 5090", "NVIDIA B300 SXM6 AC", "AMD Instinct MI300X"; tests/test_gpus.py cites
# where each was printed). These words never tell two catalog cards apart, so they are dropped; words
# that do ("PCIe", "NVL", "Max-Q") are kept, so "H100 NVL" stays unknown rather than becoming another card.
_VENDOR_PREFIXES = ("nvidia-", "amd-instinct-", "amd-", "geforce-")
_PACKAGING = {"hbm3", "hbm3e", "server", "workstation", "edition", "sxm4", "sxm5", "sxm6", "ac", "blackwell"}
# "8x NVIDIA H200", "8 x H200", "8×H200": a count in front of the name, as people write a node.
_COUNT = re.compile(r"^\s*(\d{1,4})\s*[x×]\s*(\S.*)$", re.IGNORECASE)


def split_count(text: str) -> tuple[int | None, str]:
    """("8x NVIDIA H200") -> (8, "NVIDIA H200"); a name without a count -> (None, name)."""
    match = _COUNT.match(text)
    if match is None:
        return None, text
    return int(match.group(1)), match.group(2).strip()


def name_keys(name: str) -> list[str]:
    """Normalised spellings of ``name`` to look up, most literal first: as typed, without the vendor
    prefix, then without packaging words too."""
    key = _key(name).replace("/", "-")
    keys = [key]
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix):]
            keys.append(key)
    tokens = re.split(r"-", key)
    stripped = "-".join(t for t in tokens if t not in _PACKAGING)
    if stripped and stripped not in keys:
        keys.append(stripped)
    return keys


def find_gpu(name: str | GpuSpec, *, spec_file: str | Path | None = None,
             memory_gib: float | None = None) -> GpuSpec:
    """The card named ``name`` (name or alias, case / space / '_' insensitive, also as nvidia-smi prints
    it) in the user GPU file ``spec_file`` or the built-in catalog; a ``GpuSpec`` is returned as is.
    ``memory_gib`` replaces its usable memory. An unknown name is a PlanError with the closest names."""
    if isinstance(name, GpuSpec):
        gpu = name
    else:
        gpus = load_gpus(spec_file)
        gpu = _lookup(name, gpus)
        if gpu is None:
            raise unknown_gpu(name, gpus)
    if memory_gib is not None:
        if not 0 < memory_gib <= NUMBER_BOUNDS["memory_gib"]:
            raise PlanError(f"--gpu-memory must be a positive number of GiB, got {memory_gib:g}")
        gpu = replace(gpu, memory_gib=float(memory_gib),
                      catalog_memory_gib=gpu.catalog_memory_gib or gpu.memory_gib)
    return gpu


def _lookup(name: str, gpus: Sequence[GpuSpec]) -> GpuSpec | None:
    for wanted in name_keys(name):
        for gpu in gpus:
            if wanted == _key(gpu.name) or wanted in (_key(a) for a in gpu.aliases):
                return gpu
    return None


def unknown_gpu(name: str, gpus: Sequence[GpuSpec]) -> PlanError:
    """The one-line error for a name no card answers to: the closest names, the catalog, --gpu-spec."""
    suggestion = " or ".join(closest_names(name, gpus))
    hint = f"did you mean {suggestion}? " if suggestion else ""
    known = ", ".join(f"{g.name} ({g.aliases[0]})" if g.aliases else g.name for g in gpus)
    return PlanError(f"unknown GPU {name!r}; {hint}known GPUs: {known}",
                     hint="another card: describe it in a --gpu-spec FILE (docs/plan.md, 'Your own GPU'); a MIG "
                          "slice or a shared card: a catalog card with --gpu-memory GIB")


def gpu_notes(gpu: GpuSpec) -> list[str]:
    """What the plan says about where its GPU facts came from when the user changed them."""
    notes = []
    if gpu.catalog_memory_gib is not None:
        notes.append(f"planned with {gpu.memory_gib:g} GiB usable per GPU (--gpu-memory), not the "
                     f"{gpu.catalog_memory_gib:g} GiB of a whole {gpu.name}")
    if gpu.spec_file:
        notes.append(f"{gpu.name}'s facts come from the GPU file {gpu.spec_file} (source: {gpu.source})")
    return notes


def _one_edit(a: str, b: str) -> bool:
    """``a`` and ``b`` differ by at most one inserted, deleted or replaced character."""
    if abs(len(a) - len(b)) > 1:
        return False
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return a[i + 1:] == b[i + 1:] or a[i:] == b[i + 1:] or a[i + 1:] == b[i:]


def closest_names(name: str, gpus: Sequence[GpuSpec]) -> list[str]:
    """Up to three spellings of catalog cards ``name`` is a misspelling of; never another card: a
    suggestion carries every number typed ("h100-nvl" is not an H200, "h300" neither H200 nor B300)."""
    spellings: dict[str, str] = {}  # normalised spelling -> the name to suggest
    for gpu in gpus:
        for spelling in (gpu.name, *gpu.aliases):
            spellings[_key(spelling)] = spelling
    wanted = name_keys(name)[-1]
    # Compare with and without dashes, so "rtxpro6000" and "rtx-6000-pro" find "rtx-pro-6000".
    squashed = {k.replace("-", ""): k for k in spellings}
    close = difflib.get_close_matches(wanted, list(spellings), n=3, cutoff=0.6)
    close += [squashed[k] for k in difflib.get_close_matches(wanted.replace("-", ""), list(squashed), n=3,
                                                             cutoff=0.6)]
    flat = wanted.replace("-", "")

    def same_card(key: str) -> bool:
        # the same letters reordered, or one character doubled or dropped ("h2000" -> h200, "h20o" ->
        # h20); never a changed character, and never a different first letter: a letter in front names
        # another product line ("gh200" is Grace Hopper, not an H200; "gb200" is not a B200)
        other = key.replace("-", "")
        if not other or not flat or other[0] != flat[0]:
            return False
        return sorted(other) == sorted(flat) or (abs(len(other) - len(flat)) == 1 and _one_edit(other, flat))

    def word_left_off(key: str) -> bool:
        # an alias typed without its trailing word ("rtx6000" for the alias "rtx6000-pro"): suggested, never
        # resolved, since the short name may be another card (RTX 6000 Ada)
        tokens = key.split("-")
        return len(tokens) > 1 and tokens[-1].isalpha() and "".join(tokens[:-1]) == flat

    shorter = [k for k in spellings if word_left_off(k)]
    return list(dict.fromkeys(spellings[k] for k in [*shorter, *close] if k in shorter or same_card(k)))[:3]
