# lta (consumer, not medic) gets 101 (no punctuation yet: the policy alone decides), 103 and
# 105; never 102 (medics only) nor 104 (hr over 120: medics only)
curl -sN -H "Authorization: Bearer $LTA" -H 'Accept: application/x-ndjson' $LTA_HANDLE |
     grep -m 3 '"row"'
