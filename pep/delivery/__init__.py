"""Delivery of handles' rows through Kafka topics per plan: settings, the shared store of topics,
handles and edges, the gateway's side (topic housekeeping, revocations on the control topic)."""
