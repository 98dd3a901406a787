"""What the parent and the env side agree on, and both import.

* :mod:`~envmgr.protocol.messages` - the commands a group is sent and its answers.
* :mod:`~envmgr.protocol.layout` - how the batch is cut into groups.
* :mod:`~envmgr.protocol.shared_memory` - the batch arrays (shared or private).
* :mod:`~envmgr.protocol.trees` - copying, scattering and cutting space-shaped batches.

Nothing here imports a layer above (env side, backends, front end, managers).
"""
