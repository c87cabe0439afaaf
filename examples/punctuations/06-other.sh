# other (consumer and medic) gets every reading, 103 without its temperature (the negative
# punctuation for medics hides it: null)
curl -sN -H "Authorization: Bearer $OTHER" -H 'Accept: application/x-ndjson' $OTHER_HANDLE |
     grep -m 5 '"row"'
