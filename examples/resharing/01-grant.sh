# nea publishes version 1.1 of its weather policy: LTA's grant now carries the grant option
xsg policy update urn:xsg:example:weather:nea-policy examples/resharing/nea-weather-policy.xml
