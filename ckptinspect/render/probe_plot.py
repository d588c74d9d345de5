"""--plot: acceptance per depth and projected speedup vs batch size (matplotlib, optional)."""

from __future__ import annotations

from ckptinspect.errors import ProbeError


def write_probe_plot(result, path: str) -> None:
    """`probe --plot`: acceptance per depth and projected speedup as a PNG (matplotlib, optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ProbeError("--plot needs matplotlib (pip install matplotlib)") from exc
    from ckptinspect.render.probe_out import probe_json

    d = probe_json(result)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    depths = d["overall"]["depths"]
    ks = [r["k"] for r in depths]
    a1.plot(ks, [r["conditional"] or 0 for r in depths], "o-", label="conditional")
    a1.plot(ks, [r["unconditional"] or 0 for r in depths], "s--", label="unconditional")
    a1.set(xlabel="draft depth k", ylabel="greedy acceptance", ylim=(0, 1), title=d["model"][-40:])
    a1.legend()
    for k in sorted({k for row in d["cost_model"]["speedup"] for k in row["by_steps"]}, key=int):
        rows = d["cost_model"]["speedup"]
        a2.plot([r["batch"] for r in rows], [r["by_steps"][k] for r in rows], "o-", label=f"K={k}")
    a2.axhline(1.0, color="grey", lw=0.8)
    a2.set(xscale="log", xlabel="batch size", ylabel="projected speedup", title=d["cost_model"]["gpu"])
    a2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
