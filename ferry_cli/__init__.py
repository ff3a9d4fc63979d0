"""The commands, above all planes.

``ferry`` (:mod:`.main`: a component, the whole system with ``up``, one
request with ``call``), ``ferryctl`` (:mod:`.ctl`) and the client TLS they
share (:mod:`.clienttls`). They import the planes' entry points, the shared
layer (``ferry``) and the local harness (``harness``); no plane imports them.
"""
