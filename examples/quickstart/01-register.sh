# nea registers a stream of its own (station2.json), fed through the gateway's records API
curl -s -H "Authorization: Bearer $NEA" -H 'Content-Type: application/json' \
     --data-binary @examples/quickstart/station2.json $GW/streams
