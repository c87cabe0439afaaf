"""The Spark side of the gateway: sessions, sources, and the shared per-stream query.

Import the submodules (`pep.runtime.runtime`, `pep.runtime.session`, ...) directly; this package
file stays free of Spark imports so that `pep.runtime.plans.compile` and
`pep.runtime.windows.pane_windows` (pure Python) can be used and tested without a JVM.
"""
