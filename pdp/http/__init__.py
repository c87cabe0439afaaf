"""The PDP's HTTP edge: the blueprint (`api`) over the decision route (`decisions`) and the PAP
(`policies`), what they work with (`context`), request authentication (`auth`), the one error
table and JSON error body (`errors`)."""
