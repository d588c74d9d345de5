"""MTP readiness: family rule files -> family match, MTP layout, per-engine verdicts.

Pipeline entry points (see docs/ARCHITECTURE.md)::

    ruleset = load_rules(extra_dirs)
    family = ruleset.match(config)
    templates = family.mtp_prefixes if family else GENERIC_MTP_PREFIXES
    mtp = assess_mtp(checkpoint, family, ruleset)
"""

from __future__ import annotations

from ckptinspect.readiness.loader import load_rules, read_rule_file
from ckptinspect.readiness.model import FamilyRule, RuleSet
from ckptinspect.readiness.templates import GENERIC_MTP_PREFIXES

__all__ = ["GENERIC_MTP_PREFIXES", "FamilyRule", "RuleSet", "assess_mtp", "load_rules", "read_rule_file"]


def assess_mtp(checkpoint, family, ruleset, **kwargs):  # type: ignore[no-untyped-def]
    """See :func:`ckptinspect.readiness.assess.assess_mtp` (imported lazily)."""
    from ckptinspect.readiness.assess import assess_mtp as _assess

    return _assess(checkpoint, family, ruleset, **kwargs)
