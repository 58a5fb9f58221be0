"""The node agent (``biaxial kubelet-plugin``): registration and DRA gRPC services on unix
sockets, Prepare/Unprepare (CDI, sharing limits, checkpoint), the ResourceSlice publisher and
the NVML health watch. Imports ``driver`` and ``kubeapi``; never ``controller``."""
