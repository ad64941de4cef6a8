"""Label-based routing: which shard owns a host, and which shard must run a job.

A label belongs to at most one shard, and a host to the shard that owns one of its labels. A job's
meta-hosts and dependency labels must resolve to exactly one shard that has hosts enough to serve it;
anything else is refused at creation. Assignment is eager: the heartbeat only sends what changed.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from common.errors import Refused
from common.models import Host, Label, Shard


def shard_for_labels(hostname: str, labels: Iterable[Label]) -> Shard | None:
    """The one shard owning any of `labels`; refused when they belong to two shards."""
    owners: dict[int, tuple[Shard, Label]] = {}
    for label in labels:
        if label.shard_id is not None and label.shard_id not in owners:
            shard = label.shard
            assert shard is not None  # shard_id is set
            owners[label.shard_id] = (shard, label)
    if len(owners) > 1:
        (s1, l1), (s2, l2) = sorted(owners.values(), key=lambda o: o[0].hostname)[:2]
        raise Refused(
            f"host {hostname} would have labels of two shards: {l1.name} (shard {s1.hostname}) "
            f"and {l2.name} (shard {s2.hostname})",
            field="labels",
        )
    return next(iter(owners.values()))[0] if owners else None


@dataclass(frozen=True)
class HQESpec:
    """One HQE to create: a named host or a meta-host label."""

    host: Host | None = None
    meta_host: Label | None = None


def _describe(spec: HQESpec) -> str:
    return f"host {spec.host.hostname}" if spec.host else f"meta-host {spec.meta_host.name}"  # type: ignore[union-attr]


def _shards_serving(spec: HQESpec, dependency_labels: list[Label]) -> set[int]:
    """Shards with at least one host that can run this HQE; raises naming what is missing where."""
    if spec.host is not None:
        hosts = Host.objects.filter(id=spec.host.id)
    else:
        hosts = Host.objects.filter(labels=spec.meta_host)
        pooled = _pool_shards(spec.meta_host, dependency_labels)  # type: ignore[arg-type]
        if pooled and not hosts.filter(shard__isnull=False).exists():
            return pooled
        if not hosts.exists():
            raise Refused(f"no shard can serve this job: no host has label {spec.meta_host.name}", field="meta_hosts")  # type: ignore[union-attr]
    assigned = hosts.filter(shard__isnull=False)
    serving = assigned
    for label in dependency_labels:
        serving = serving.filter(labels=label)
    shard_ids = set(serving.values_list("shard_id", flat=True).distinct())
    if spec.host is None:
        shard_ids |= _pool_shards(spec.meta_host, dependency_labels)  # type: ignore[arg-type]
    if shard_ids:
        return shard_ids
    shards = dict(assigned.values_list("shard_id", "shard__hostname").distinct())
    if not shards:
        what = f"host {spec.host.hostname} is" if spec.host else f"no host with label {spec.meta_host.name} is"  # type: ignore[union-attr]
        raise Refused(f"no shard can serve this job: {what} assigned to a shard", field="hosts")
    reasons = []
    for shard_id, hostname in sorted(shards.items(), key=lambda item: item[1]):
        lacking = [d.name for d in dependency_labels if not assigned.filter(shard_id=shard_id, labels=d).exists()]
        needs = ", ".join(lacking) if lacking else f"all of {', '.join(d.name for d in dependency_labels)}"
        reasons.append(f"on shard {hostname}, no host for {_describe(spec)} has {needs}")
    raise Refused(f"no shard can serve this job: {'; '.join(reasons)}", field="dependency_labels")


def _serving_pools(pools: object, names: set[str]) -> list[dict[str, Any]]:
    """The elastic pools a shard announced (docs/design.md, "Capacity that registers itself") whose
    labels include all of `names`: their workers' hosts will have them."""
    if not isinstance(pools, list):
        return []
    return [
        p
        for p in pools
        if isinstance(p, dict)
        and isinstance(p.get("labels"), list)
        and names <= set(p["labels"])
        and isinstance(p.get("max_hosts"), int)
        and p["max_hosts"] > 0
    ]


def _pool_shards(label: Label, dependency_labels: list[Label]) -> set[int]:
    """The shard owning `label`, if one of its pools serves it with every dependency label."""
    if label.shard_id is None:
        return set()
    pools = Shard.objects.filter(id=label.shard_id).values_list("pools", flat=True).first()
    names = {label.name, *(d.name for d in dependency_labels)}
    return {label.shard_id} if _serving_pools(pools, names) else set()


def route_job(specs: list[HQESpec], dependency_labels: list[Label]) -> Shard:
    """The single shard able to run every HQE; refused when none can or the job would span shards."""
    common: set[int] | None = None
    per_spec: list[tuple[HQESpec, set[int]]] = []
    for spec in specs:
        serving = _shards_serving(spec, dependency_labels)
        per_spec.append((spec, serving))
        common = serving if common is None else common & serving
    assert common is not None
    names = dict(Shard.objects.filter(id__in=set().union(*(s for _, s in per_spec))).values_list("id", "hostname"))
    if not common:
        parts = [f"{_describe(spec)} is served by {', '.join(sorted(names[i] for i in s))}" for spec, s in per_spec]
        raise Refused(f"job spans shards: {'; '.join(parts)}", field="meta_hosts")
    if len(common) > 1:
        shards = ", ".join(sorted(names[i] for i in common))
        raise Refused(
            f"job is ambiguous: shards {shards} can all serve it; add a dependency label to choose one",
            field="dependency_labels",
        )
    return Shard.objects.get(id=common.pop())


