# a decision: the subject is the token's (lta), whatever the request claims; JSON in, JSON out
curl -s -H "Authorization: Bearer $LTA" -H 'Content-Type: application/xacml+json' \
     -H 'Accept: application/xacml+json' --data-binary @policies/weather/lta-request.json $GW/pdp
