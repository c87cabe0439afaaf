# AFTER the request (a join sees only later batches): the routes owner reports ship 244000013's
# next leg, stamped now, to meet the ship's positions on the ais stream
printf '{"mmsi": 244000013, "next_leg": "Los Angeles", "free_load": 40, "eta": "2027-01-15T00:00:00Z", "consignee": "ACME", "ts": "%s"}\n' \
     "$(date -u +%Y-%m-%dT%H:%M:%SZ)" |
curl -s -H "Authorization: Bearer $NEA" -H 'Content-Type: application/x-ndjson' \
     --data-binary @- $GW/streams/routes/records
