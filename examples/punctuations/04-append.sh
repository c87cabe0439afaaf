# AFTER the requests: five readings and four punctuations (readings.ndjson), in one batch:
# 101 before any punctuation; 102 for medics only; 103 for consumers, its temp not for
# medics; 104 and 105 under "tuples with hr > 120 for medics only"
curl -s -H "Authorization: Bearer $NEA" -H 'Content-Type: application/x-ndjson' \
     --data-binary @examples/punctuations/readings.ndjson $GW/streams/bedside/records
