# the policies are deleted (a deletion revokes the handles that depended on them)
xsg policy delete urn:xsg:example:station3
xsg policy delete urn:xsg:rule:station3:port-authority
