# a coarser grid is granted: the plan's SQL text shows each masked column's expression
curl -s -H "Authorization: Bearer $LTA" \
     -F 'request=@examples/masks/lta-request.xml;type=application/xacml+xml' \
     -F 'query={"mask": {"lat,lon": "grid:0.5"}};type=application/json' $GW/requests |
     python -c 'import json, sys; print(json.load(sys.stdin)["sql"])'
