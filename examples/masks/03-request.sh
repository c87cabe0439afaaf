# lta asks for the stream
HANDLE=$(curl -s -H "Authorization: Bearer $LTA" -H 'Content-Type: application/xacml+xml' \
     --data-binary @examples/masks/lta-request.xml $GW/requests |
     python -c 'import json, sys; print(json.load(sys.stdin)["handle"])')
echo $HANDLE
