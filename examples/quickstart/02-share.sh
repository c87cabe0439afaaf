# what saving the rule would do to the live handles (nothing changed), then saved
xsg policy add examples/quickstart/rain.yaml --what-if
xsg policy add examples/quickstart/rain.yaml
