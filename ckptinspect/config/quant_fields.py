"""Type checks of the quantization-config fields whose values later code computes with.

ckptinspect/quant/declared.py reads ``weight_block_size`` as integers and ``config_groups`` as an object
of objects; a checkpoint from a stranger can hold anything there (``["a", 128]``, ``[null]``,
``[1e400]``, a list of groups). Checking the types once, where the config enters the pipeline, turns
each into one ConfigError line naming the file and the field instead of a traceback further down.
"""

from __future__ import annotations

from typing import Any, Mapping

from ckptinspect.errors import ConfigError

# Where config.json keeps its quantization config (the order quant/declared.py reads them in).
QUANT_CONFIG_PATHS = ("quantization_config", "text_config.quantization_config", "compression_config")


def check_quant_fields(config: Mapping[str, Any], hf_quant: Any, *, config_source: str = "config.json",
                       quant_source: str = "hf_quant_config.json") -> None:
    """Raise ConfigError when a quantization field has a type the readers cannot use."""
    for dotted in QUANT_CONFIG_PATHS:
        node = _dig(config, dotted)
        if isinstance(node, dict):
            _check_node(node, dotted, config_source)
    if isinstance(hf_quant, dict):
        node = hf_quant.get("quantization", hf_quant)
        if isinstance(node, dict):
            _check_node(node, "quantization" if "quantization" in hf_quant else "", quant_source)


def _check_node(node: Mapping[str, Any], where: str, source: str) -> None:
    prefix = f"{where}." if where else ""
    block = node.get("weight_block_size")
    if block is not None:
        if (not isinstance(block, list) or not block
                or not all(type(b) is int and b > 0 for b in block)):
            raise ConfigError(f"'{prefix}weight_block_size' must be a list of positive integers, got "
                              f"{_short(block)}", path=source)
    groups = node.get("config_groups")
    if groups is not None:
        if not isinstance(groups, dict):
            raise ConfigError(f"'{prefix}config_groups' must be an object of named groups, got "
                              f"{type(groups).__name__} {_short(groups)}", path=source)
        for name, group in groups.items():
            if not isinstance(group, dict):
                raise ConfigError(f"'{prefix}config_groups.{name}' must be an object, got {_short(group)}",
                                  path=source)


def _dig(node: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
