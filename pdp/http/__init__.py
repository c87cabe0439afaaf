"""The PDP's HTTP edge: the decision and policy API (`api`), request authentication (`auth`),
the one JSON error body (`errors`)."""
