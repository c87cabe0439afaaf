# nea appends ten readings (records.ndjson: rain rates 2, 4, ..., 20)
curl -s -H "Authorization: Bearer $NEA" -H 'Content-Type: application/x-ndjson' \
     --data-binary @examples/quickstart/records.ndjson $GW/streams/station2/records
