# a sharing rule instead of XACML (rule.json), then read back as YAML
curl -s -H "Authorization: Bearer $NEA" -H 'Content-Type: application/vnd.xsg.rule+json' \
     --data-binary @examples/policies/rule.json $GW/policies
curl -s -H "Authorization: Bearer $NEA" -H 'Accept: application/vnd.xsg.rule+yaml' \
     $GW/policies/urn:xsg:rule:station3:port-authority
