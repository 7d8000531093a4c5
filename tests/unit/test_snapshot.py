"""carry_over: a pod the source stops listing keeps its place while its slice still runs."""

from memqos_systemd.pods import Container, Pod
from memqos_systemd.intake import carry_over


def pod(uid: str) -> Pod:
    return Pod(uid=uid, namespace="ns", name=uid[:4], qos="Burstable",
               containers=(Container("c", "app", 1 << 20, None),))


A, B, C = pod("a" * 32), pod("b" * 32), pod("c" * 32)


def test_listed_pods_pass_through():
    assert carry_over([A, B], [A], live_uids={A.uid}) == ([A, B], [])


def test_a_dropped_pod_whose_slice_runs_is_carried():
    pods, carried = carry_over([A], [A, B], live_uids={A.uid, B.uid})
    assert pods == [A, B] and carried == [B]


def test_a_dropped_pod_whose_slice_is_gone_is_dropped():
    assert carry_over([A], [A, B, C], live_uids={A.uid, C.uid}) == ([A, C], [C])


def test_an_empty_answer_carries_every_running_pod():
    assert carry_over([], [A, B], live_uids={A.uid, B.uid}) == ([A, B], [A, B])


def test_nothing_is_invented_from_live_slices_alone():
    assert carry_over([A], [], live_uids={A.uid, B.uid}) == ([A], [])
