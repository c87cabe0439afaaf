# nea appends ten readings to weather (rain rates 6 to 15 mm/h)
curl -s -H "Authorization: Bearer $NEA" -H 'Content-Type: application/x-ndjson' \
     --data-binary @examples/resharing/weather.ndjson $GW/streams/weather/records
