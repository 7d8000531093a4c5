"""The kernel's effective memory protection, emulated: what memory.min and memory.low protect now.

Pure: a tree of cgroups in (each one's memory.current, memory.min, memory.low), the effective
values out. No I/O, no clock, no globals; cgroupfs.py reads the tree, `status` and the metrics
show it.

What is emulated: Linux 6.1 (Debian bookworm), mm/memcontrol.c `mem_cgroup_calculate_protection`
and `effective_protection`, with the bookkeeping of mm/page_counter.c `propagate_protected_usage`.
Reclaim walks the tree below its root (the root memcg for a node out of memory, the cgroup whose
memory.max or memory.reclaim asked otherwise) top-down and gives every cgroup below it:

* the root itself: nothing (its own values are ignored, and may be stale);
* a child of the root: its own memory.min and memory.low as they are, not capped by its usage;
* any other cgroup, for min and for low separately, from its parent's effective value P, the
  parent's usage U, and S = the sum over the parent's children of min(usage, setting) (the
  kernel's children_min_usage / children_low_usage):
  - its claim c = min(usage, setting);
  - S > P (the children claim more than the parent has): c * P / S, shared by usage, nothing lent;
  - otherwise c, and with the cgroup2 mount option `memory_recursiveprot` (systemd mounts with
    it) what the children leave unclaimed, P - S, is lent to those using more than they claim, in
    proportion to that unprotected usage: + (P - S) * (usage - c) / (U - S), when P > S, U > S
    and usage > c;
* a cgroup with no usage: not computed (the kernel keeps a stale value; nothing to protect).

The kernel computes in pages, dividing with the remainder dropped, in 64-bit unsigned longs (a
product that overflows wraps; `max` is PAGE_COUNTER_MAX pages): so does this module, and the
values come back in bytes. The effective values are the kernel's emin and elow. What reclaim
spares of a cgroup (mm/vmscan.c, get_scan_count and shrink_node_memcgs) is their larger one, up
to its usage, and only emin once reclaim retries before the OOM killer: `protected` below.

Other kernels (to our knowledge; read in stored copies, versions not verified here): the
arithmetic is the same from 5.7 (recursive protection, Johannes Weiner, 2020; the guard U > S
came with a 2020 fix for a division by zero, sent to stable) to the newest copy read, where
"mm/page_counter: Move calculating protection values to page_counter" (for the dmem controller,
6.14) moved it to mm/page_counter.c `page_counter_calculate_protection` with the mount option
passed in. After 6.1, Yosry Ahmed's "mm: memcg: fix stale protection of reclaim target memcg"
stops reclaim from reading the reclaim root's stale values for the root's own pages; what this
module computes does not change with it (the root gets nothing here either).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Cgroup", "Effective", "protection", "page_counter_max"]

_ULONG = (1 << 64) - 1


def page_counter_max(page_size: int) -> int:
    """The kernel's PAGE_COUNTER_MAX (64-bit): what `max` in memory.min/low is, in pages."""
    return ((1 << 63) - 1) // page_size


@dataclass(frozen=True)
class Cgroup:
    """A cgroup as reclaim sees it: its usage (memory.current), memory.min and memory.low, in
    bytes (`max` as any value at least PAGE_COUNTER_MAX pages), and its children. `name` is how
    the answer names it: unique in a tree."""

    name: str
    usage: int
    min: int = 0
    low: int = 0
    children: tuple["Cgroup", ...] = field(default=())


@dataclass(frozen=True)
class Effective:
    """What the kernel would protect of one cgroup, in bytes.

    emin, elow: the kernel's effective memory.min and memory.low (a child of the reclaim root
    holds its own setting, which may exceed its usage). lent_min, lent_low: the part of each
    that comes from the parent's unclaimed protection (memory_recursiveprot) rather than from the
    cgroup's own setting."""

    name: str
    usage: int
    emin: int
    elow: int
    lent_min: int
    lent_low: int
    own_min: int  # min(usage, memory.min): what its own setting claims of its usage
    own_low: int

    @property
    def min_now(self) -> int:
        """emin up to its usage: what memory.min keeps of it now."""
        return min(self.usage, self.emin)

    @property
    def low_now(self) -> int:
        """elow up to its usage."""
        return min(self.usage, self.elow)

    @property
    def lent_min_now(self) -> int:
        """The part of min_now its own memory.min does not claim."""
        return max(0, self.min_now - self.own_min)

    @property
    def lent_low_now(self) -> int:
        """The part of low_now its own memory.low does not claim."""
        return max(0, self.low_now - self.own_low)

    @property
    def protected(self) -> int:
        """What reclaim spares of it now: the larger effective value, up to its usage (only emin is
        kept once reclaim retries before the OOM killer)."""
        return min(self.usage, max(self.emin, self.elow))

    @property
    def lent(self) -> int:
        """The part of `protected` that its own settings do not claim: lent from a parent."""
        return max(0, self.protected - max(self.own_min, self.own_low))


