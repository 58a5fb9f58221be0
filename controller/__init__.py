"""The scheduler for pods with ``schedulerName: biaxial`` (``biaxial controller``): watch
caches, queue, decision (the ``driver`` core), crash-safe commit, deallocation, leader
election, metrics. Imports ``driver`` and ``kubeapi``; never ``kubeletplugin``."""
