"""Started by scripts/coverage.sh through PYTHONPATH: every Python process of the test run
(the pytest driver, Ray's workers and actors, forked children) measures its own lines."""

try:
    import coverage

    coverage.process_startup()
except ImportError:  # coverage not installed: nothing to measure
    pass
