# a stream whose owner did not enable punctuations refuses such a record, saying where
curl -s -H "Authorization: Bearer $NEA" -H 'Content-Type: application/x-ndjson' \
     --data-binary '{"$punctuation": {"srp": ["medic"], "ts": 1}}' $GW/streams/weather/records
echo
# and a punctuation that cannot be read is refused with the whole batch
curl -s -H "Authorization: Bearer $NEA" -H 'Content-Type: application/x-ndjson' \
     --data-binary '{"$punctuation": {"srp": ["medic"], "ts": 4, "ddp": {"attributes": ["pulse"]}}}' \
     $GW/streams/bedside/records
