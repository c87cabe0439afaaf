# AFTER the request (a handle starts at the stream's end): three positions, two of one ship
curl -s -H "Authorization: Bearer $NEA" -H 'Content-Type: application/x-ndjson' \
     --data-binary @examples/masks/positions.ndjson $GW/streams/ships/records
