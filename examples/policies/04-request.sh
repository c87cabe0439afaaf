# lta asks for station3 (a handle, so that the next steps have a live handle to re-decide)
curl -s -o /dev/null -w '%{http_code}\n' -H "Authorization: Bearer $LTA" \
     -H 'Content-Type: application/xacml+xml' \
     --data-binary @examples/policies/lta-request.xml $GW/requests
