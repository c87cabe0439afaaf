# lta registers its handle's rows as a derived stream of its own (POST /handles/<id>/derive)
xsg stream --token $LTA derive $HANDLE lta-rain --description "weather windows, via lta"