def _max_flow(demand: dict[int, int], pools: dict[frozenset[int], int]) -> set[int]:
    """Matches each group's demand to distinct hosts; returns the groups left short, or an empty set.

    `demand`: group (a meta-host label id) -> hosts wanted. `pools`: the set of groups a kind of host
    can serve -> how many hosts are of that kind. A max flow from groups to pools on this small graph
    (at most one node per group and per kind of host) is exact, unlike counting hosts per group. When
    it falls short, the groups still reachable from the source in the residual graph are a set whose
    demand exceeds the hosts able to serve any of them (Hall's condition), which the error names.
    """
    pool_list = list(pools)
    flow_to_pool: dict[tuple[int, int], int] = {}  # (group, pool index) -> units
    used = [0] * len(pool_list)  # units into each pool, at most its size
    sent = dict.fromkeys(demand, 0)
    adjacent = {g: [i for i, p in enumerate(pool_list) if g in p] for g in demand}
    serving: dict[int, list[int]] = {i: [g for g in demand if g in p] for i, p in enumerate(pool_list)}

    def augment() -> tuple[bool, set[int]]:
        # BFS over groups; from a group to a pool along any edge, from a pool back to a group
        # along an edge that carries flow (undoing it), until a pool with room is found.
        start = [g for g in demand if sent[g] < demand[g]]
        parent: dict[tuple[str, int], tuple[str, int] | None] = {("g", g): None for g in start}
        queue = [("g", g) for g in start]
        while queue:
            kind, node = queue.pop(0)
            if kind == "g":
                for i in adjacent[node]:
                    if ("p", i) not in parent:
                        parent[("p", i)] = (kind, node)
                        if used[i] < pools[pool_list[i]]:
                            _apply(parent, ("p", i))
                            return True, set()
                        queue.append(("p", i))
            else:
                for g in serving[node]:
                    if flow_to_pool.get((g, node), 0) > 0 and ("g", g) not in parent:
                        parent[("g", g)] = (kind, node)
                        queue.append(("g", g))
        return False, {node for kind, node in parent if kind == "g"}

    def _apply(parent: dict[tuple[str, int], tuple[str, int] | None], end: tuple[str, int]) -> None:
        used[end[1]] += 1
        node: tuple[str, int] = end
        while True:
            prev = parent[node]
            if prev is None:
                sent[node[1]] += 1
                return
            if node[0] == "p":  # group prev -> pool node: one more unit
                key = (prev[1], node[1])
                flow_to_pool[key] = flow_to_pool.get(key, 0) + 1
            else:  # pool prev -> group node: undo one unit of group node into pool prev
                flow_to_pool[(node[1], prev[1])] -= 1
            node = prev

    while any(sent[g] < demand[g] for g in demand):
        ok, short = augment()
        if not ok:
            return short
    return set()


def check_capacity(shard: Shard, counts: dict[Label, int], dependency_labels: list[Label]) -> None:
    """Refuses a job whose meta-hosts ask for more distinct hosts than its shard has.

    A job never uses a host twice: the N entries of `LABEL*N` run on N different hosts,
    so each needs a host on `shard` with that label and every dependency label, and no host serves
    two entries. Locked hosts (and hosts in repair) count: they may be unlocked or repaired later,
    and the job waits in the queue until then; only a job that can never run is refused here.
    """
    wanted = {label.id: label for label in counts}
    dep_ids = {d.id for d in dependency_labels}
    pairs = Host.labels.through.objects.filter(host__shard=shard, label_id__in=set(wanted) | dep_ids).values_list(
        "host_id", "label_id"
    )
    labels_of: dict[int, set[int]] = {}
    for host_id, label_id in pairs:
        labels_of.setdefault(host_id, set()).add(label_id)
    pools: dict[frozenset[int], int] = {}
    for host_labels in labels_of.values():
        serves = frozenset(host_labels & set(wanted))
        if serves and dep_ids <= host_labels:
            pools[serves] = pools.get(serves, 0) + 1
    # An elastic pool counts as its max_hosts hosts with the pool's labels, before any worker exists.
    dep_names = {d.name for d in dependency_labels}
    for pool in _serving_pools(shard.pools, dep_names):
        serves = frozenset(i for i, label in wanted.items() if label.name in pool["labels"])
        if serves:
            pools[serves] = pools.get(serves, 0) + pool["max_hosts"]
    deps = f" (and dependency labels {', '.join(sorted(d.name for d in dependency_labels))})" if dep_ids else ""
    for label, count in counts.items():
        have = sum(n for serves, n in pools.items() if label.id in serves)
        if have < count:
            raise Refused(
                f"job asks for {count} hosts with {label.name}{deps} but shard {shard.hostname} has {have}",
                field="meta_hosts",
            )
    short = _max_flow({label.id: count for label, count in counts.items()}, pools)
    if short:
        names = sorted(wanted[g].name for g in short)
        asked = sum(counts[wanted[g]] for g in short)
        have = sum(n for serves, n in pools.items() if serves & short)
        raise Refused(
            f"job asks for {asked} different hosts with {' or '.join(names)}{deps} but shard {shard.hostname} "
            f"has {have} (a job never uses a host twice)",
            field="meta_hosts",
        )
