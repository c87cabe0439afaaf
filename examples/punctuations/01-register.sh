# nea registers a stream whose records may carry security punctuations (source option
# "punctuations": "on"; set at registration, off by default)
curl -s -o /dev/null -w '%{http_code}\n' -H "Authorization: Bearer $NEA" \
     -H 'Content-Type: application/json' --data-binary @examples/punctuations/bedside.json $GW/streams
