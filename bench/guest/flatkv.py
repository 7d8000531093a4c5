"""A cgroup's flat-keyed file ("low 3\nhigh 0\n...": memory.events, memory.stat) as a dict; its
own module so that the locked sampler (health.py) reads it without importing the rest of the
guest helpers (mqbench.py: D-Bus, the e2e harness)."""


def read_kv(path: str) -> dict:
    out = {}
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(" ")
                if v.strip().isdigit():
                    out[k] = int(v)
    except OSError:
        pass
    return out
