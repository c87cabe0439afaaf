# how several applicable grants combine on this stream: union (ASSIST) instead of intersection
curl -s -X PATCH -H "Authorization: Bearer $NEA" -H 'Content-Type: application/json' \
     -d '{"combining": "union"}' $GW/streams/gauge
