"""The HTTP server of the gateway and of the proxy: one process, uvicorn's event loop on a thread
of its own, a strict HTTP/1.1 wire, and a WSGI (Flask) app behind it whose routes run on a thread
pool while bodies and streams are read and written by the loop.

It knows HTTP and nothing of what it serves (no XACML, no streams, no handles): an app talks to
it through the WSGI environ and a few typed protocols. The modules:

- `serving`: `HttpServer` (bind, start, quiesce, stop; connection and time limits, TLS, trusted
  forwarders) and what a server process tunes (`tune_gc`, `limit_malloc_arenas`,
  `run_until_signal`);
- `protocol`: the strict HTTP/1.1 wire (uvicorn's httptools protocol with the checks it leaves
  out: Host, target, framing, head size and time);
- `cycle`: a sized response's head and body in one write;
- `bridge`: the ASGI app in front of the WSGI app (bodies read on the loop, routes on the pool,
  an app's `NativeRoute`s and `FastPath` before it);
- `pool`: the thread pool the routes run on;
- `streaming`: long-lived bodies the loop writes (`StreamBody`, woken through a `Wake`).

`server` imports nothing of `pdp`, `pep`, `proxy` or `common`, nor Flask (`tests/test_layout.py`).
"""
