# a consumer may ask for a coarser mask, never a finer one: speeds to the unit are refused
curl -s -H "Authorization: Bearer $LTA" \
     -F 'request=@examples/masks/lta-request.xml;type=application/xacml+xml' \
     -F 'query={"mask": {"speed": "round:1"}};type=application/json' $GW/requests
