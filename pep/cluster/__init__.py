"""Several gateway processes on one PostgreSQL store, acting as one gateway.

`xsg serve --cluster` processes started on the same `store` (and the same `data_dir`, a folder
every process reaches at the same path) form one gateway:

- **Members** (`store.ClusterStore`): each process is a row (its id, the URL the others reach it
  at, when it was last seen), renewed with its leases.
- **Leases** (`placement.Placement`): a stream's query runs in exactly one process, the one
  holding the stream's lease (a row: holder, epoch, expiry by the database's clock). Every
  handle of the stream, its buffer and readers, its appended records and its events live
  there; a join holds the leases of both its streams (they move together). A lease is taken
  when the stream is first needed (a request, an append, a reader of a handle no live process
  serves) and renewed every `lease_seconds / 5`; a process that cannot renew stops serving its
  streams `LET_GO_AT` of the lease after its last renewal (before the lease can expire, so no
  two processes deliver one stream), and a lease that expires is taken by another process,
  which resumes the stream's handles from its checkpoint.
- **Forwarding** (`forward.ForwardRoute`): any process accepts any request; one that concerns
  a stream another process serves is answered by that process, the request forwarded and its
  answer relayed (a handle stream too, on the event loop).
- **Announcements** (`announce.Announcements`): a change is committed once and announced with
  PostgreSQL NOTIFY; every process applies it (policies in store-version order, the catalogue
  read again), re-decides its own live handles, and acknowledges; the writer answers once every
  live process acknowledged (or `ACK_TIMEOUT` passed). A process that missed announcements
  (its listening connection lost) catches up by version when it reconnects, and every few
  seconds regardless.
- **Shared rules** (`windows.StoreWindows`, `PrivacyLedger(shared=True)`): the one-window rule
  and the privacy budgets are checked inside the store's transactions.

`node.ClusterNode` composes these and wires them into a gateway's services.
"""
