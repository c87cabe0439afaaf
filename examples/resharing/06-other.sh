# other asks for lta's derived stream: decided by lta's rule
OTHER_HANDLE=$(curl -s -H "Authorization: Bearer $OTHER" -H 'Content-Type: application/xacml+json' \
     --data-binary '{"Request": {"Resource": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id", "Value": "lta-rain"}]}, "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id", "Value": "read"}]}}}' \
     $GW/requests | python -c 'import json, sys; print(json.load(sys.stdin)["handle"])')
echo $OTHER_HANDLE
