# for lta, whom no policy permits yet, the stream does not exist: the same 404 as for a name
# no stream has
curl -s -H "Authorization: Bearer $LTA" $GW/streams/gauge
curl -s -H "Authorization: Bearer $LTA" $GW/streams/no-such-stream
