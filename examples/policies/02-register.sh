# a stream of nea's for this page's policies
curl -s -o /dev/null -w '%{http_code}\n' -H "Authorization: Bearer $NEA" \
     -H 'Content-Type: application/json' --data-binary @examples/policies/station3.json $GW/streams
