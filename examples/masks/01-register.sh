# nea registers a stream of ship positions, fed through the records API
curl -s -o /dev/null -w '%{http_code}\n' -H "Authorization: Bearer $NEA" \
     -H 'Content-Type: application/json' --data-binary @examples/masks/ships.json $GW/streams
