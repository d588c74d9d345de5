"""The ggml tensor types a GGUF file can name, with their block geometry.

Source: llama.cpp gguf-py/gguf/constants.py (``class GGMLQuantizationType`` ids and
``GGML_QUANT_SIZES``: elements per block, bytes per block), the same table ggml/src/ggml.c
``type_traits`` uses. Ids 4-5 (Q4_2/Q4_3) and 31-33, 36-38 were removed from ggml and are rejected
as unknown, as the reference reader does. tests/test_gguf_header.py checks this table against the
installed ``gguf`` package, so a new ggml type shows up as a failing test, not a silent mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass

QK_K = 256  # super-block size of the k-quants and i-quants (ggml-common.h QK_K)


@dataclass(frozen=True)
class GgmlType:
    id: int
    name: str  # GGUF / ggml spelling: Q4_K, IQ3_S, BF16, ...
    block_size: int  # elements per block
    type_size: int  # bytes per block
    bits: float  # bits per weight, the quality rank readiness rules compare

    def nbytes(self, elements: int) -> int:
        return elements // self.block_size * self.type_size


def _t(id_: int, name: str, block: int, size: int) -> GgmlType:
    return GgmlType(id_, name, block, size, round(size * 8 / block, 4))


GGML_TYPES: dict[int, GgmlType] = {t.id: t for t in (
    _t(0, "F32", 1, 4),
    _t(1, "F16", 1, 2),
    _t(2, "Q4_0", 32, 2 + 16),
    _t(3, "Q4_1", 32, 2 + 2 + 16),
    _t(6, "Q5_0", 32, 2 + 4 + 16),
    _t(7, "Q5_1", 32, 2 + 2 + 4 + 16),
    _t(8, "Q8_0", 32, 2 + 32),
    _t(9, "Q8_1", 32, 4 + 4 + 32),
    _t(10, "Q2_K", QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),
    _t(11, "Q3_K", QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    _t(12, "Q4_K", QK_K, 2 + 2 + QK_K // 2 + 12),
    _t(13, "Q5_K", QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    _t(14, "Q6_K", QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    _t(15, "Q8_K", QK_K, 4 + QK_K + QK_K // 8),
    _t(16, "IQ2_XXS", QK_K, 2 + QK_K // 4),
    _t(17, "IQ2_XS", QK_K, 2 + QK_K // 4 + QK_K // 32),
    _t(18, "IQ3_XXS", QK_K, 2 + QK_K // 4 + QK_K // 8),
    _t(19, "IQ1_S", QK_K, 2 + QK_K // 8 + QK_K // 16),
    _t(20, "IQ4_NL", 32, 2 + 16),
    _t(21, "IQ3_S", QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    _t(22, "IQ2_S", QK_K, 2 + QK_K // 4 + QK_K // 16),
    _t(23, "IQ4_XS", QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    _t(24, "I8", 1, 1),
    _t(25, "I16", 1, 2),
    _t(26, "I32", 1, 4),
    _t(27, "I64", 1, 8),
    _t(28, "F64", 1, 8),
    _t(29, "IQ1_M", QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    _t(30, "BF16", 1, 2),
    _t(34, "TQ1_0", QK_K, 2 + 4 * 13),
    _t(35, "TQ2_0", QK_K, 2 + 64),
    _t(39, "MXFP4", 32, 1 + 16),
    _t(40, "NVFP4", 64, 4 + 32),
    _t(41, "Q1_0", 128, 2 + 16),
)}

GGML_TYPE_BY_NAME: dict[str, GgmlType] = {t.name: t for t in GGML_TYPES.values()}

# Names that are not quantized weights: readiness never calls them "below Q6/Q8".
FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})
INTEGER_TYPES = frozenset({"I8", "I16", "I32", "I64"})
