"""The commands above the planes.

``ferry`` (:mod:`.main`: a component, the whole system with ``up``, one
request with ``call``) and ``ferryctl`` (:mod:`.ctl`).
"""
