# the join's handle; the join sees only what is written to its streams from now on
HANDLE=$(curl -s -H "Authorization: Bearer $OTHER" -H 'Content-Type: application/xacml+xml' \
     --data-binary @policies/joins/port-authority-join-request.xml $GW/requests |
     python -c 'import json, sys; print(json.load(sys.stdin)["handle"])')
echo $HANDLE
