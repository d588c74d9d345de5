"""Draft-acceptance probe: how well a checkpoint's MTP head predicts its own main model.

Torch-only subpackage, but for ``options.py`` (``ProbeOptions``, torch-free, re-exported as
``ckptinspect.api.ProbeOptions``). The rest is imported only when a probe runs (``api.probe``), so
``ckptinspect report`` and ``ckptinspect --help`` never pull in torch or transformers. Entry point:
``ckptinspect.probe.runner.run_probe(model, options) -> ProbeResult``.

Stages (one module each):
    options.py   ProbeOptions: every option of a run, typed, with its default, checked when built
    loader.py    checkpoint dir -> main model in transformers (dequantizing NVFP4 / FP8 / MXFP4 on load)
    heads/       MTP head per family (transformers' MtpModel, or the fusion head built from YAML data)
    chain.py     one MTP layer chained K times over every position at once (stream attention mask)
    walk.py      replay of the greedy verify walk -> accepted-drafts histogram
    metrics.py   per-depth rates, accept lengths, confidence intervals
    cost.py      roofline cost of one verify step -> projected speedup vs batch size
"""
