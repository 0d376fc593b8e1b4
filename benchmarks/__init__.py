"""Speed and memory benchmarks (scripts; results in benchmarks/README.md)."""
