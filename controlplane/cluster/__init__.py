"""Control planes beside each other on one store: leadership, followers, and the fleet they share.

Pure: :mod:`.remote` (the other control planes' members and the merge with
this one's), :mod:`.status` (``Admin.GetStatus`` from plain state). Edges:
:mod:`.election` (leadership fenced by lease time), :mod:`.coordination`
(elect, share the fleet, relay), :mod:`.followers` (the leader's side of
``Admin.Follow``), :mod:`.leaderlink` (a follower's stream to the leader).
Who leads, terms and the follower report are
:mod:`controlplane.services.peers`; ``Admin.GetStatus`` is
:mod:`controlplane.services.status`. docs/store.md tells the whole story.
"""
