"""torch.distributed on max_device, and the same plugins on every rank.

Importing max_device makes Gloo serve max_device tensors:
``init_process_group("gloo")``, ``"cpu:gloo,max_device:gloo"`` and
``init_process_group()`` (Gloo is max_device's default backend) all work for
them, every collective, sync or async. Gloo reads and writes the device
memory in place: a loader kernel hands it CPU aliases of the same bytes
(loader/dispatch/collectives.cpp).

Every rank must serve the same kernels, or the ranks compute different
things from the same inputs. ``check_consistent()`` compares the ranks'
plugins; ``reload_all()`` swaps a plugin on every rank or on none.
"""

import itertools
import json
import math
from datetime import timedelta
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .errors import DistributedReloadError, InconsistentPluginsError
from . import plugins

_DEVICE_TYPE = "max_device"
# reload_all calls, numbered alike on every rank (they are collective).
_reload_calls = itertools.count()


def register_backend() -> None:
    """Gloo serves max_device, and is its default backend."""
    if not dist.is_available():
        return
    from torch.distributed.distributed_c10d import Backend
    gloo_devices = Backend.backend_capability[Backend.GLOO]
    if _DEVICE_TYPE not in gloo_devices:
        gloo_devices.append(_DEVICE_TYPE)
    Backend.default_device_backend_map.setdefault(_DEVICE_TYPE, Backend.GLOO)


def init_device_mesh(mesh_shape: Tuple[int, ...], *, mesh_dim_names: Optional[Tuple[str, ...]] = None):
    """torch.distributed.device_mesh.init_device_mesh for max_device (for
    FSDP2's ``fully_shard(mesh=...)`` and DTensor): a DeviceMesh over the
    default process group's ranks in row-major order. PyTorch's own refuses
    a device type that is not all letters."""
    from torch.distributed.device_mesh import DeviceMesh
    ranks = torch.arange(math.prod(mesh_shape), dtype=torch.int).view(tuple(mesh_shape))
    return DeviceMesh(_DEVICE_TYPE, ranks, mesh_dim_names=mesh_dim_names)


PluginSet = Dict[str, Tuple[str, str]]  # plugin name -> (version, sha256)


def _plugin_set() -> PluginSet:
    return {p.name: (p.version, p.sha256) for p in plugins.list_plugins()}


def _describe(entry: Optional[Tuple[str, str]]) -> str:
    return "not loaded" if entry is None else f"{entry[0]} (sha256 {entry[1][:12]})"


