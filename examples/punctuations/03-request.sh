# lta (role consumer) and other (roles consumer and medic, among others) ask for the stream
ASK='{"Request": {"Resource": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id", "Value": "bedside"}]}, "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id", "Value": "read"}]}}}'
LTA_HANDLE=$(curl -s -H "Authorization: Bearer $LTA" -H 'Content-Type: application/xacml+json' \
     --data-binary "$ASK" $GW/requests | python -c 'import json, sys; print(json.load(sys.stdin)["handle"])')
OTHER_HANDLE=$(curl -s -H "Authorization: Bearer $OTHER" -H 'Content-Type: application/xacml+json' \
     --data-binary "$ASK" $GW/requests | python -c 'import json, sys; print(json.load(sys.stdin)["handle"])')
echo $LTA_HANDLE; echo $OTHER_HANDLE
