"""OpenAPI links (a drf-spectacular postprocessing hook): what a created resource leads to.

A client, and schemathesis' stateful tests, can follow them: create a host, then read, lock or
delete that host; create a job, then read or abort it. The ids come from the creating response.
"""

from typing import Any

# (creating operation, the response's pointer to the new resource's key, path parameter, operations)
_LINKS: list[tuple[str, str, str, list[str]]] = [
    ("labels_create", "/0/name", "name", ["labels_retrieve", "labels_add_hosts_create", "labels_destroy"]),
    ("hosts_create", "/0/hostname", "hostname", ["hosts_retrieve", "hosts_destroy"]),
    ("shards_create", "/hostname", "hostname", ["shards_retrieve", "shards_add_labels_create", "shards_destroy"]),
    ("jobs_create", "/id", "id", ["jobs_retrieve", "jobs_abort_create"]),
]


def _link_name(operation_id: str) -> str:
    return "".join(part.capitalize() for part in operation_id.removesuffix("_create").split("_"))


def add_links(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Adds each creating operation's 201 links; missing operations are skipped (the schema evolves)."""
    operations = {
        op["operationId"]: op
        for path in result.get("paths", {}).values()
        for op in path.values()
        if "operationId" in op
    }
    for source, pointer, parameter, targets in _LINKS:
        created = operations.get(source, {}).get("responses", {}).get("201")
        if created is None:
            continue
        links = created.setdefault("links", {})
        for target in targets:
            if target in operations:
                links[_link_name(target)] = {
                    "operationId": target,
                    "parameters": {parameter: f"$response.body#{pointer}"},
                    "description": f"The created resource, by its `{parameter}`.",
                }
    return result
