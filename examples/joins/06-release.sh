curl -s -X DELETE -H "Authorization: Bearer $OTHER" $HANDLE
