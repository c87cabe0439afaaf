# lta releases the handle; reading it now answers 410 Gone
curl -s -X DELETE -H "Authorization: Bearer $LTA" $HANDLE
