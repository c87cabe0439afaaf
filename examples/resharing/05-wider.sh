# a rule wider than lta's own grant is refused when it is written, saying what is wider
curl -s -H "Authorization: Bearer $LTA" -H 'Content-Type: application/vnd.xsg.rule+yaml' \
     --data-binary @examples/resharing/too-wide.yaml $GW/policies
