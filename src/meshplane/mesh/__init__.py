"""The event mesh's asyncio side: nodes that link into a cluster (:mod:`.node`, with :mod:`.links`
and :mod:`.status`), gateways between clusters (:mod:`.gateways`), the connections that carry frames
(:mod:`.connection`), and the client the event plane's ``mesh`` transport uses (:mod:`.client`).
The protocol itself is sans-I/O, in :mod:`meshplane.core.mesh`."""
