"""ckptinspect: what is in an LLM checkpoint, is its MTP draft layer usable, how to launch it."""

__version__ = "0.1.0"
