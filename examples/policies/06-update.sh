# the new version, saved: lta's handle is revoked (its reader gets `revoked`)
xsg policy update urn:xsg:example:station3 examples/policies/station3-policy-v2.xml
