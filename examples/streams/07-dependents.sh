# before deleting: what would go (live handles, joins, events) and what becomes of each policy
curl -s -H "Authorization: Bearer $NEA" "$GW/streams/gauge/dependents?remove_policies=true"
