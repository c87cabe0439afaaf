# the port authority (other) asks what its join of ais and routes would give: one decision per
# side, each side's plan, and the join's SQL text; nothing started
curl -s -H "Authorization: Bearer $OTHER" -H 'Content-Type: application/xacml+xml' \
     --data-binary @policies/joins/port-authority-join-request.xml $GW/explain |
     python -c 'import json, sys; a = json.load(sys.stdin); print(a["decision"]); print(a["sql"])'
