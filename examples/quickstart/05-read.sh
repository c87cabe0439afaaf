# lta reads its handle: the first window (grep stops at it; curl ends at the next heartbeat)
curl -sN -H "Authorization: Bearer $LTA" -H 'Accept: application/x-ndjson' $HANDLE |
     grep -m 1 '"row"'
