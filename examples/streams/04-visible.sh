# now the PDP permits lta something on it, so lta sees it (its schema, never its source options)
curl -s -H "Authorization: Bearer $LTA" $GW/streams/gauge
