"""Whether the Hugging Face Hub may be contacted: the one place the offline variables are read.

huggingface_hub reads the same variables the same way (``HF_HUB_OFFLINE``, else the older
``TRANSFORMERS_OFFLINE``; 1 / ON / YES / TRUE, any case: huggingface_hub/constants.py ``_is_true``),
read at call time here so a test or a caller can change them between reads.
"""

from __future__ import annotations

import os

_TRUE = frozenset({"1", "ON", "YES", "TRUE"})


def hub_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return value is not None and value.strip().upper() in _TRUE
