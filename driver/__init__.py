"""biaxial's pure core, in bands; a band imports only the bands below it (import-linter checks):

* ``driver.api`` -- ids, quantities, the device / slice / claim / node model, validation,
  errors;
* ``driver.cel.engine`` -- the DRA CEL environment (libraries, cost, caching);
* ``driver.discovery`` -- NVML backends (real, fake profiles), the node's device table, the
  slice builder;
* ``driver.structured`` -- the cluster snapshot and the structured-parameter allocator;
* ``driver.scheduling`` -- policies, node filters, the KEP-5004 bridge and its dialects,
  scoring, the decision engine.

Nothing here talks to Kubernetes or gRPC; NVML is imported only by
``driver.discovery.real``, lazily. Everything is deterministic and testable without a cluster.
"""
