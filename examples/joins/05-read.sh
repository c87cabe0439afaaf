# the first joined row: the ship's position (ais side) with its route (routes side); the
# consignee, which the routes policy hides, is not there
curl -sN -H "Authorization: Bearer $OTHER" -H 'Accept: application/x-ndjson' $HANDLE |
     grep -m 1 '"row"'
