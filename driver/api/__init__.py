"""The API model: ids, quantities, devices and slices, claims and classes, nodes, validation,
errors. The lowest band: it imports nothing else of biaxial.
"""
