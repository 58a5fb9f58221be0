"""The DRA CEL environment: compiling and evaluating device selectors with upstream's
semantics, its libraries, cost and caching. Imports only ``driver.api``.
"""
