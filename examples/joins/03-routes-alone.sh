# routes alone is refused: its policy grants it to the port authority only joined with ais
curl -s -o /dev/null -w '%{http_code}\n' -H "Authorization: Bearer $OTHER" \
     -H 'Content-Type: application/xacml+xml' \
     --data-binary @examples/joins/routes-request.xml $GW/requests
