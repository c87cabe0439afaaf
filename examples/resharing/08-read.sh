# other reads its handle (a reader left running): lta's windows (averages 8, 10 and 12) as
# lta's rule shows them, the two that reach 10
ROWS=$(mktemp)
curl -sN -H "Authorization: Bearer $OTHER" -H 'Accept: application/x-ndjson' $OTHER_HANDLE \
     > $ROWS &
READER=$!
for i in $(seq 200); do [ "$(grep -c '"row"' $ROWS)" -ge 2 ] && break; sleep 0.2; done
grep '"row"' $ROWS
