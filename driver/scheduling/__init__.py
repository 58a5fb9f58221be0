"""The scheduling decision: policies, node filters, the KEP-5004 bridge, scoring and the
decision engine. The top band of the core.
"""
