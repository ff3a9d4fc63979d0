"""What the request path does after a replica failed.

Pure: :mod:`.budget` (retries may add at most a share of the traffic),
:mod:`.continuation` (continue a stream cut mid-way on another replica).
:mod:`.recover` binds them for the router.
"""
