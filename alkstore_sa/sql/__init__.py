"""Pure statement builders: Core statements, no I/O.

Identifiers come from the model ``Table`` objects (declared in the placeholder
schema ``pgboss``, translated at execution time); values are bind parameters.
Builders whose shape does not depend on their input are built once and cached.
"""
