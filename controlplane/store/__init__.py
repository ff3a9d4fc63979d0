"""Where membership, operator intent and leadership live: etcd in production, memory for one process.

:mod:`.base` is the store's interface and its key layout; :mod:`.memory`
the embedded store; :mod:`.etcd` with :mod:`.etcdstreams` the etcd one.
:mod:`.mirror` keeps a live copy of a prefix. The store is the bottom layer:
it knows keys and bytes, never a domain record (operator intent is decoded
above it, in :mod:`controlplane.intent`). docs/store.md tells the whole story.
"""
