# lta asks for the stream: 201 with a handle URI (and its plan, warnings and SQL text)
HANDLE=$(curl -s -H "Authorization: Bearer $LTA" -H 'Content-Type: application/xacml+xml' \
     --data-binary @examples/quickstart/lta-request.xml $GW/requests |
     python -c 'import json, sys; print(json.load(sys.stdin)["handle"])')
echo $HANDLE
