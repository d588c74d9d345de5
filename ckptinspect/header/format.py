"""The safetensors format's per-tensor rules, shared by both header decoders (typed.py, exact.py's caller
parser.py): the bits of every dtype and the reference's overflow rule for zero-element shapes."""

from __future__ import annotations

from ckptinspect.header.exact import U64_MAX

# Bits per element of every dtype string the safetensors format defines (safetensors/src/tensor.rs
# `enum Dtype`). Sub-byte types (F4, F6_*) are legal as long as the tensor's bit count is a whole
# number of bytes.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


def zero_shape_fits(shape) -> bool:
    """The reference multiplies dims left to right with overflow checks: [2**40, 2**40, 0] overflows."""
    product = 1
    for dim in shape:
        if type(dim) is not int or not 0 <= dim <= U64_MAX:
            return False
        product *= dim
        if product > U64_MAX:
            return False
    return True
