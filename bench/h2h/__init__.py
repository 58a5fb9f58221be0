"""The head-to-head with kube-scheduler (``python -m bench.vs_kube_scheduler``)."""
