# nea registers a restricted stream: seen only by its owner, administrators, and callers a
# policy permits on it
curl -s -H "Authorization: Bearer $NEA" -H 'Content-Type: application/json' \
     --data-binary @examples/streams/gauge.json $GW/streams
