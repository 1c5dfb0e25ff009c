"""Staging to the nodes' local disks (profile `stage`, docs/staging.md): the ranks' Python
environment packed once at submit (envpack), unpacked on every node by the batch shell before the
supervisor starts (templates/partials/stage_node.sh.j2)."""
