"""The "cpu" communicator: cgraph's own links between the processes of a group.

    mesh          one shared-memory link per ordered rank pair on a node (DAG edges and collectives)
    framed        the mesh with every message tagged by its call (the imperative API)
    links         links to ranks on other nodes: one authenticated TCP socket per pair
    pairing       making those sockets, each when a call first needs it
    arena         a node's shared workspace, for the "shared" allreduce
    peer_memory   reading a node peer's buffer where it lies (``process_vm_readv``)
    peer_watch    noticing at once that a rank of this node died
    layout        where a group's ranks sit, and the links that follow from it
    backend       the "cpu" backend of the imperative API: the algorithms over those links
"""

from __future__ import annotations
