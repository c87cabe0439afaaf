# only plain queries run on a punctuated stream: a window (or a join) is refused, never run
# without the punctuations
curl -s -X DELETE -o /dev/null -H "Authorization: Bearer $LTA" $LTA_HANDLE
curl -s -H "Authorization: Bearer $LTA" -F "request=$ASK;type=application/xacml+json" \
     -F 'query={"window": {"type": "tuple", "size": 2, "step": 2, "aggregates": ["hr:avg"]}};type=application/json' \
     $GW/requests
