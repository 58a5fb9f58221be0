"""The kubelet's plugin gRPC APIs (registration, DRA v1/v1beta1, resource health v1alpha1/v1):
``*.proto`` sources written from the upstream definitions (package names and field numbers
exact, so the kubelet's calls reach them) and the generated modules in ``gen/``."""
