"""eventguard's benchmarks: ``python -m benchmarks`` runs them all and writes RESULTS.md."""
