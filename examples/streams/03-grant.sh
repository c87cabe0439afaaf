# nea grants lta the readings over 2 (a sharing rule from flags, no file)
xsg policy new --stream gauge --subject lta --filter 'level > 2'
