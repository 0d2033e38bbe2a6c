"""Test-wide setup. Hypothesis is imported here, before any test starts a thread: CPython 3.11
can raise "AST constructor recursion depth mismatch" when pytest's assertion rewriting compiles
a lazily imported plugin module while another thread compiles code at the same time."""

import hypothesis
import hypothesis.internal.conjecture.providers  # noqa: F401
