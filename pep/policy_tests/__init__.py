"""Policy tests (`xsg policy test`): test files (YAML) that say, for a policy set, which request
gets which decision and obligations, and for a stream, which records, request and user query
give exactly which rows, run without a gateway (the PDP in process, the streams on a local
Spark). `spec` reads a file (every mistake with its file and line), `sources` the policy files
it names, `run` decides and compares, `streams` runs the stream cases through the gateway's own
catalogue, planning and runtime, `report` prints and writes JUnit XML."""
from __future__ import annotations

from pep.policy_tests.run import CaseResult, Loaded, load, run, test_files
from pep.policy_tests.spec import SpecError, read_test_file

__all__ = ["CaseResult", "Loaded", "load", "run", "test_files", "SpecError", "read_test_file"]
