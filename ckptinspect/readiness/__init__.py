"""MTP readiness: family rule files -> family match, MTP layout, per-engine verdicts.

Pipeline entry points (see docs/architecture.md)::

    ruleset = load_rules(extra_dirs)            # RuleError on a bad rule file
    family = ruleset.match(config)              # FamilyRule | None
    templates = family.mtp_prefixes if family else GENERIC_MTP_PREFIXES
    mtp = assess_mtp(checkpoint, family, ruleset)

What the MTP layer costs per GPU is the planner's (plan/mtp_cost.py: it uses the plan's memory model);
readiness never imports plan (.importlinter).
"""

from __future__ import annotations

from ckptinspect.inventory.mtp_prefix import GENERIC_MTP_PREFIXES
from ckptinspect.readiness.assess import assess_mtp
from ckptinspect.readiness.loader import load_rules, read_rule_file
from ckptinspect.readiness.model import FamilyRule, RuleSet

__all__ = ["GENERIC_MTP_PREFIXES", "FamilyRule", "RuleSet", "assess_mtp", "load_rules", "read_rule_file"]