def protection(root: Cgroup, *, recursive: bool, page_size: int = 4096) -> dict[str, Effective]:
    """Every cgroup of the tree under `root` (the reclaim root: the cgroup2 root for a node out of
    memory) -> its Effective values, `recursive` with the mount option memory_recursiveprot.
    ValueError for a name used twice, a negative value or a page size that is no positive number."""
    if page_size <= 0:
        raise ValueError(f"page size {page_size} is not a positive number of bytes")
    top = page_counter_max(page_size)
    out: dict[str, Effective] = {}

    def pages(n: int, what: str, name: str) -> int:
        if n < 0:
            raise ValueError(f"cgroup {name!r}: {what} {n} is negative")
        return min(n // page_size, top)

    def visit(node: Cgroup, parent: tuple[int, int, int, int, int] | None) -> tuple[int, int]:
        """Record `node`; its (emin, elow) in pages. `parent`: the parent's usage, emin, elow and
        its children's claimed min and low, in pages; None for a child of the root."""
        if node.name in out:
            raise ValueError(f"cgroup {node.name!r} is named twice in the tree")
        usage, mn, lw = (pages(node.usage, "usage", node.name), pages(node.min, "memory.min", node.name),
                         pages(node.low, "memory.low", node.name))
        own_min, own_low = min(usage, mn), min(usage, lw)
        if usage == 0:
            emin = elow = lent_min = lent_low = 0
        elif parent is None:
            emin, elow, lent_min, lent_low = mn, lw, 0, 0
        else:
            parent_usage, parent_emin, parent_elow, claimed_min, claimed_low = parent
            emin, lent_min = _effective(usage, parent_usage, mn, parent_emin, claimed_min, recursive)
            elow, lent_low = _effective(usage, parent_usage, lw, parent_elow, claimed_low, recursive)
        out[node.name] = Effective(node.name, usage * page_size, emin * page_size, elow * page_size,
                                   lent_min * page_size, lent_low * page_size, own_min * page_size,
                                   own_low * page_size)
        return emin, elow

    def below(node: Cgroup, emin: int, elow: int, is_root: bool) -> None:
        usage = pages(node.usage, "usage", node.name)
        claimed_min = claimed_low = 0
        for c in node.children:  # the kernel's children_min_usage and children_low_usage
            u = pages(c.usage, "usage", c.name)
            claimed_min += min(u, pages(c.min, "memory.min", c.name))
            claimed_low += min(u, pages(c.low, "memory.low", c.name))
        for c in node.children:
            ce, cl = visit(c, None if is_root else (usage, emin, elow, claimed_min, claimed_low))
            below(c, ce, cl, False)

    if not root.name:
        raise ValueError("the root cgroup has no name")
    pages(root.usage, "usage", root.name)
    out[root.name] = Effective(root.name, min(root.usage // page_size, top) * page_size, 0, 0, 0, 0, 0, 0)
    below(root, 0, 0, True)
    return out


def _effective(usage: int, parent_usage: int, setting: int, parent_effective: int, siblings: int,
               recursive: bool) -> tuple[int, int]:
    """One effective value and its lent part, in pages, as 6.1's effective_protection has it."""
    claim = min(usage, setting)
    if siblings > parent_effective:  # overcommitted: every claim scaled down alike
        return ((claim * parent_effective) & _ULONG) // siblings, 0
    lent = 0
    if recursive and parent_effective > siblings and parent_usage > siblings and usage > claim:
        lent = (((parent_effective - siblings) * (usage - claim)) & _ULONG) // (parent_usage - siblings)
    return (claim + lent) & _ULONG, lent
