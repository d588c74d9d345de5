"""Whether the Hugging Face Hub may be contacted: huggingface_hub's own answer.

``huggingface_hub.constants.is_offline_mode()`` (HF_HUB_OFFLINE, else the older TRANSFORMERS_OFFLINE;
1 / ON / YES / TRUE, any case), read where huggingface_hub reads it: when huggingface_hub is first
imported. A program that sets the variable later changes neither huggingface_hub's downloads nor this
tool's reads; one that must switch at run time sets ``huggingface_hub.constants.HF_HUB_OFFLINE``, and
both follow.
"""

from __future__ import annotations


def hub_offline() -> bool:
    from huggingface_hub import constants

    return constants.is_offline_mode()
