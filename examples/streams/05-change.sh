# the owner lists it, describes it, sets its lateness and retention and adds an attribute
# (change.json); the answer says what was added and how many live handles were revoked
curl -s -X PATCH -H "Authorization: Bearer $NEA" -H 'Content-Type: application/json' \
     --data-binary @examples/streams/change.json $GW/streams/gauge
