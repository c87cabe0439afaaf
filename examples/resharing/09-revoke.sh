# nea takes the grant option back (version 1.0 again): lta's handle is revoked, and with it,
# before the update returns, every handle on what lta derived; other's reader ends with
# `revoked`, no row after it
xsg policy update urn:xsg:example:weather:nea-policy policies/weather/nea-weather-policy.xml
wait $READER
grep -v '"heartbeat"' $ROWS | tail -n 1
