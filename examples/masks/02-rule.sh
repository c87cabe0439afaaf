# the rule with masks (traffic.yaml)
xsg policy add examples/masks/traffic.yaml
