# a window on a punctuated stream counts only the tuples the consumer's segments let it see:
# lta's average heart rate over every two readings it may see, from now on
curl -s -X DELETE -o /dev/null -H "Authorization: Bearer $LTA" $LTA_HANDLE
LTA_WINDOW=$(curl -s -H "Authorization: Bearer $LTA" -F "request=$ASK;type=application/xacml+json" \
     -F 'query={"window": {"type": "tuple", "size": 2, "step": 2, "aggregates": ["hr:avg"]}};type=application/json' \
     $GW/requests | python -c 'import json, sys; print(json.load(sys.stdin)["handle"])')
echo $LTA_WINDOW
# five more readings (more.ndjson): 106 and 107 for consumers, 108 for medics only, 109 and
# 110 for consumers again
curl -s -H "Authorization: Bearer $NEA" -H 'Content-Type: application/x-ndjson' \
     --data-binary @examples/punctuations/more.ndjson $GW/streams/bedside/records
# 108 is in none of lta's windows and moves no boundary: avg(106, 107), avg(109, 110)
curl -sN -H "Authorization: Bearer $LTA" -H 'Accept: application/x-ndjson' $LTA_WINDOW |
     grep -m 2 '"row"'
