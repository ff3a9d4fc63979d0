"""Where membership, operator intent and leadership live: etcd in production, memory for one process.

:mod:`.base` is the store's interface and its key layout; :mod:`.memory`
the embedded store; :mod:`.etcd` with :mod:`.etcdstreams` the etcd one.
:mod:`.mirror` keeps a live copy of a prefix, :mod:`.intent` mirrors
operator intent, and :mod:`.writer` is the one way operator intent is
written (check, conditional put, wait for the echo and the tables).
docs/store.md tells the whole story.
"""
