"""Rule files: where they live and the one way they are read.

Every rule file — families (``rules/families/*.yaml``), engines (``rules/engines/*.yaml``), GPUs
(``rules/gpus.yaml``) — is located under one root, read through one safe YAML loader
(``ckptinspect/safe_yaml.py``: no anchors or aliases, size and depth caps) and checked against its JSON
Schema by one validator, with one error form (``RuleError``: the file, the path inside the document, the
problem). ``readiness/loader.py`` builds the typed family rules on top of it, ``plan/rules.py`` the
engine and GPU rules. Every rule file's ``when:`` conditions are evaluated by one registry and
evaluator, ``ckptinspect/rules/conditions.py``, into which readiness and plan register theirs.
"""

from ckptinspect.rules.documents import (load_rule_document, parse_rule_document, plan_rule_schema, rules_root,
                                         schema_path, validate_document)

__all__ = ["load_rule_document", "parse_rule_document", "plan_rule_schema", "rules_root", "schema_path",
           "validate_document"]
