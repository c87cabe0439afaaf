# one live query per consumer and stream: release this one before asking for another
curl -s -o /dev/null -w '%{http_code}\n' -X DELETE -H "Authorization: Bearer $LTA" $HANDLE
