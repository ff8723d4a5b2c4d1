"""Benchmarks of the suite's fast paths against their slow counterparts (run: `python -m benchmarks`).

Speed is measured here and only here; the test suite checks correctness and never times anything.
Every speed number in the table sits next to an agreement check computed in the same run.
"""
