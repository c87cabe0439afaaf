# the XACML side: every consumer may read the three attributes (bedside.yaml)
xsg policy add examples/punctuations/bedside.yaml
