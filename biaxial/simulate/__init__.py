"""``biaxial simulate``: reads a cluster and manifests from files, runs the real decision
code, prints placements and draws a picture. An application of the core, outside it.
"""
