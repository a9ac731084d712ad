"""What-if questions on a recorded job: change durations, tensor sizes, link bandwidths or the
bucket layout, and replay.

Every change starts from the recorded graph; a send whose size, bandwidth, pieces or steps
change is re-timed with the alpha-beta model (fitted on the run's calibration,
:mod:`dpro.replayer.linkmodel`, or on its recorded sends, :mod:`dpro.replayer.cost`), times the
ratio of measured to model time summed over the recorded sends of its collective and link
class that the model calls bandwidth-bound (in the job, gloo's all-reduces of DDP buckets took
about twice the calibrated time at every throttled rate); an unchanged send keeps its measured
time. Small, latency-bound sends give no ratio: on CPUs they overlap the backward pass and
measure mostly competition for the cores, which a fused bucket need not meet. (Each send's own
ratio, and one ratio over all sends, both made the held-out predictions of
``benchmarks/fidelity.py`` worse; the rule was chosen on its recorded matrix.)

    >>> w = WhatIf(graph_of_run(open_run("run1")))                              # doctest: +SKIP
    >>> w.scale(0.5, name=r"aten::mm|aten::addmm").set_link_bandwidth(2.0)      # doctest: +SKIP
    >>> w.replay().step_ns                                                      # doctest: +SKIP
"""

from __future__ import annotations

import copy
import dataclasses
import re

import numpy as np
import pandas as pd

from dpro.errors import DproError
from dpro.graph.collectives import schedule
from dpro.graph.dataflow import DataflowGraph, text_as_categories

from dpro.replayer.cost import AlphaBeta, fit_link_model, link_class
from dpro.replayer.interference import Interference, NodeClasses, overlap, relative_slowdown
from dpro.replayer.kernels import ReplayError
from dpro.replayer.median_rank import MedianRank, median_rank
from dpro.replayer.simulate import Replay, Replayer

ISSUE_EDGES = ("enqueue", "launch")  # from the op that issued a collective to its instance (gloo, NCCL)
INTERFERENCE_ROUNDS = 8  # at most this many replays re-time ops for the overlap the previous one found
INTERFERENCE_TOLERANCE = 1e-3  # ... and none once no op's factor would move by more than this
PER_NODE = ("durations", "_bytes", "_bandwidth", "_rate", "_class_rate", "_share", "_parts", "_repeat", "_extra",
            "_residual", "_recorded")  # a WhatIf's arrays of per-node state, that forks copy and new nodes extend


class WhatIfError(DproError):
    """A change that does not apply to this graph (no such collective, bucket...)."""


