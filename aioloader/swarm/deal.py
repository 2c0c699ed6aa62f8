"""Who pulls what in one try of a fetch (``deal``): a pure function of the peers'
answers and this node's id. No I/O, no clock: every node that sees the same answers
deals alike, and a test deals over plain values. The coordinator (coordinator.py)
follows the nodes the deal names; the fetch's supply (supply.py) asks it file by file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .asking import Answer
from .rendezvous import ranked

__all__ = ["Deal", "Lead", "deal", "published", "share_first", "share_of"]


@dataclass(frozen=True)
class Lead:
    """A node this one follows for some files: its answer, the share of each of its
    files' pieces this node asks for first (``(i, n)``), and the other nodes' swarm
    addresses to trade pieces with."""

    answer: Answer
    share: tuple[int, int]
    others: tuple[str, ...]


@dataclass
class Deal:
    """Whom one try of a fetch follows for each file.

    Args:
        key: the model's key.
        node: this node's id.
        cohort: the nodes that split the model's files (this one included).
        leads: node id -> its ``Lead``, for every node this one may follow.
        whole: the node followed for every file, where one holds the model.
        listed: file name -> a node whose manifest lists it (followed for it).
        pullers: the nodes that pull files from the origin (None: the cohort), as the
            split agreed them (``deal``): the same list on every node of the split, a
            node this one has not heard from included; the others follow only.
        share: the requests in flight to the origin each puller may have (None: no
            cap): the cluster's cap shared out among the pullers.
        cluster: the nodes of the cluster as configured (the peers listed, resolved; 0:
            unknown): what a large file's cut follows (``cuts``).
    """

    key: str
    node: str
    cohort: list[str]
    leads: dict[str, Lead]
    whole: str | None = None
    listed: dict[str, str] = field(default_factory=dict)
    pullers: list[str] | None = None
    share: int | None = None
    cluster: int = 0
    _assigned: dict[str, str] = field(default_factory=dict, repr=False)
    _routed: set[str] = field(default_factory=set, repr=False)
    _weights: set[str] = field(default_factory=set, repr=False)  # the fetch's *.safetensors

    def __str__(self) -> str:
        if self.whole is not None:
            return f"following {self.whole[:8]}"
        if len(self.cohort) == 1:
            return "pulling from the origin"
        pullers = self._pullers()
        if len(pullers) < len(self.cohort):
            return (
                f"splitting the files among {len(pullers)} of {len(self.cohort)} nodes "
                f"(the cluster's cap on origin requests, {self.share} each)"
            )
        return f"splitting the files among {len(self.cohort)} nodes"

    def lead(self, answer: Answer) -> Lead:
        """A ``Lead`` for a node of the split heard only after the deal (hearing.py)."""
        swarms = [a.answer.swarm for a in self.leads.values() if a.answer.swarm]
        others = tuple(s for s in swarms if s != answer.swarm)
        nodes = sorted(set(self.cohort) | {answer.node})
        return Lead(answer, share_of(self.node, nodes, answer.node), others)

    def _pullers(self) -> list[str]:
        return self.cohort if self.pullers is None else self.pullers

    def _live(self) -> list[str]:
        """The pullers this node can follow (or is): whole files are dealt among them."""
        found = [n for n in self._pullers() if n in self.cohort]
        return found or [self.node]

    def ranged(self) -> list[str] | None:
        """The pullers a large file's ranges are dealt among (ranges.py), in node order;
        None where a holder is followed, one node pulls, or the fetch has a weight file
        for every puller: whole files are dealt then (``expect``), every origin link
        busy with a torrent a file, not one a range (8 files on 8 nodes in ranges: 56
        range torrents seeded by each node)."""
        pullers = self._pullers()
        if self.whole is not None or len(pullers) < 2 or len(self._weights) >= len(pullers):
            return None
        return sorted(pullers)

    def cuts(self) -> int:
        """The ranges a large file is cut into: the cluster's nodes as configured (or the
        pullers, where more) over the weight files, rounded up; about one range per
        puller. Not the pullers alone: the nodes that dealt at the same moment, before
        any split was published, each cut the file by the pullers it had heard (25 to 30
        of 32), at offsets no other cut lists, and read what no node listed from the
        origin (32 nodes: 22 to 32 copies of a one-file model). Cut alike, a range is
        listed alike by whichever node pulls it, and a node follows the one that lists
        it (ranged.py) when the owners it dealt differ."""
        nodes = max(self.cluster, len(self._pullers()))
        return -(-nodes // max(1, len(self._weights)))

    def start(self, name: str) -> int:
        """Where the ranges of the file ``name`` start in the turn round the pullers:
        the cuts of the weight files before it (ranges.owner)."""
        before = sum(1 for w in self._weights if w < name)
        return before * self.cuts()

    def leader(self, name: str) -> str:
        """The node that pulls the file ``name`` from the origin (or holds it already)."""
        listed = self.listed.get(name)
        if listed is not None and listed in self.leads:
            return listed
        assigned = self._assigned.get(name)
        return assigned if assigned is not None else ranked(self._key(name), self._live())[0]

    def _key(self, name: str) -> str:
        return f"{self.key}/{name}"

    def route(self, name: str) -> str | None:
        """The node followed for the file ``name``; None: this node pulls it."""
        if self.whole is not None:
            return self.whole
        self._routed.add(name)
        first = self.leader(name)
        return None if first == self.node else first

    def expect(self, names: list[str]) -> None:
        """Deal the files of the fetch out evenly, each to the first node of its own
        ranking that has no more files than any other so far (in name order; every node
        deals alike). Rendezvous hashing alone gave one node of eight four of eight
        shards: its link to the origin, then its upload, set the cluster's pace. A file
        already routed (the index, read to find the others) keeps its node."""
        self._weights |= {n for n in names if n.endswith(".safetensors")}
        pullers = self._live()
        load = dict.fromkeys(pullers, 0)
        for name in sorted(set(names) - self._routed):
            least = min(load.values())
            node = next(n for n in ranked(self._key(name), pullers) if load[n] == least)
            self._assigned[name] = node
            load[node] += 1


def deal(
    key: str,
    node: str,
    answers: list[Answer],
    dead: set[str],
    cap: int | None = None,
    agreed: tuple[str, ...] = (),
    cluster: int = 0,
) -> Deal:
    """The deal for the model ``key`` on node ``node``, from the other nodes'
    ``answers`` less the ``dead`` ones: a node that holds the model whole is followed
    for every file; else the nodes of the split pull the files, and a file a node
    lists already is followed there.

    **Who pulls is agreed, not counted by each node.** Nodes that each counted the
    answers they had cut a file differently and dealt its ranges to different owners
    (on two vCPUs a busy daemon answers one node in time and not another: 32 nodes
    read 32 copies of a one-file model). So the pullers are, in this order: ``agreed``
    (this node's own deal, kept for every try of the fetch); else the split a node of
    it publishes (its manifest's ``split``; of several, the longest, then the first
    in node order: every node that sees the same picks the same); else, where none is
    published yet, the nodes that answered (but those following a holder) and this
    one, which the coordinator then publishes. A node left out of the split follows
    only; a puller gone, or not heard from, is left to the ranges' re-deal (ranges.py).

    ``cap``: this node's cap on requests in flight to the origin, cluster-wide. The
    lowest cap of the split holds (each node publishes its own, so all deal alike);
    where it is below the number of nodes, the first ``cap`` of the model's ranking
    pull and the rest follow; each puller may have ``cap // pullers`` in flight.
    ``cluster``: the nodes configured (``Deal.cuts``)."""
    alive = [a for a in answers if a.node not in dead]
    swarms = [a.swarm for a in alive if a.swarm]

    def lead(answer: Answer, nodes: list[str]) -> Lead:
        others = tuple(s for s in swarms if s != answer.swarm)
        return Lead(answer, share_of(node, nodes, answer.node), others)

    holders = [a for a in alive if a.manifest is not None and a.manifest.state == "complete"]
    if holders:
        holder = min(holders, key=lambda a: a.node)
        leads = {holder.node: lead(holder, [a.node for a in alive])}
        return Deal(key, node, [node], leads, whole=holder.node)
    # A node following a holder leads nothing: it is not counted in the split.
    split = [a for a in alive if a.manifest is None or a.manifest.state != "following"]
    cohort = sorted({a.node for a in split} | {node})
    leads = {a.node: lead(a, cohort) for a in split}
    caps = [a.manifest.origin_requests for a in split if a.manifest is not None]
    lowest = min([c for c in [cap, *caps] if c is not None], default=None)
    pullers: list[str] | None = list(agreed or published(answers)) or None
    if pullers is None and lowest is not None:
        pullers = ranked(key, cohort)[:lowest] if lowest < len(cohort) else cohort
    share = None
    if lowest is not None:
        share = max(1, lowest // len(pullers or cohort))
    # A file a node lists already (it holds it, or pulls it from the origin) is followed
    # there, whatever the ranking says: a node that joins a split late pulls nothing twice.
    listed: dict[str, str] = {}
    for answer in sorted(split, key=lambda a: a.node):
        for offer in answer.manifest.files if answer.manifest else ():
            if offer.info_hash is not None or offer.name not in listed:
                listed[offer.name] = answer.node
    return Deal(
        key, node, cohort, leads, listed=listed, pullers=pullers, share=share, cluster=cluster
    )


def published(answers: list[Answer], own: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The split the nodes that answered publish, agreed: of several (``own``, this
    node's, among them), the longest, then the first in node order (every node that
    sees the same picks the same); () if none."""
    splits = [
        a.manifest.split
        for a in answers
        if a.manifest is not None and a.manifest.state == "fetching" and a.manifest.split
    ]
    return min([*splits, *([own] if own else [])], key=lambda s: (-len(s), s), default=())


def share_of(node: str, nodes: list[str], followed: str) -> tuple[int, int]:
    """Which share of each of ``followed``'s files this node asks for first, of how many:
    the followers of that node, in node order (each node sees about the same ones, and
    the shares need not tile exactly)."""
    followers = sorted(set(nodes) - {followed} | {node})
    return followers.index(node), len(followers)


def share_first(pieces: int, i: int, n: int) -> list[int]:
    """Piece priorities that put share ``i`` of ``n`` first (7: the top; 4: the default)."""
    first, last = i * pieces // n, (i + 1) * pieces // n
    return [7 if first <= p < last else 4 for p in range(pieces)]
