"""reconcile.one_write_per_container: a container's lowered values go with its raised ones."""

from memqos_systemd.reconcile import Change, one_write_per_container

MI = 2**20
POD = "kubepods-burstable-podx.slice"
CTR = "cri-containerd-" + "a" * 64 + ".scope"
CTR2 = "cri-containerd-" + "b" * 64 + ".scope"


def test_a_new_burstable_container_is_written_once_at_its_grow_place():
    changes = [
        Change("kubepods.slice", "node", {"MemoryLow": 64 * MI}, "grow"),
        Change(POD, "pod", {"MemoryLow": 64 * MI}, "grow"),
        Change(CTR, "container", {"MemoryLow": 64 * MI}, "grow"),
        Change(CTR2, "container", {"MemoryHigh": 512 * MI}, "shrink"),  # no grow: keeps its place
        Change(CTR, "container", {"MemoryHigh": 900 * MI}, "shrink"),
        Change("kubepods.slice", "node", {"MemoryMin": 0}, "shrink"),
    ]
    assert one_write_per_container(changes) == [
        Change("kubepods.slice", "node", {"MemoryLow": 64 * MI}, "grow"),
        Change(POD, "pod", {"MemoryLow": 64 * MI}, "grow"),
        Change(CTR, "container", {"MemoryLow": 64 * MI, "MemoryHigh": 900 * MI}, "grow"),
        Change(CTR2, "container", {"MemoryHigh": 512 * MI}, "shrink"),
        Change("kubepods.slice", "node", {"MemoryMin": 0}, "shrink"),
    ]


def test_slices_are_never_merged():
    """A pod slice has children: its lowered values must wait for theirs."""
    changes = [Change(POD, "pod", {"MemoryLow": 64 * MI}, "grow"),
               Change(CTR, "container", {"MemoryMin": 0}, "shrink"),
               Change(POD, "pod", {"MemoryMin": 0}, "shrink")]
    assert one_write_per_container(changes) == changes
