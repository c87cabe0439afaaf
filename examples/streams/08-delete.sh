# the deletion, with its policy, its files kept for an hour; the name stays reserved to nea
xsg stream delete gauge --remove-policies --keep-data 3600
curl -s -H "Authorization: Bearer $NEA" $GW/streams/gauge
