"""Control planes beside each other on one store: leadership, followers, and the fleet they share.

Pure: :mod:`.remote` (the other control planes' members and the merge with
this one's), :mod:`.status` (``Admin.GetStatus`` from plain state). Edges:
:mod:`.election` (leadership fenced by lease time), :mod:`.coordination`
(elect, share the fleet, relay), :mod:`.followers` (the leader's side of
``Admin.Follow``), :mod:`.leaderlink` (a follower's stream to the leader),
:mod:`.service` (who leads, terms, the follower report), and
:mod:`.statusservice`. docs/store.md tells the whole story.
"""