class WhatIf:
    """A recorded graph and a set of changes to it; each method returns ``self`` to chain."""

    def __init__(self, graph: DataflowGraph, model: dict[tuple[str, str], AlphaBeta] | None = None,
                 interference: Interference | None = None, incremental: bool = True, fold: bool = False) -> None:
        """``model``: the per-send link model (default: fitted on the graph's own sends,
        :func:`~dpro.replayer.cost.fit_link_model`; a run's calibration gives a better one,
        :func:`~dpro.replayer.linkmodel.calibrated_link_model`). ``interference``: how much
        compute and communication slow each other where they overlap
        (:mod:`dpro.replayer.interference`; ``None``: durations do not depend on overlap).
        ``incremental=False`` replays the whole graph every time (see :meth:`replay`), to
        measure what re-replaying only the changed part saves. ``fold=True`` replays the graph
        folded onto its median rank (:mod:`dpro.replayer.median_rank`; approximate), where its
        ranks run the same ops; :attr:`folded` says whether the last replay was."""
        self.graph = graph  # with the copies :meth:`split_collective` made, if any
        self._recorded_graph = graph
        self._origin = np.arange(len(graph.nodes))  # per node, the recorded node it copies
        self.incremental = incremental
        self.fold = fold
        self.folded = False  # whether the last replay was of the graph folded onto its median rank
        self.interference = interference
        self._classes: NodeClasses | None = None  # derived at the first replay with interference
        self._reference: np.ndarray | None = None  # the recorded configuration's overlap
        self.model = fit_link_model(graph) if model is None else model
        nodes = graph.nodes
        self.durations = nodes["dur_ns"].to_numpy(np.float64).copy()
        self.edges = graph.edges
        self._replayer: Replayer | None = None
        self._built_for: pd.DataFrame | None = None  # the edges the replayer was built for
        self._median_rank: MedianRank | None = None  # the fold the replayer replays, if folded
        self._bytes = nodes["bytes"].to_numpy(np.float64).copy()
        self._bandwidth = np.ones(len(nodes))  # what set_link_bandwidth asked
        self._rate = np.ones(len(nodes))  # the wire's share of a send's time this much faster (fewer flows share it)
        self._class_rate = np.ones(len(nodes))  # a send moved to a link class it has no model of: that class's rate
        # over its own (all of its time per byte)
        self._share = np.ones(len(nodes))  # a regrouped send's share of its call's bytes over its recorded share
        self._parts = np.ones(len(nodes))
        self._repeat = np.ones(len(nodes))  # algorithm steps each send now stands for
        self._extra = np.zeros(len(nodes))  # time added to a send (a comm hook's compute)
        self._model_of: dict[int, tuple] = {}
        self.dropped: set[tuple[str, int]] = set()  # the collectives :meth:`drop_collective` took out
        self._ends_of: tuple | None = None  # the collectives table, and its sends and done nodes as arrays
        for c in graph.collectives.itertuples():
            key = (c.coll, link_class(graph, c.ranks))
            if key in self.model and np.isfinite(c.bytes):
                self._model_of.update({v: key for v in c.sends})
        sends = np.fromiter(self._model_of, np.int64)
        self._recorded = np.full((len(nodes), 5), np.nan)  # per send, what its measured time was for
        self._recorded[sends] = self._timing(sends)
        self._residual = np.ones(len(nodes))
        keys = [self._model_of[int(v)] for v in sends]
        for key in set(keys):
            mine = sends[np.array([k == key for k in keys])]
            link = self.model[key]
            bound = mine[self._bytes[mine] / link.beta_bytes_per_ns >= link.alpha_ns]  # bandwidth-bound
            if len(bound):
                self._residual[mine] = self.durations[bound].sum() / max(float(self._send_model_ns(bound).sum()), 1e-9)

    def fork(self) -> "WhatIf":
        """A copy to change on its own: its changes leave this one as it is. It shares what
        does not change (the recorded graph, the link model, the recorded configuration's
        overlap, and the replayer while the structure is the same: its next replay re-replays
        only what differs from the last one of any fork), so that many changes of one graph
        are each replayed from a replay already made."""
        other = copy.copy(self)
        for name in (*PER_NODE, "_origin"):
            setattr(other, name, getattr(self, name).copy())
        other._model_of = dict(self._model_of)
        other.dropped = set(self.dropped)
        return other

    def select(self, *, name: str | None = None, kind: str | None = None, rank: int | None = None,
               resource: str | None = None) -> np.ndarray:
        """Ids of the nodes whose name matches the regular expression ``name`` and whose
        ``kind``, ``rank`` and ``resource`` are as given (omitted: any)."""
        nodes = self.graph.nodes
        mask = np.ones(len(nodes), bool)
        if name is not None:
            mask &= nodes["name"].astype(str).str.contains(re.compile(name)).to_numpy()
        for column, value in (("kind", kind), ("rank", rank), ("resource", resource)):
            if value is not None:
                mask &= (nodes[column] == value).to_numpy()
        return np.flatnonzero(mask)

    def scale(self, factor: float, **where: object) -> "WhatIf":
        """Durations of the selected ops (:meth:`select`) times ``factor``: one op, or a class
        of ops (``name=r"aten::mm"``, ``kind="gpu"``, ``rank=3``)."""
        ids = self.select(**where)  # type: ignore[arg-type]
        self.durations[ids] *= factor
        self._retime_ends()  # a rank's end of a collective follows the collective's sends
        return self

    def set_link_bandwidth(self, factor: float, src: int | None = None, dst: int | None = None,
                           link_class_: str | None = None) -> "WhatIf":
        """Links (all, those from ``src`` and/or to ``dst``, or of one class, ``intra`` or
        ``inter``) ``factor`` times as fast as recorded."""
        sends = np.fromiter(self._model_of, np.int64)
        if not len(sends):
            return self
        ends = self.graph.nodes["resource"].iloc[sends].astype(str).str.removeprefix("link/").str.split("->", expand=True)
        chosen = np.ones(len(sends), bool)
        for end, rank in ((0, src), (1, dst)):
            if rank is not None:
                chosen &= ends[end].astype(np.int64).to_numpy() == rank
        if link_class_ is not None:
            chosen &= np.array([self._model_of[int(v)][1] == link_class_ for v in sends])
        self._bandwidth[sends[chosen]] = factor
        return self._retime_sends()

    def set_collective_bytes(self, coll: str, occurrence: int, nbytes: float, parts: int = 1) -> "WhatIf":
        """Resize collective ``coll``'s ``occurrence``-th instance of a step to ``nbytes``, sent
        as ``parts`` pieces (tensor partitioning: each piece pays the latency); each send carries
        its recorded share of ``nbytes``, whatever size was set before."""
        c = self._collective(coll, occurrence)
        old = float(c["bytes"])
        if not old == old or old <= 0:
            raise WhatIfError(f"{coll}#{occurrence} has no recorded size to scale")
        sends = np.asarray(c["sends"], np.int64)
        self._bytes[sends] = self.graph.nodes["bytes"].to_numpy(np.float64)[sends] * (nbytes / old)
        self._parts[sends] = parts
        return self._retime_sends()

    def compress(self, coll: str, occurrence: int, ratio: float, extra_ns: float) -> "WhatIf":
        """Collective ``coll``'s ``occurrence`` sends ``ratio`` of its bytes and takes
        ``extra_ns`` longer in all (a communication hook compressing it: its compute)."""
        c = self._collective(coll, occurrence)
        sends = np.asarray(c["sends"], np.int64)
        if len(sends):
            self._bytes[sends] *= ratio
            self._extra[sends] += extra_ns / len(sends)
        return self._retime_sends()

    def set_world_size(self, world_size: int, link_class_: str) -> "WhatIf":
        """Every collective over ``world_size`` ranks, as its algorithm would run there (each
        step sends its share of the bytes; there are as many steps as the algorithm takes), over
        links of class ``link_class_``. The recorded ranks stand for the new ones (data
        parallel: every rank does the same work)."""
        for _, c in self.graph.collectives.iterrows():
            self._regroup(c, world_size, link_class_, None)
        return self._retime_sends()

    def regroup(self, calls: list[tuple[str, int]], group_size: int, link_class_: str,
                rate: float | None = None, sharing: float = 1.0) -> "WhatIf":
        """Each of ``calls`` (collective, occurrence) over ``group_size`` ranks, as its
        algorithm runs there (:meth:`set_world_size`'s rule, for these calls), over links of
        class ``link_class_``. Where the run measured no such collective over that class,
        ``rate`` (the class's rate over the recorded one's) re-times it on its recorded class's
        model: all of its time per byte, not only the wire's share (what TCP loses on a shaped
        link beyond its wire rate is the link's: 5.1 ns a byte between two hosts at 300 Mb/s,
        0.6 within one); an error if not given. A send moved onto another class's model is
        timed by that model alone: the residual its old class's sends measured (recorded over
        the model) is that link's, and the new class's own (where the run measured it) is of its
        recorded groups, which may have shared the link otherwise (2x2's two rings). A call's recorded ranks stand for its new
        group's and still wait for one another (where groups split, an error toward waiting on
        the slowest; where they merge, see :meth:`join`). ``sharing``: the flows that shared the
        recorded call's busiest link over those that share the new group's (the groups of a mesh
        dimension run at once): the wire's share of each send is that much faster. A dropped
        call stays dropped."""
        for coll, occurrence in calls:
            self._regroup(self._collective(coll, occurrence), group_size, link_class_, rate, sharing)
        return self._retime_sends()

    def _regroup(self, c: pd.Series, group_size: int, link_class_: str, rate: float | None,
                 sharing: float = 1.0) -> None:
        recorded, scaled = schedule(c["coll"], len(c["ranks"])), schedule(c["coll"], group_size)
        sends = np.asarray(c["sends"], np.int64)
        if not len(recorded) or not len(sends) or (c["coll"], int(c["occurrence"])) in self.dropped:
            return
        if not len(scaled):  # a group of one rank sends nothing
            self._repeat[sends] = 0.0
            return
        steps = scaled.steps / recorded.steps
        if int(sends[0]) not in self._model_of:  # unsized: only its number of steps changes
            self.durations[sends] = self.graph.nodes["dur_ns"].to_numpy(np.float64)[sends] * steps
            return
        key = (c["coll"], link_class_)
        self._rate[sends] = self._class_rate[sends] = 1.0
        if key in self.model:
            moved = np.array([self._model_of.get(int(v)) != key for v in sends])
            self._residual[sends[moved]] = 1.0  # how its old link's sends ran says nothing of the new link
            self._recorded[sends[moved]] = np.nan  # nor is its time the recorded one, whatever its size
            self._model_of.update({int(v): key for v in sends})
        elif rate is not None:
            self._class_rate[sends] = rate
        else:
            raise WhatIfError(f"no measurement of {c['coll']} over {link_class_}-host links in this run")
        self._rate[sends] *= sharing
        self._share[sends] = scaled.fraction.mean() / recorded.fraction.mean()
        self._repeat[sends] = steps

    def fuse_buckets(self, groups: list[list[int]]) -> "WhatIf":
        """Fuse DDP's all-reduces: each group of occurrences (in order of issue) becomes one
        all-reduce of their summed bytes, issued where the group's last one was; the others
        vanish, and what waited for them waits for the fused one."""
        for group in groups:
            members = [self._collective("all_reduce", k) for k in sorted(group)]
            keep, gone = members[-1], members[:-1]
            total = sum(float(m["bytes"]) for m in members)
            self.set_collective_bytes("all_reduce", int(keep["occurrence"]), total)
            edges, offset = self.edges, self.graph.nodes["offset_ns"].to_numpy()
            for m in gone:
                self.durations[np.asarray(m["sends"], np.int64)] = 0.0
                for rank_done, kept_done in zip(m["done"], keep["done"]):
                    # the vanished collective no longer ties ranks together ...
                    edges = edges[~((edges["dst"] == rank_done) & (edges["kind"] == "transfer"))]
                    # ... and what used its result, if it ran after the fused one, waits for that
                    # (an earlier user needed none of the fused data: DDP waits for every bucket
                    # before the optimizer, and that wait is the fused one's own)
                    users = edges[(edges["src"] == rank_done) & (edges["kind"] != "order")]
                    users = users[offset[users["dst"].to_numpy()] >= offset[kept_done]]
                    edges = pd.concat([edges, users.assign(src=kept_done)], ignore_index=True)
            self.edges = edges.reset_index(drop=True)
        self._retime_ends()
        return self

    def split_collective(self, coll: str, occurrence: int, count: int) -> list[int]:
        """Collective ``coll``'s ``occurrence`` becomes ``count`` collectives issued one after the
        other where it was (a bucket split in several): ``count - 1`` copies of its arrivals,
        sends and ends go first, each with the recorded one's inputs and users, each send before
        its copy's send on the same link. Returns their occurrences in order, the recorded
        one's last; size them with :meth:`set_collective_bytes`, move them with :meth:`reissue`."""
        if count <= 1:
            return [occurrence]
        c = self._collective(coll, occurrence)
        graph, edges = self.graph, self.edges
        n = len(graph.nodes)
        sends, done, arrivals, members = self._pieces(c)
        inside = np.zeros(n, bool)
        inside[members] = True
        src, dst = edges["src"].to_numpy(np.int64), edges["dst"].to_numpy(np.int64)
        touching = edges[inside[src] | inside[dst]]
        t_src, t_dst = touching["src"].to_numpy(np.int64), touching["dst"].to_numpy(np.int64)
        chained = members[np.isin(members, done, invert=True)]  # arrivals and sends queue behind their copies ...
        rank = graph.nodes["rank"].to_numpy()
        arrival_of = {int(rank[a]): int(a) for a in arrivals}
        ends = np.array([d for r, d in zip(c["ranks"], done) if r in arrival_of], np.int64)  # ... and each rank's
        starts = np.array([arrival_of[r] for r in c["ranks"] if r in arrival_of], np.int64)  # end before the next's start
        first = int(graph.collectives.loc[graph.collectives["coll"] == coll, "occurrence"].max()) + 1
        new_nodes, new_edges, new_rows, copies_of = [], [], [], []
        for j in range(count - 1):
            ids = np.full(n, -1, np.int64)  # per recorded node, its j-th copy
            ids[members] = n + j * len(members) + np.arange(len(members))
            new_nodes.append(graph.nodes.loc[members].assign(name=lambda f, k=first + j: f["name"].astype(str).str.replace(
                f"{coll}#{occurrence}", f"{coll}#{k}", regex=False)))
            new_edges.append(touching.assign(src=np.where(inside[t_src], ids[t_src], t_src),
                                             dst=np.where(inside[t_dst], ids[t_dst], t_dst)))
            if copies_of:
                new_edges.append(_order_edges(copies_of[-1][chained], ids[chained]))
                new_edges.append(_order_edges(copies_of[-1][ends], ids[starts]))
            copies_of.append(ids)
            new_rows.append({**c.to_dict(), "occurrence": first + j, "sends": ids[sends].tolist(), "done": ids[done].tolist()})
        new_edges.append(_order_edges(copies_of[-1][chained], chained))
        new_edges.append(_order_edges(copies_of[-1][ends], starts))
        copied = np.tile(members, count - 1)
        wraps = graph.wraps.copy()
        heads = wraps["dst"].to_numpy(np.int64)
        into = np.isin(heads, members)  # a queue's first op in the step is now the first copy's
        wraps.loc[into, "dst"] = copies_of[0][heads[into]]
        nodes = text_as_categories(pd.concat([graph.nodes, *new_nodes], ignore_index=True))
        self.graph = dataclasses.replace(graph, nodes=nodes, wraps=wraps, collectives=pd.concat(
            [graph.collectives, pd.DataFrame(new_rows)], ignore_index=True))
        self.edges = pd.concat([edges, *new_edges], ignore_index=True)
        self._append_copies(copied)
        self._recorded[n:] = np.nan  # a copy is re-timed for its own bytes
        for ids in copies_of:
            self._model_of.update({int(ids[v]): self._model_of[int(v)] for v in sends if int(v) in self._model_of})
        return [*range(first, first + count - 1), occurrence]

    def add_collective(self, coll: str, occurrence: int, issuers: dict[int, int], users: dict[int, int],
                       group: str | None = None) -> int:
        """A new collective like ``coll``'s ``occurrence`` (its arrivals, sends and ends, timed
        for its bytes), issued on each rank by ``issuers[rank]`` and needed by ``users[rank]``
        (node ids), labelled with ``group`` (default: the recorded one's): FSDP's all-gather of
        a unit again before its backward pass. It has no other
        inputs or users, and shares its links with no queue (an error toward too little
        contention). Returns its occurrence."""
        c = self._collective(coll, occurrence)
        graph, edges = self.graph, self.edges
        n = len(graph.nodes)
        sends, done, arrivals, members = self._pieces(c)
        ids = np.full(n, -1, np.int64)
        ids[members] = n + np.arange(len(members))
        inside = ids >= 0
        src, dst = edges["src"].to_numpy(np.int64), edges["dst"].to_numpy(np.int64)
        internal = edges[inside[src] & inside[dst]]
        new = int(graph.collectives.loc[graph.collectives["coll"] == coll, "occurrence"].max()) + 1
        rank = graph.nodes["rank"].to_numpy()
        arrival_of = {int(rank[a]): int(ids[a]) for a in arrivals}
        done_of = dict(zip((int(r) for r in c["ranks"]), ids[done].tolist()))
        issue = pd.DataFrame({"src": [issuers[r] for r in arrival_of], "dst": list(arrival_of.values()),
                              "lag_ns": 0, "kind": "enqueue"})
        need = pd.DataFrame({"src": [done_of[r] for r in users], "dst": list(users.values()), "lag_ns": 0,
                             "kind": "wait"})
        copies = graph.nodes.loc[members].assign(name=lambda f: f["name"].astype(str).str.replace(
            f"{coll}#{occurrence}", f"{coll}#{new}", regex=False))
        row = {**c.to_dict(), "occurrence": new, "sends": ids[sends].tolist(), "done": ids[done].tolist(),
               **({"group": group} if group is not None else {})}
        self.graph = dataclasses.replace(graph, nodes=text_as_categories(pd.concat([graph.nodes, copies],
                                                                                   ignore_index=True)),
                                         collectives=pd.concat([graph.collectives, pd.DataFrame([row])],
                                                               ignore_index=True))
        self.edges = pd.concat([edges, internal.assign(src=ids[internal["src"].to_numpy()],
                                                       dst=ids[internal["dst"].to_numpy()]), issue, need],
                               ignore_index=True)
        self._append_copies(members)
        self._model_of.update({int(ids[v]): self._model_of[int(v)] for v in sends if int(v) in self._model_of})
        return new

    def _pieces(self, c: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Collective ``c``'s sends, ends (in rank order), arrivals, and all of them (sorted)."""
        sends, done = np.asarray(c["sends"], np.int64), np.asarray(c["done"], np.int64)
        arrivals = self._arrivals(c)
        return sends, done, arrivals, np.unique(np.concatenate([arrivals, sends, done]))

    def _append_copies(self, copied: np.ndarray) -> None:
        """Per-node state for new nodes appended to the graph, each a copy of a ``copied`` node."""
        for name in PER_NODE:
            values = getattr(self, name)
            setattr(self, name, np.concatenate([values, values[copied]]))
        self._origin = np.concatenate([self._origin, self._origin[copied]])

    def _arrivals(self, c: pd.Series) -> np.ndarray:
        """The ranks' arrivals at collective ``c`` (where each issued it)."""
        edges = self.edges
        into_done = edges[edges["dst"].isin(c["done"]) & (edges["kind"] == "arrive")]["src"].to_numpy(np.int64)
        return np.unique(into_done[self.graph.nodes["kind"].to_numpy()[into_done] != "transfer"])

    def issuers(self) -> dict[int, int]:
        """Each collective arrival's issuing op (the call that enqueued it, or launched its kernel)."""
        issue = self.edges[self.edges["kind"].isin(ISSUE_EDGES)]
        return dict(zip(issue["dst"].astype(int), issue["src"].astype(int)))

    def reissue(self, coll: str, occurrence: int, issuers: dict[int, int]) -> bool:
        """Collective ``coll``'s ``occurrence`` issued on each rank by another op (``issuers``:
        rank -> node id), e.g. a bucket whose last gradient is now ready earlier: the edge from the
        op that issued the rank's instance (the call that enqueued it, or launched its kernel) leaves
        the new op instead, with its recorded lag (no earlier than the new op's start). Returns
        whether every rank's could be moved; none is moved otherwise."""
        c = self._collective(coll, occurrence)
        edges = self.edges
        dst, kind = edges["dst"].to_numpy(), edges["kind"].to_numpy()
        ranks = self.graph.nodes["rank"].to_numpy()
        arrivals = self._arrivals(c)
        lag = edges["lag_ns"].to_numpy(np.float64).copy()
        src = edges["src"].to_numpy(np.int64).copy()
        for rank in c["ranks"]:
            if rank not in issuers:
                continue
            issued = np.isin(dst, arrivals[ranks[arrivals] == rank]) & np.isin(kind, ISSUE_EDGES)
            if not issued.any():
                return False
            src[issued] = issuers[rank]
            lag[issued] = np.maximum(lag[issued], -self.durations[issuers[rank]])
        self.edges = edges.assign(src=src, lag_ns=lag)
        return True

    def collective_bytes(self, coll: str, occurrence: int) -> float:
        """Collective ``coll``'s ``occurrence``'s size as changed so far (recorded: its table's)."""
        c = self._collective(coll, occurrence)
        sends = np.asarray(c["sends"], np.int64)
        recorded = float(self.graph.nodes["bytes"].to_numpy(np.float64)[sends].sum()) if len(sends) else 0.0
        return float(c["bytes"]) * float(self._bytes[sends].sum()) / recorded if recorded > 0 else float(c["bytes"])

    def drop_collective(self, coll: str, occurrence: int) -> "WhatIf":
        """Collective ``coll``'s ``occurrence`` not called: its sends take no time, its issue
        and its wait cost nothing (their lags, the worker's start and the caller's wake-up, are
        gone), and no rank waits for another's arrival at it (each rank's sends and end follow
        its own arrival only), and it leaves its worker's queue (the ops before and after it
        there follow one another: a call issued earlier need not wait behind it). The ops that
        issued and awaited it keep their time (FSDP's copy in and out of the gathered buffer)."""
        c = self._collective(coll, occurrence)
        sends, done, arrivals, members = self._pieces(c)
        self._repeat[sends] = 0.0
        edges = self.edges
        src, dst, kind = (edges[k].to_numpy() for k in ("src", "dst", "kind"))
        touched = (np.isin(dst, arrivals) & np.isin(kind, ISSUE_EDGES)) | (np.isin(src, done) & (kind == "wait"))
        ties = np.isin(dst, members) & np.isin(src, members)  # arrivals and sends into sends and ends
        ties |= (kind == "join") & (np.isin(dst, members) | np.isin(src, members))  # no longer one with others
        rank = self.graph.nodes["rank"].to_numpy()
        own = {int(rank[a]): int(a) for a in arrivals}
        inner = np.concatenate([sends, done])
        own_arrival = pd.DataFrame({"src": [own[int(rank[v])] for v in inner if int(rank[v]) in own],
                                    "dst": [int(v) for v in inner if int(rank[v]) in own], "lag_ns": 0.0,
                                    "kind": "arrive"})
        # off its worker's queue: the op before it there is followed by the op after it
        order = kind == "order"
        into = order & np.isin(dst, arrivals) & ~np.isin(src, members)
        out_of = order & np.isin(src, done) & ~np.isin(dst, members)
        before = dict(zip(rank[dst[into]].tolist(), src[into].tolist()))
        pairs = [(before[int(rank[d])], int(q), float(lag)) for d, q, lag in
                 zip(src[out_of], dst[out_of], edges["lag_ns"].to_numpy()[out_of]) if int(rank[d]) in before]
        spliced = pd.DataFrame({"src": np.array([p for p, _, _ in pairs], np.int64),
                                "dst": np.array([q for _, q, _ in pairs], np.int64),
                                "lag_ns": np.array([lag for _, _, lag in pairs], np.float64), "kind": "order"})
        kept = edges.assign(lag_ns=np.where(touched, 0.0, edges["lag_ns"].to_numpy(np.float64)))[
            ~(ties | into | out_of)]
        self.edges = pd.concat([kept, own_arrival, spliced], ignore_index=True)
        self._retime_sends()
        self.durations[sends] = self._extra[sends]  # a send the link model does not time too
        self._retime_ends()
        self.dropped.add((coll, occurrence))
        return self

    def join(self, groups: list[list[tuple[str, int]]]) -> "WhatIf":
        """Each of ``groups`` of calls (collective, occurrence), each call over its own ranks, run
        as one call over all of theirs (groups of ranks merged into one: 2x2's two
        tensor-parallel pairs as one group of 4): no send of one begins before every rank of
        every call arrived, and none ends before all their sends did. Their sends keep their
        timing (:meth:`regroup` re-times them for the merged group); a call that sends nothing
        or was dropped joins none."""
        names = self.graph.nodes["name"].to_numpy()
        src: list[np.ndarray] = []
        dst: list[np.ndarray] = []
        for calls in groups:
            pieces = [p for p in (self._pieces(self._collective(*c)) for c in calls if c not in self.dropped)
                      if len(p[0])]
            steps = [np.array([int(str(n).rsplit(" step ", 1)[-1]) for n in names[sends]]) for sends, _, _, _ in pieces]
            firsts = [sends[k == k.min()] for (sends, _, _, _), k in zip(pieces, steps)]
            lasts = [sends[k == k.max()] for (sends, _, _, _), k in zip(pieces, steps)]
            for i, (_, done, _, _) in enumerate(pieces):
                for j, (_, _, arrivals, _) in enumerate(pieces):
                    if i != j:  # the others' arrivals before this call's first sends; their last sends before its ends
                        src += [np.repeat(arrivals, len(firsts[i])), np.repeat(lasts[j], len(done))]
                        dst += [np.tile(firsts[i], len(arrivals)), np.tile(done, len(lasts[j]))]
        if src:
            joined = pd.DataFrame({"src": np.concatenate(src).astype(np.int64),
                                   "dst": np.concatenate(dst).astype(np.int64), "lag_ns": 0.0, "kind": "join"})
            self.edges = pd.concat([self.edges, joined], ignore_index=True)
        return self

    def add_waits(self, ends: dict[int, int], users: dict[int, int]) -> "WhatIf":
        """Each rank's ``users[rank]`` (a node id) waits for ``ends[rank]`` too: e.g. a thread
        that now waits, where FSDP prefetches, for an all-gather it issued."""
        ranks = [r for r in users if r in ends]
        waits = pd.DataFrame({"src": [ends[r] for r in ranks], "dst": [users[r] for r in ranks], "lag_ns": 0,
                              "kind": "wait"})
        self.edges = pd.concat([self.edges, waits], ignore_index=True)
        return self

    def replay(self) -> Replay:
        """Replay the graph with the changes made so far. Successive calls on an unchanged
        structure (no new :meth:`fuse_buckets`) re-replay only what follows the changed ops.

        With ``interference``, ops are then re-timed for the overlap the replay found, against
        the overlap of the recorded configuration's replay, and replayed again, until no factor
        moves by more than :data:`INTERFERENCE_TOLERANCE` (at most :data:`INTERFERENCE_ROUNDS`
        times; each factor after the first is the mean of the new one and the last, so that ops
        that leave and re-enter overlap settle between the two). Folded, all of it runs on the
        folded graph, and the result is mapped back to every node."""
        if self._replayer is None or self._built_for is not self.edges or not self.incremental:
            self._build()
        folded = self._median_rank
        durations = self.durations if folded is None else folded.fold(self.durations)
        result = self._replayer.replay(durations)
        if self.interference is not None:
            if self._reference is None:
                self._reference = self._recorded_overlap(result)
            graph = self._replayer.graph
            if self._classes is None or len(self._classes.rank) != len(graph.nodes):
                self._classes = NodeClasses.of(graph)
            reference = self._reference[self._origin]
            result = self._settle(result, durations, reference if folded is None else folded.fold(reference))
        return result if folded is None else folded.unfold(result)

    def _build(self) -> None:
        """The replayer of the graph as changed, folded onto its median rank if asked and possible."""
        graph = dataclasses.replace(self.graph, edges=self.edges)
        folded = median_rank(graph, self._median_rank) if self.fold else None
        replayer = None
        if folded is not None:
            try:
                replayer = Replayer(folded.graph)
            except ReplayError:  # the ranks' orders fold into a cycle
                folded = None
        if self.folded != (folded is not None):
            self._classes = None  # they were the other graph's
        self._median_rank, self.folded = folded, folded is not None
        self._replayer = replayer or Replayer(graph)
        self._built_for = self.edges

    def _recorded_overlap(self, result: Replay) -> np.ndarray:
        """Per node of the recorded graph, its overlap in the recorded configuration's replay
        (folded like the replays it is compared with); ``result``: the replay just made."""
        graph = self._recorded_graph
        dur = graph.nodes["dur_ns"].to_numpy(np.float64)
        unchanged = self.edges is graph.edges and np.array_equal(self.durations, dur)
        folded = self._median_rank if unchanged or not self.folded else median_rank(graph, self._median_rank)
        if unchanged:
            recorded = result
        elif folded is None:
            recorded = Replayer(graph).replay()
        else:
            recorded = Replayer(folded.graph).replay(folded.fold(dur))
        replayed = graph if folded is None else folded.graph
        fractions = overlap(NodeClasses.of(replayed), recorded.start_ns, recorded.end_ns, recorded.step_ns)
        return fractions if folded is None else fractions[folded.node_of]

    def _settle(self, result: Replay, durations: np.ndarray, reference: np.ndarray) -> Replay:
        """The replay with each op re-timed for the overlap it meets (see :meth:`replay`)."""
        factor: np.ndarray | None = None
        for _ in range(INTERFERENCE_ROUNDS):
            found = overlap(self._classes, result.start_ns, result.end_ns, result.step_ns)
            slowdown = relative_slowdown(self._classes, self.interference, found, reference)
            if factor is not None and np.max(np.abs(slowdown - factor), initial=0.0) <= INTERFERENCE_TOLERANCE:
                break
            factor = slowdown if factor is None else (factor + slowdown) / 2
            if not self.incremental:
                self._replayer = Replayer(self._replayer.graph)
            result = self._replayer.replay(durations * factor)
        return result

    def _collective(self, coll: str, occurrence: int) -> pd.Series:
        table = self.graph.collectives
        hit = table[(table["coll"] == coll) & (table["occurrence"] == occurrence)] if len(table) else table
        if hit.empty:
            raise WhatIfError(f"no collective {coll}#{occurrence} in this graph")
        return hit.iloc[0]

    def _send_model_ns(self, sends: np.ndarray) -> np.ndarray:
        nbytes = self._bytes[sends] * self._share[sends] / self._class_rate[sends]
        return np.array([self.model[self._model_of[int(v)]].time_ns(b, self._bandwidth[v] * self._rate[v],
                                                                       self._parts[v])
                         for v, b in zip(sends, nbytes)], np.float64) * self._repeat[sends]

    def _timing(self, sends: np.ndarray) -> np.ndarray:
        """What a send's time depends on: bytes, bandwidth, pieces, steps, added time."""
        return np.stack([self._bytes[sends] * self._share[sends] / self._class_rate[sends],
                         self._bandwidth[sends] * self._rate[sends],
                         self._parts[sends], self._repeat[sends], self._extra[sends]], axis=1)

    def _retime_sends(self) -> "WhatIf":
        sends = np.fromiter(self._model_of, np.int64)
        if len(sends):
            changed = (self._timing(sends) != self._recorded[sends]).any(axis=1)
            v = sends[changed]
            self.durations[v] = self._send_model_ns(v) * self._residual[v] + self._extra[v]
        self._retime_ends()
        return self

    def _retime_ends(self) -> None:
        """Each rank's end of a collective (its *done* node: how long after the collective's end
        its own instance ended, :func:`dpro.graph.decompose.decompose`) re-timed as the
        collective's sends were, by their summed time over their recorded one (none once
        dropped), but never lengthened: where a call grows (a group of 2 asked as 4), how far
        apart its new ranks finish is not known from the old ones, whose finishing apart was
        mostly wake-up noise, and it would grow with the call."""
        table = self.graph.collectives
        if not len(table):
            return
        if self._ends_of is None or self._ends_of[0] is not table:
            sends = [np.asarray(v, np.int64) for v in table["sends"]]
            done = [np.asarray(v, np.int64) for v in table["done"]]
            self._ends_of = (table, np.concatenate(sends), np.repeat(np.arange(len(sends)), [len(v) for v in sends]),
                             np.concatenate(done), np.array([len(v) for v in done]))
        _, send_ids, of_send, done_ids, per_call = self._ends_of
        recorded = self.graph.nodes["dur_ns"].to_numpy(np.float64)
        now = np.bincount(of_send, self.durations[send_ids], len(per_call))
        was = np.bincount(of_send, recorded[send_ids], len(per_call))
        ratio = np.minimum(np.divide(now, was, out=np.ones(len(per_call)), where=was > 0), 1.0)
        self.durations[done_ids] = recorded[done_ids] * np.repeat(ratio, per_call)


def _order_edges(src: np.ndarray, dst: np.ndarray) -> pd.DataFrame:
    """Program order from each of ``src`` to the same place in ``dst``, without a gap."""
    return pd.DataFrame({"src": src.astype(np.int64), "dst": dst.astype(np.int64), "lag_ns": 0, "kind": "order"})