def _ranks_text(ranks: List[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def check_consistent(group=None) -> PluginSet:
    """Check that every rank of ``group`` (default: the default process
    group) serves the same plugins: same names, versions and SHA-256.
    Collective: every rank calls it. Returns this rank's plugin set
    ``{name: (version, sha256)}``; raises ``InconsistentPluginsError``
    naming each differing plugin and which ranks have what, on every rank."""
    mine = _plugin_set()
    every = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    differences = {}
    for name in sorted(set().union(*every)):
        seen = {rank: every[rank].get(name) for rank in range(len(every))}
        if len(set(seen.values())) > 1:
            differences[name] = seen
    if not differences:
        return mine
    lines, differing = [], set()
    for name, seen in differences.items():
        variants: Dict[Optional[Tuple[str, str]], List[int]] = {}
        for rank, entry in seen.items():
            variants.setdefault(entry, []).append(rank)
            if entry != seen[0]:
                differing.add(rank)
        lines.append(f"  plugin '{name}': " + "; ".join(f"{_ranks_text(ranks)}: {_describe(entry)}"
                                                         for entry, ranks in variants.items()))
    ranks = sorted(differing)
    raise InconsistentPluginsError(
        f"the ranks do not serve the same plugins ({_ranks_text(ranks)} differ from rank 0):\n" + "\n".join(lines),
        differences=differences, ranks=ranks)


class _Vote:
    """Each rank's verdict on one reload_all, and the decision, through the
    process group's store (no tensor: the vote runs while the new version
    is staged on this thread, and max_device ops would run its kernels).

    Every rank proposes a decision from the votes it saw: publish if all
    accepted, else refuse (a refusal, or a rank that did not vote in time).
    The first proposal stored wins (compare-and-set) and every rank follows
    it, so a rank that gave up waiting and a late rank that saw every vote
    cannot decide differently."""

    def __init__(self, store, rank: int, world: int, timeout: Optional[timedelta]):
        prefix = f"max_device/reload_all/{next(_reload_calls)}/"
        self._store = store
        self._rank = rank
        self._keys = [f"{prefix}{r}" for r in range(world)]
        self._decision = prefix + "decision"
        self._timeout = timeout or store.timeout
        self.cast = False

    def __call__(self, refusal: Optional[str]) -> Dict[int, str]:
        """Cast this rank's vote (None: accept); returns the decision's
        refusals by rank (empty: publish)."""
        self._store.set(self._keys[self._rank], json.dumps(refusal))
        self.cast = True
        try:
            self._store.wait(self._keys, self._timeout)
            votes = {r: json.loads(self._store.get(key)) for r, key in enumerate(self._keys)}
            proposal = {r: reason for r, reason in votes.items() if reason is not None}
        except RuntimeError as e:  # DistStoreError (timeout), DistNetworkError (the store's host died)
            proposal = self._silent(e)
        try:
            decided = self._store.compare_set(self._decision, "", json.dumps(proposal))
        except RuntimeError as e:  # the store is gone: nobody can decide to publish
            return proposal or self._silent(e)
        return {int(r): reason for r, reason in json.loads(decided).items()}

    def _silent(self, error: RuntimeError) -> Dict[int, str]:
        """The ranks whose vote is missing, as refusals."""
        try:
            missing = [r for r, key in enumerate(self._keys) if not self._store.check([key])]
        except RuntimeError:
            missing = [r for r in range(len(self._keys)) if r != self._rank]
        return {r: f"did not answer within {self._timeout.total_seconds():g} s ({type(error).__name__})"
                for r in missing}


def reload_all(name: str, path=None, *, timeout: Optional[timedelta] = None, **options) -> plugins.Plugin:
    """Reload plugin ``name`` on every rank of the default process group,
    or on none. Collective: every rank calls it, in the same order as its
    other reload_all calls; ``path`` (default: where each rank's current
    version came from) may differ between ranks.

    Each rank runs its own checks first (the options of ``reload_plugin``:
    ``validate``, ``preflight``, ``isolate``, ``sha256``, ...), up to the
    point where the new version would be published. There the ranks agree:
    if every rank accepted, each publishes (nothing after this point can
    fail); if any rank refused, or did not answer within ``timeout``
    (default: the process group's), no rank publishes, every rank keeps its
    current version and raises ``DistributedReloadError`` naming the
    refusing ranks and their reasons. Returns this rank's plugin handle."""
    vote = _Vote(dist.distributed_c10d._get_default_store(), dist.get_rank(), dist.get_world_size(), timeout)

    def agree(ops: List[str]) -> None:
        refusals = vote(None)
        if refusals:
            raise _refused(name, path, refusals)

    try:
        plugin = plugins._reload(name, path, last_check=agree, **options)
    except DistributedReloadError:
        raise
    except Exception as own:
        if vote.cast:  # refused after the agreement: cannot happen short of a loader bug
            raise
        raise _refused(name, path, vote(f"{type(own).__name__}: {own}")) from own
    if not vote.cast:  # unchanged content: nothing to publish here, but the others wait for this rank
        refusals = vote(None)
        if refusals:
            raise _refused(name, path, refusals)
    return plugin


def _refused(name: str, path, refusals: Dict[int, str]) -> DistributedReloadError:
    lines = "\n".join(f"  rank {rank}: {reason}" for rank, reason in sorted(refusals.items()))
    return DistributedReloadError(
        f"plugin '{name}' was not reloaded on any rank: {_ranks_text(sorted(refusals))} refused; every rank "
        f"keeps its current version\n{lines}",
        refusals=refusals, plugin=name, file=None if path is None else str(path))
