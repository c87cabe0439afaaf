# what would lta's request with its own query give? decision, plan, SQL text; nothing started
curl -s -H "Authorization: Bearer $LTA" -H 'Content-Type: application/xacml+xml' \
     --data-binary @policies/weather/lta-request-with-query.xml $GW/explain |
     python -c 'import json, sys; a = json.load(sys.stdin); print(a["decision"]); print(a["sql"])'
