"""Benchmarks (``make bench``, ``make bench-emulator``): each module prints one table."""
