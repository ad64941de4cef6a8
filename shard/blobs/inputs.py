"""What a run reads: `$FLEETSHARD_INPUT_DIR/NAME` for each of its job's inputs, from the shard's cache.

The run's `inputs/` is the shard's (0555): the run can neither add nor replace an entry, and each
entry is a link to the cached file or unpacked tree, which is read-only and the shard's.
"""

import os
from pathlib import Path
from typing import Any

from common.ab import VARIANT_INPUT, VARIANT_INPUT_PREFIX
from common.blobs import BadInput, parse_inputs
from shard.blobs.cache import BlobCache, CacheError, Pin
from shard.run.isolation import JobUser, let_reach

INPUTS = "inputs"


def provide_inputs(
    cache: BlobCache | None, inputs: Any, run_dir: Path, pins: list[Pin], user: JobUser | None = None
) -> Path:
    """Fetches (once per digest) and links each input under `run_dir/inputs`; `pins` gets the holds.

    Raises CacheError naming the input when one cannot be had: its run fails as infra, not as a test.
    """
    if cache is None:
        raise CacheError("this scheduler has no input cache (it was started without a master to fetch from)")
    try:
        refs = parse_inputs(inputs)
    except BadInput as exc:
        raise CacheError(f"the job's inputs are malformed: {exc}") from None
    let_reach(cache.root, user)
    where = run_dir / INPUTS
    where.mkdir(mode=0o755)
    for ref in refs:
        path, pin = cache.acquire(ref)
        pins.append(pin)
        os.symlink(path, where / ref.name)
    where.chmod(0o555)
    cache.evict()
    return where


def variant_inputs(inputs_dir: Path, variants: list[str]) -> dict[str, str]:
    """An A/B job's inputs as each variant's runs see them: beside `inputs/`, an `inputs-VARIANT/` of
    the same links, where the variant's own input (`variant+VARIANT`) is `variant` and the other
    variants' are left out. Made by the shard before the run starts, read-only like `inputs/`."""
    entries = {name: os.readlink(inputs_dir / name) for name in os.listdir(inputs_dir)}
    if VARIANT_INPUT in entries:
        # The master refuses such a job; one created before it did fails as infra, the host not blamed.
        raise CacheError(f"input name {VARIANT_INPUT}: an A/B job's runs see their variant's own input under it")
    dirs = {}
    for variant in variants:
        where = inputs_dir.parent / f"{INPUTS}-{variant}"
        where.mkdir(mode=0o755)
        for name, target in entries.items():
            if name.startswith(VARIANT_INPUT_PREFIX):
                if name == f"{VARIANT_INPUT_PREFIX}{variant}":
                    os.symlink(target, where / VARIANT_INPUT)
            else:
                os.symlink(target, where / name)
        where.chmod(0o555)
        dirs[variant] = str(where)
    return dirs
