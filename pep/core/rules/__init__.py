"""Sharing rules: a compact JSON form of what an owner grants on a stream, compiled to XACML.

- `model`: the rule (dataclasses) and its JSON form, errors naming the field (`RuleError`);
- `check`: a rule against its stream's schema;
- `xacml`: the compiler, rule -> XACML 3.0 Policy;
- `reading`: XACML -> grants (for the summary) and the decompiler, XACML -> rule;
- `summary`: one line saying what any policy grants.

Pure: lxml and `pdp`'s public names, like the rest of `pep.core`.
"""
from pep.core.rules.check import check_rule
from pep.core.rules.model import (
                                  AttributeMatch,
                                  RuleError,
                                  RuleWindow,
                                  SharingRule,
                                  Validity,
                                  Who,
                                  default_id,
                                  rule_from_json,
                                  rule_to_json,
)
from pep.core.rules.reading import read_policy, rule_from_reading, rule_from_xacml
from pep.core.rules.summary import CUSTOM, describe_policy
from pep.core.rules.xacml import event_attribute, rule_to_xacml

__all__ = ["SharingRule", "Who", "AttributeMatch", "RuleWindow", "Validity", "RuleError",
           "rule_from_json", "rule_to_json", "default_id", "check_rule", "rule_to_xacml",
           "event_attribute", "read_policy", "rule_from_xacml", "rule_from_reading",
           "describe_policy", "CUSTOM"]
