"""placer's benchmarks (``make bench``): the figures of docs/performance.md, not timed tests."""
