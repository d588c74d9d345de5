"""The four answers to "what does this engine build for this module" (quant/engine_decision.py and the
per-engine procedure modules beside it share them, so a finding reads the same whichever decided)."""

QUANTIZED, UNQUANTIZED, ERROR, UNKNOWN = "quantized", "unquantized", "error", "unknown"
