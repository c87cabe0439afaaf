# a policy written in XACML: 201, with what it grants in one line
curl -s -H "Authorization: Bearer $NEA" -H 'Content-Type: application/xacml+xml' \
     --data-binary @examples/policies/station3-policy.xml $GW/policies
