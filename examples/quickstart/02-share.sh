# nea saves the rule (rain.yaml); `--what-if` first would say what it does to live handles
xsg policy add examples/quickstart/rain.yaml
