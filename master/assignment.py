"""Label-based routing: which shard owns a host, and which shard must run a job (DESIGN.md, "Assignment")."""

from collections.abc import Iterable
from dataclasses import dataclass

from common.errors import Refused
from common.models import Host, Label, Shard


def shard_for_labels(hostname: str, labels: Iterable[Label]) -> Shard | None:
    """The one shard owning any of `labels`; refused when they belong to two shards."""
    owners: dict[int, tuple[Shard, Label]] = {}
    for label in labels:
        if label.shard_id is not None and label.shard_id not in owners:
            owners[label.shard_id] = (label.shard, label)
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
        if not hosts.exists():
            raise Refused(f"no shard can serve this job: no host has label {spec.meta_host.name}", field="meta_hosts")  # type: ignore[union-attr]
    assigned = hosts.filter(shard__isnull=False)
    serving = assigned
    for label in dependency_labels:
        serving = serving.filter(labels=label)
    shard_ids = set(serving.values_list("shard_id", flat=True).distinct())
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
