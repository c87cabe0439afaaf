# lta shares it with other under its own rule (other-rule.yaml)
xsg policy --token $LTA add examples/resharing/other-rule.yaml
