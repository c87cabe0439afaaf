# the derived stream stays lta's, with nothing new to read; asking for it again is 410
xsg stream --token $LTA derivation lta-rain |
     python -c 'import json, sys; d = json.load(sys.stdin); print(d["state"], d["chain"])'
curl -s -o /dev/null -w '%{http_code}\n' -H "Authorization: Bearer $OTHER" \
     -H 'Content-Type: application/xacml+json' \
     --data-binary '{"Request": {"Resource": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id", "Value": "lta-rain"}]}, "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id", "Value": "read"}]}}}' \
     $GW/requests
