"""placer's benchmarks (``make bench``): figures quoted in the README, not timed tests."""
