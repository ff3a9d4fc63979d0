"""Tenants kept in the store: records, validation, and the set the tables carry.

Pure: :mod:`.records` (records, validation, the table's tenant set). Edge:
:mod:`controlplane.services.tenants` (seed from the config file once, list,
put, remove, through the intent writer).
"""
