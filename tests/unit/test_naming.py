"""Unit names (issue #2, Rules): the kubelet's systemd driver, and "is this name ours?".

`kubepods.slice`, `kubepods-burstable.slice`, `kubepods-besteffort.slice`; Guaranteed pods
`kubepods-pod<uid>.slice`, others `kubepods-<qos>-pod<uid>.slice`, `-` in the UID written `_`;
cgroupRoot `/foo` gives `foo-kubepods.slice`. Scopes: `containerd://ID` -> `cri-containerd-ID.scope`,
`cri-o://ID` -> `crio-ID.scope`, `docker://ID` -> `docker-ID.scope`. Reserved slices: the last
element of the reserved cgroup, ending in `.slice`. Anything else is not ours.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memqos_systemd.naming import (
    Naming, NamingError, UnitRef, container_scope, parse_container_id, reserved_slice, valid_pod_uid,
)

# The UIDs of the v1.36 blog post's two examples.
G_UID = "6a4f2e3b-1c9d-4a5e-8f7b-2d3e4f5a6b7c"
B_UID = "8b3c7d2e-4f5a-6b7c-9d1e-3f4a5b6c7d8e"
E_UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
STATIC_UID = "3b9f6a5cd3e0b5e25e4f3c1f9a8d7e6b"  # a static pod: hex MD5 of its manifest
HEX = "0123456789abcdef" * 4  # 64 hex digits


# ------------------------------------------------------------------ forward

def test_default_root_names():
    n = Naming()
    assert n.node_slice() == "kubepods.slice"
    assert n.qos_slice("Burstable") == "kubepods-burstable.slice"
    assert n.qos_slice("BestEffort") == "kubepods-besteffort.slice"
    assert n.qos_slice("Guaranteed") == "kubepods.slice"  # Guaranteed pods hang off kubepods.slice
    assert n.root_slices() == []


@pytest.mark.parametrize("qos, uid, name", [
    # the blog's own paths
    ("Guaranteed", G_UID, "kubepods-pod6a4f2e3b_1c9d_4a5e_8f7b_2d3e4f5a6b7c.slice"),
    ("Burstable", B_UID, "kubepods-burstable-pod8b3c7d2e_4f5a_6b7c_9d1e_3f4a5b6c7d8e.slice"),
    ("BestEffort", E_UID, "kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice"),
    ("Burstable", STATIC_UID, f"kubepods-burstable-pod{STATIC_UID}.slice"),
])
def test_pod_slices(qos, uid, name):
    assert Naming().pod_slice(qos, uid) == name


@pytest.mark.parametrize("root, node, burstable, guaranteed_pod, roots", [
    ("/", "kubepods.slice", "kubepods-burstable.slice", "kubepods-pod{u}.slice", []),
    ("//", "kubepods.slice", "kubepods-burstable.slice", "kubepods-pod{u}.slice", []),
    ("/foo", "foo-kubepods.slice", "foo-kubepods-burstable.slice", "foo-kubepods-pod{u}.slice", ["foo.slice"]),
    ("/foo/", "foo-kubepods.slice", "foo-kubepods-burstable.slice", "foo-kubepods-pod{u}.slice", ["foo.slice"]),
    ("/foo.slice", "foo-kubepods.slice", "foo-kubepods-burstable.slice", "foo-kubepods-pod{u}.slice",
     ["foo.slice"]),
    ("/foo/bar", "foo-bar-kubepods.slice", "foo-bar-kubepods-burstable.slice", "foo-bar-kubepods-pod{u}.slice",
     ["foo.slice", "foo-bar.slice"]),
    ("/foo.slice/foo-bar.slice", "foo-bar-kubepods.slice", "foo-bar-kubepods-burstable.slice",
     "foo-bar-kubepods-pod{u}.slice", ["foo.slice", "foo-bar.slice"]),
    # A systemd slice name spells its ancestry: foo-bar.slice lives in foo.slice, so kubepods
    # inside it is foo-bar-kubepods.slice (the kubelet's ParseSystemdToCgroupName reads it so).
    ("/foo-bar.slice", "foo-bar-kubepods.slice", "foo-bar-kubepods-burstable.slice",
     "foo-bar-kubepods-pod{u}.slice", ["foo.slice", "foo-bar.slice"]),
    # A cgroupfs-style element with a dash: the driver escapes it.
    ("/foo-bar", "foo_bar-kubepods.slice", "foo_bar-kubepods-burstable.slice", "foo_bar-kubepods-pod{u}.slice",
     ["foo_bar.slice"]),
])
def test_cgroup_root(root, node, burstable, guaranteed_pod, roots):
    n = Naming(root)
    u = G_UID.replace("-", "_")
    assert n.node_slice() == node
    assert n.qos_slice("Burstable") == burstable
    assert n.qos_slice("BestEffort") == burstable.replace("burstable", "besteffort")
    assert n.pod_slice("Guaranteed", G_UID) == guaranteed_pod.format(u=u)
    assert n.pod_slice("Burstable", G_UID) == burstable.replace(".slice", f"-pod{u}.slice")
    assert n.root_slices() == roots


@pytest.mark.parametrize("root", [
    "/..", "/.", "/foo/../bar", "/fo o", "/foo\n", "/föö", "/-.slice", "/foo.slice/bar.slice", "/foo.slice/foo.slice",
    "/a--b.slice", "/foo/-.slice",
])
def test_bad_cgroup_roots(root):
    with pytest.raises(NamingError):
        Naming(root)


@pytest.mark.parametrize("uid", [
    "", "abc", G_UID.upper(), G_UID.replace("-", "_"), G_UID + "0", G_UID[:-1], " " + G_UID, G_UID + "\n",
    "../x", "../../etc", G_UID.replace("a", "g"), STATIC_UID[:-1], STATIC_UID + "0", STATIC_UID.upper(),
    "٠" * 32,  # arabic-indic digits
    "6a4f2e3b-1c9d-4a5e-8f7b-2d3e4f5a6b7c-",
    None, 12345, ["x"],
])
def test_invalid_uids_are_refused(uid):
    assert not valid_pod_uid(uid)
    with pytest.raises(NamingError):
        Naming().pod_slice("Burstable", uid)


@pytest.mark.parametrize("raw, scope", [
    (f"containerd://{HEX}", f"cri-containerd-{HEX}.scope"),
    (f"cri-o://{HEX}", f"crio-{HEX}.scope"),
    (f"docker://{HEX}", f"docker-{HEX}.scope"),
])
def test_container_scopes(raw, scope):
    assert container_scope(raw) == scope


@pytest.mark.parametrize("raw", [
    "containerd://XYZ", f"containerd://{HEX.upper()}", f"containerd://{HEX[:-1]}", f"containerd://{HEX}0",
    f"rkt://{HEX}", f"crio://{HEX}", f"containerd:/{HEX}", HEX, f"containerd://{HEX}/../x",
    f"containerd://../{HEX}", f"containerd://{HEX}\n", f"containerd:// {HEX}", "containerd://",
    "containerd://" + "٠" * 64, f"CONTAINERD://{HEX}", "", None, 5,
])
def test_invalid_container_ids_are_refused(raw):
    with pytest.raises(NamingError):
        container_scope(raw)


def test_parse_container_id():
    assert parse_container_id(f"cri-o://{HEX}") == ("cri-o", HEX)


@pytest.mark.parametrize("cgroup, name", [
    ("/kube.slice", "kube.slice"), ("/system.slice", "system.slice"), ("/kube.slice/", "kube.slice"),
    ("/runtime.slice/runtime-kube.slice", "runtime-kube.slice"), ("/podruntime.slice", "podruntime.slice"),
])
def test_reserved_slices(cgroup, name):
    assert reserved_slice(cgroup) == name


@pytest.mark.parametrize("cgroup", ["/kube", "/kube.service", "/-.slice", "/", "/kube slice.slice", "/kübe.slice"])
def test_bad_reserved_slices(cgroup):
    with pytest.raises(NamingError):
        reserved_slice(cgroup)


@pytest.mark.parametrize("root, reserved", [
    ("/", "/kubepods.slice"), ("/", "/kubepods-burstable.slice"), ("/foo", "/foo.slice"),
    ("/foo", "/foo-kubepods.slice"),
])
def test_reserved_slice_may_not_be_one_of_our_pod_slices(root, reserved):
    # A reserved slice that is kubepods.slice (or a QoS slice) would get two plans at once.
    with pytest.raises(NamingError):
        Naming(root, (reserved,))


# ------------------------------------------------------------------ back

ROOTS = ["/", "/foo", "/foo.slice", "/foo/bar", "/foo.slice/foo-bar.slice"]


def every_name(n: Naming) -> list[tuple[str, UnitRef]]:
    out = [(n.node_slice(), UnitRef("node"))]
    out += [(s, UnitRef("node")) for s in n.root_slices()]
    out += [(n.qos_slice(q), UnitRef("qos", qos=q)) for q in ("Burstable", "BestEffort")]
    for qos in ("Guaranteed", "Burstable", "BestEffort"):
        for uid in (G_UID, B_UID, STATIC_UID):
            out.append((n.pod_slice(qos, uid), UnitRef("pod", qos=qos, uid=uid)))
    for runtime in ("containerd", "cri-o", "docker"):
        out.append((container_scope(f"{runtime}://{HEX}"), UnitRef("container", container_id=HEX)))
    return out


@pytest.mark.parametrize("root", ROOTS)
def test_parse_unit_round_trips_every_name_it_produces(root):
    n = Naming(root, ("/kube.slice", "/system.slice"))
    names = every_name(n) + [("kube.slice", UnitRef("reserved")), ("system.slice", UnitRef("reserved"))]
    for name, ref in names:
        assert n.parse_unit(name) == ref, name
    assert len({name for name, _ in names}) == len(names)


NOT_OURS = [
    "sshd.service", "system.slice", "user.slice", "-.slice", "init.scope", "kube.slice",
    "kubepods", "kubepods.service", "kubepods.slice.slice", "kubepods.scope", " kubepods.slice", "kubepods.slice ",
    "kubepods-burstable-pod../x.slice", "kubepods-burstable-pod.slice", "kubepods-pod.slice",
    f"kubepods-burstable-pod{B_UID}.slice",  # dashes as the API writes them: the driver never does
    f"kubepods-burstable-pod{B_UID.replace('-', '_').upper()}.slice",
    f"kubepods-burstable-pod{B_UID.replace('-', '_')}_.slice",
    f"kubepods-burstable-pod{B_UID.replace('-', '_')}.slice.bak",
    f"kubepods-guaranteed-pod{G_UID.replace('-', '_')}.slice",
    f"kubepods-besteffort-pod{G_UID.replace('-', '_')}-extra.slice",
    f"kubepods-burstable-burstable-pod{B_UID.replace('-', '_')}.slice",
    f"kubepods-pod{G_UID.replace('-', '_')}.scope",
    f"foo-kubepods-pod{G_UID.replace('-', '_')}.slice",  # another cgroupRoot's
    "kubepods-podé.slice", "kubepods-burstable-pod٠٠٠٠٠٠٠٠_٠٠٠٠_٠٠٠٠_٠٠٠٠_٠٠٠٠٠٠٠٠٠٠٠٠.slice",
    "kübepods.slice", "kubepods\u200b.slice", "kubepods-burstable.slice\x00",
    "cri-containerd-XYZ.scope", f"cri-containerd-{HEX.upper()}.scope", f"cri-containerd-{HEX[:-1]}.scope",
    f"cri-containerd-{HEX}0.scope", f"cri-containerd-{HEX}.slice", f"cri-containerd-{HEX}.scope.d",
    f"containerd-{HEX}.scope", f"cri-o-{HEX}.scope", f"rkt-{HEX}.scope", f"crio-{HEX}", f"docker-{HEX}.service",
    f"crio-conmon-{HEX}.scope",  # CRI-O's conmon scope is the runtime's, not the container's
    "", "/", "kubepods.slice/kubepods-burstable.slice",
]


@pytest.mark.parametrize("name", NOT_OURS)
def test_parse_unit_refuses_anything_else(name):
    assert Naming("/", ("/kube2.slice",)).parse_unit(name) is None


@pytest.mark.parametrize("value", [None, 5, b"kubepods.slice", ["kubepods.slice"]])
def test_parse_unit_non_strings(value):
    assert Naming().parse_unit(value) is None


_QOS = st.sampled_from(["Guaranteed", "Burstable", "BestEffort"])


@settings(max_examples=200, deadline=None)
@given(root=st.sampled_from(ROOTS), qos=_QOS, uid=st.uuids())
def test_pod_slice_round_trip_property(root, qos, uid):
    n = Naming(root)
    name = n.pod_slice(qos, str(uid))
    assert n.parse_unit(name) == UnitRef("pod", qos=qos, uid=str(uid))


@settings(max_examples=200, deadline=None)
@given(root=st.sampled_from(ROOTS), cid=st.binary(min_size=32, max_size=32),
       runtime=st.sampled_from(["containerd", "cri-o", "docker"]))
def test_scope_round_trip_property(root, cid, runtime):
    name = container_scope(f"{runtime}://{cid.hex()}")
    assert Naming(root).parse_unit(name) == UnitRef("container", container_id=cid.hex())


def _regenerate(n: Naming, ref: UnitRef) -> set[str]:
    if ref.level == "node":
        return {n.node_slice(), *n.root_slices()}
    if ref.level == "qos":
        return {n.qos_slice(ref.qos)}
    if ref.level == "pod":
        return {n.pod_slice(ref.qos, ref.uid)}
    if ref.level == "container":
        return {f"{p}-{ref.container_id}.scope" for p in ("cri-containerd", "crio", "docker")}
    return {"kube.slice"}


_ALPHABET = st.sampled_from(list("kubepods-burstablefortpicecontainerdsl._0123456789abcdef-_é/ \n"))


@settings(max_examples=200, deadline=None)
@given(text=st.one_of(
    st.text(max_size=80),
    st.lists(_ALPHABET, max_size=90).map("".join),
    st.builds(lambda head, u, tail: head + u + tail,
              st.sampled_from(["kubepods-pod", "kubepods-burstable-pod", "kubepods-besteffort-pod", "kubepods-",
                               "cri-containerd-", "crio-", "docker-", ""]),
              st.uuids().map(lambda u: str(u).replace("-", "_")) | st.text(max_size=40),
              st.sampled_from([".slice", ".scope", "", ".slice.slice", "_.slice"])),
))
def test_parse_unit_accepts_only_names_it_would_produce(text):
    n = Naming("/", ("/kube.slice",))
    ref = n.parse_unit(text)
    if ref is not None:
        assert text in _regenerate(n, ref)
