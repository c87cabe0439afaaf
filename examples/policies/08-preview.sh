# a rule compiled, summarised and tried on a sample consumer it describes; nothing stored
curl -s -H "Authorization: Bearer $NEA" -H 'Content-Type: application/json' \
     --data-binary @examples/policies/preview.json $GW/rules/preview |
     python -c 'import json, sys; a = json.load(sys.stdin); e = a["explain"]
print(a["summary"]); print(e["decision"], e["policies"]); print(e["sql"])'
