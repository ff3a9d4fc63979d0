"""The data-plane proxy: the public Inference API, admission, the pick and forwarding.

One composition, :class:`dataplane.router.Router`: admit (:mod:`.admission`),
then a loop of decide (:mod:`.pick`), forward (:mod:`.forward`) and record,
with :mod:`.failover` saying what happens after a replica fails. The table a
proxy routes by arrives from the control plane (:mod:`.table`); the other
regions it may spill to come with it (:mod:`.regions`). :mod:`.api` is the
wire: the ``ferry.v1.Inference`` servicer, API keys, request validation and
idempotency. :mod:`.server` wires one proxy process, :mod:`.main` is
``ferry proxy``, :mod:`.config` reads the ``[proxy]`` section, :mod:`.memory`
gives memory back to the system after bursts of large requests.
"""
