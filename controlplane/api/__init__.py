"""The control plane's wire: ``ferry.v1.Fleet``, ``Tables`` and ``Admin`` servicers, translation only.

Pure: :mod:`.validate` (every wire field checked, the field named),
:mod:`.join` (who may register a node: join token, peer certificate),
:mod:`.auth` (the admin token). Edges: :mod:`.servicers` (the three gRPC
services), and the ``Admin`` handlers by concern: :mod:`.fleet`,
:mod:`.tenants`, :mod:`.rollout`, :mod:`.usage`.
"""
