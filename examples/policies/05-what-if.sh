# what would version 2 (rain over 20 instead of 10) do to the live handles? nothing is applied
curl -s -X PUT -H "Authorization: Bearer $NEA" -H 'Content-Type: application/xacml+xml' \
     --data-binary @examples/policies/station3-policy-v2.xml \
     "$GW/policies/urn:xsg:example:station3?dry_run=true"
