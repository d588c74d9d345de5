"""MTP readiness: family rule files -> family match, MTP layout, per-engine verdicts, MTP cost.

Pipeline entry points (see docs/architecture.md)::

    ruleset = load_rules(extra_dirs)            # RuleError on a bad rule file
    family = ruleset.match(config)              # FamilyRule | None
    templates = family.mtp_prefixes if family else GENERIC_MTP_PREFIXES
    mtp = assess_mtp(checkpoint, family, ruleset)
    cost = mtp_cost(checkpoint, mtp, tp=8, ep=8)
"""

from __future__ import annotations

from ckptinspect.inventory.mtp_prefix import GENERIC_MTP_PREFIXES
from ckptinspect.readiness.assess import assess_mtp
from ckptinspect.readiness.cost import MtpCost, mtp_cost
from ckptinspect.readiness.loader import load_rules, read_rule_file
from ckptinspect.readiness.model import FamilyRule, RuleSet

__all__ = ["GENERIC_MTP_PREFIXES", "FamilyRule", "MtpCost", "RuleSet", "assess_mtp", "load_rules", "mtp_cost",
           "read_rule_file"]
