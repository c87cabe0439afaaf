# what lta gets: the same pseudonym for the same ship, the grid cell's south-west corner, the
# lower edge of the speed's band, the minute
curl -sN -H "Authorization: Bearer $LTA" -H 'Accept: application/x-ndjson' $HANDLE |
     grep -m 3 '"row"'
