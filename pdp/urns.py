"""XACML 3.0's identifiers that more than one module of the gateway names, in one place.

The PDP reads them in requests and policies; the PEP writes them into requests, policies it
compiles (sharing rules) and placeholders (`{subject:...}` names a category). `pdp` imports no
`pep`, so they live here and both sides import them from this module under its names, or under
a local alias where a module's own vocabulary reads better.
"""
from __future__ import annotations

XACML_NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"

# attribute categories
ACCESS_SUBJECT = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
RESOURCE = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
ACTION = "urn:oasis:names:tc:xacml:3.0:attribute-category:action"
ENVIRONMENT = "urn:oasis:names:tc:xacml:3.0:attribute-category:environment"

# attribute identifiers
SUBJECT_ID = "urn:oasis:names:tc:xacml:1.0:subject:subject-id"
SUBJECT_ROLE = "urn:oasis:names:tc:xacml:2.0:subject:role"
RESOURCE_ID = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"
ACTION_ID = "urn:oasis:names:tc:xacml:1.0:action:action-id"
CURRENT_TIME = "urn:oasis:names:tc:xacml:1.0:environment:current-time"
CURRENT_DATE = "urn:oasis:names:tc:xacml:1.0:environment:current-date"
CURRENT_DATETIME = "urn:oasis:names:tc:xacml:1.0:environment:current-dateTime"

# functions and data types named outside the function and datatype tables
FUNCTION_PREFIX = "urn:oasis:names:tc:xacml:1.0:function:"
STRING_EQUAL = FUNCTION_PREFIX + "string-equal"
STRING = "http://www.w3.org/2001/XMLSchema#string"

__all__ = ["XACML_NS", "ACCESS_SUBJECT", "RESOURCE", "ACTION", "ENVIRONMENT", "SUBJECT_ID",
           "SUBJECT_ROLE", "RESOURCE_ID", "ACTION_ID", "CURRENT_TIME", "CURRENT_DATE",
           "CURRENT_DATETIME", "FUNCTION_PREFIX", "STRING_EQUAL", "STRING"]
