"""GPU discovery and publishing: the NVML backends (real, fake profiles), what they report,
and the slice builder. Imports only ``driver.api``.
"""
