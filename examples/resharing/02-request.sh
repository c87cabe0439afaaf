# lta asks for the weather stream (eXACML+ Example 1): windows of 5 readings every 2
ANSWER=$(curl -s -H "Authorization: Bearer $LTA" -H 'Content-Type: application/xacml+xml' \
     --data-binary @policies/weather/lta-request.xml $GW/requests)
HANDLE=$(echo "$ANSWER" | python -c 'import json, sys; print(json.load(sys.stdin)["handle"])')
echo "$ANSWER" | python -c 'import json, sys; a = json.load(sys.stdin); print(a["handle"], "grant_option:", a.get("grant_option"))'
