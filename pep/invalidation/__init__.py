"""Cache invalidation for caching proxies: the protocol (`protocol`, shared with proxy/) and the
gateway's hub that publishes it (`hub`)."""
