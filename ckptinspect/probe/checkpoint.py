"""The checkpoint as the probe sees it: the report pipeline's own ``Report`` plus per-tensor locations.

The probe does not read the directory a second way. ``open_checkpoint`` runs the report pipeline
(source -> headers -> inventory -> rules) once; the tensors the probe may load are exactly the
inventory's, in the shards the source resolved (the index's shards, so an unindexed
``*.safetensors`` that engines ignore is never read), and the MTP assessment is the report's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ckptinspect.errors import CkptInspectError, ProbeError
from ckptinspect.probe.loader import TensorMeta


@dataclass(frozen=True)
class ProbeCheckpoint:
    report: Any  # ckptinspect.pipeline.Report
    family_rule: Any  # ckptinspect.readiness.model.FamilyRule | None
    metas: Mapping[str, TensorMeta]  # every tensor of the inventory -> dtype / shape / shard / size

    @property
    def checkpoint(self):
        return self.report.checkpoint

    @property
    def inventory(self):
        return self.report.checkpoint.inventory

    @property
    def probe_rule(self) -> Mapping[str, Any] | None:
        """The family rule file's ``probe:`` block (how to build the MTP head), None when absent."""
        if self.family_rule is None:
            return None
        block = self.family_rule.document.get("probe")
        return block if isinstance(block, Mapping) else None


def open_checkpoint(model_dir: str) -> ProbeCheckpoint:
    """Report + tensor locations for a local checkpoint directory; errors become ProbeError lines."""
    from ckptinspect.header.parser import parse_header
    from ckptinspect.pipeline import report_from_raw
    from ckptinspect.readiness import load_rules
    from ckptinspect.sources.local import open_local

    try:
        raw = open_local(Path(model_dir), ref=model_dir)
        report = report_from_raw(raw)
        metas: dict[str, TensorMeta] = {}
        for shard in raw.headers:  # the shards the source resolved (index first), never a directory glob
            header = parse_header(raw.headers[shard], source=f"{model_dir}/{shard}",
                                  file_size=raw.file_sizes.get(shard))
            for name, dtype, shape, nbytes in zip(header.names, header.dtypes, header.shapes, header.sizes):
                metas[name] = TensorMeta(name, dtype, tuple(shape), shard, nbytes)
    except ProbeError:
        raise
    except CkptInspectError as exc:  # same one-line message the report would print
        raise ProbeError(str(exc)) from None
    if not metas:
        raise ProbeError("no tensors in the checkpoint's safetensors shards (the probe never loads pickle "
                         "checkpoints)", path=model_dir)
    inventory_names = {n for g in report.checkpoint.inventory.groups for n in g.names()}
    absent = sorted(inventory_names - set(metas))
    if absent:  # both come from the same headers: a name only the inventory has is a reader bug, stop
        raise ProbeError(f"the inventory lists {len(absent)} tensor(s) the headers lack, e.g. {absent[0]!r}",
                         path=model_dir)
    # Load only what the inventory accounts for; a header tensor it does not list (seen: a few vision
    # tower names) is never needed by the probe, and a needed one surfaces as a missing tensor.
    metas = {n: m for n, m in metas.items() if n in inventory_names}
    family = None
    if report.checkpoint.family is not None:
        rules = load_rules()
        family = next((f for f in rules.families if f.id == report.checkpoint.family), None)
    return ProbeCheckpoint(report=report, family_rule=family, metas=metas)
