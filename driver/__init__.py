"""biaxial's pure core: device model, quantities, CEL, slices, allocator, scorer, bridge.

Nothing in this package talks to Kubernetes, gRPC or NVML directly (NVML lives behind
``driver.nvml`` and is imported lazily). Everything here is deterministic and testable
without a cluster.
"""

DEFAULT_DRIVER_NAME = "gpu.biaxial.dev"
