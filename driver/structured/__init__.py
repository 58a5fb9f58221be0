"""Structured-parameter allocation with upstream's semantics: the immutable cluster snapshot
and the allocator. Imports ``driver.api`` and ``driver.cel``.
"""
