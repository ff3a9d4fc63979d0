"""The control plane's wire: ``ferry.v1.Fleet``, ``Tables`` and ``Admin`` servicers, translation only.

The only part of the control plane that speaks gRPC as a server. Pure:
:mod:`.status` (the one translation of errors to a status), :mod:`.join`
(the agents' join check: join token, peer certificate), :mod:`.auth` (the
admin token). Edges: :mod:`.servicers` (the three gRPC services; ``Admin``
composed from the handlers), :mod:`.streams` (what the streams share), and
the ``Admin`` handlers by concern, each defining its RPCs: :mod:`.fleet`,
:mod:`.tables`, :mod:`.cluster`, :mod:`.usage`, :mod:`.tenants`,
:mod:`.rollout`, :mod:`.router`, :mod:`.scaling`, :mod:`.engines`,
:mod:`.traffic`.
"""
