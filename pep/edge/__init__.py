"""Edge processes (`xsg edge`): stateless readers of plan topics that serve handle reads
(pep/delivery, docs/operate/edges.md)."""
