"""The cluster's view as an operator reads it (``aioloader swarm view``): a table per
model (node, file, role, done, rate, bytes from the origin and from peers), and a line
per node that is not done saying what holds it back, where the view tells
(``diagnose``). Pure: values in (view.py), text out.

What a line says, for the file of the node that is furthest behind:

- it follows a node that does not answer, or is itself behind: "following 1a2b3c4d for
  shard-2, which is itself at 20 % (pulling it from the origin at 3.00 MiB/s)";
- it follows a node that has the file, but has no peer connected for it: "no peers
  connected";
- it pulls the file from the origin: at what rate, or nothing for the last seconds;
- it has not decided yet how the file comes (it is asking its peers);
- for a file dealt in byte ranges, the same of the range furthest behind: "following
  1a2b3c4d for range [256 MiB, 512 MiB) of model.safetensors, which is itself at 20 %";
- and, first, what it reports that cannot be (flagged by view.py): its numbers are
  then shown as reported, and not to be trusted.
"""

from __future__ import annotations

from ..settings.values import format_size
from .counts import RATE_WINDOW
from .view import ClusterView, FileView, ModelView, NodeView, RangeView

__all__ = ["diagnose", "render"]

_HEAD = ("node", "state", "file", "role", "done", "rate", "origin", "peers")


def _rate(rate: float) -> str:
    return f"{format_size(rate)}/s"


def _done(file: FileView) -> str:
    fraction = file.fraction
    return "-" if fraction is None else f"{fraction:.1%}"


def _short(name: str, width: int = 32) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def who(view: NodeView) -> str:
    """A node as the table names it: its id's first 8 digits and its API address."""
    return f"{view.node[:8]} {view.api or '?'}"


def _flags(model: ModelView) -> list[str]:
    found = list(model.flags)
    for file in model.files:
        found += [f"{file.name}: {flag}" for flag in file.flags]
    return found


def _unfinished(model: ModelView) -> list[FileView]:
    """The files of ``model`` not whole here."""
    moving = ("origin", "follows", "waiting")
    return [f for f in model.files if f.role in moving or f.done < f.size]


def _here(file: FileView) -> str:
    return f" (here {_done(file)})" if file.fraction is not None else ""


def _following(cluster: ClusterView, model: ModelView, file: FileView) -> tuple[int, str]:
    name = _short(file.name)
    followed = cluster.node(file.follows) if file.follows is not None else None
    shown = (file.follows or "?")[:8]
    if followed is None:
        gone = next((u for u in cluster.unreachable if u.api == file.follows_api), None)
        if gone is not None:
            return 0, (
                f"following {shown} ({gone.api}) for {name}, which does not answer: {gone.reason}"
            )
        return 0, f"following {shown} for {name}, which is not in the view (gone, or not listed)"
    theirs = followed.model(model.key)
    their = theirs.file(file.name) if theirs is not None else None
    if their is None:
        return 2, f"following {shown} for {name}, which does not list the file (any more)"
    fraction = their.fraction
    if fraction is not None and fraction < 1:
        how = f"pulling it from the origin at {_rate(their.rate)}" if their.role == "origin" else (
            f"following {(their.follows or '?')[:8]} for it" if their.role == "follows" else
            their.role
        )  # fmt: skip
        return 4, (
            f"following {shown} for {name}{_here(file)}, which is itself at {fraction:.0%} ({how})"
        )
    if file.peers == 0:
        return (
            1,
            f"following {shown} for {name}{_here(file)}, which has it whole, "
            "but no peers connected",
        )
    return 6, (
        f"following {shown} for {name}{_here(file)}, which has it whole, at {_rate(file.rate)} "
        f"from {file.peers} peer(s)"
    )


def _span(one: RangeView) -> str:
    return f"range [{format_size(one.offset)}, {format_size(one.offset + one.length)})"


def _range(
    cluster: ClusterView, model: ModelView, file: FileView, one: RangeView
) -> tuple[int, str]:
    """(as ``_why``) for range ``one`` of ``file``, not here yet."""
    what = f"{_span(one)} of {_short(file.name)}"
    here = f" (here {one.done / one.length:.0%})" if one.length else ""
    if one.role == "origin":
        return 5, f"pulling {what}{here} from the origin"
    shown = (one.node or "?")[:8]
    puller = cluster.node(one.node) if one.node is not None else None
    if puller is None:
        return 0, f"following {shown} for {what}, which is not in the view (gone, or unreachable)"
    theirs = puller.model(model.key)
    their = theirs.file(file.name) if theirs is not None else None
    them = next((r for r in their.ranges if r.offset == one.offset), None) if their else None
    if them is None:
        return 2, f"following {shown} for {what}, which does not list that range"
    if them.done < them.length:
        how = "pulling it from the origin" if them.role == "origin" else them.role
        return 4, f"following {shown} for {what}{here}, which is itself at " + (
            f"{them.done / them.length:.0%} ({how})" if them.length else "0 %"
        )
    return 6, f"following {shown} for {what}{here}, which has it whole"


def _why(cluster: ClusterView, model: ModelView, file: FileView) -> tuple[int, str]:
    """(how much it holds the node back: 0 most, what holds it) for a file not whole."""
    name = _short(file.name)
    behind = [r for r in file.ranges if r.done < r.length]
    if behind:
        return min((_range(cluster, model, file, r) for r in behind), key=lambda found: found[0])
    if file.role == "follows":
        return _following(cluster, model, file)
    if file.role == "origin" and file.rate > 0:
        return 5, f"pulling {name}{_here(file)} from the origin at {_rate(file.rate)}"
    if file.role == "origin":
        return (
            3,
            f"pulling {name}{_here(file)} from the origin, nothing in the last {RATE_WINDOW:g} s",
        )
    if file.role == "waiting":
        return 7, f"waiting: how {name} comes is not decided yet (asking the origin or the peers)"
    return 8, f"{name} is {file.role} at {_done(file)}"


def diagnose(cluster: ClusterView, view: NodeView, model: ModelView) -> str | None:
    """Why ``view``'s node is not done with ``model``, in a line; None when it is. Of its
    files not whole, the one that says most: a followed node gone, no peers connected,
    an origin that sends nothing, a followed node itself behind, the origin's rate, then
    the file furthest behind first."""
    flags = _flags(model)
    said = f"reports what cannot be ({'; '.join(flags)}); " if flags else ""
    files = _unfinished(model)
    if not files:
        return said.rstrip("; ") or None
    reasons = [
        (*_why(cluster, model, f), f.fraction if f.fraction is not None else 1.0) for f in files
    ]
    why = min(reasons, key=lambda r: (r[0], r[2]))[1]
    more = len(files) - 1
    return said + why + (f"; {more} more file(s) not whole" if more else "")


def _row(view: NodeView, model: ModelView, file: FileView) -> tuple[str, ...]:
    role = file.role
    if file.role == "follows":
        role = f"follows {(file.follows or '?')[:8]}"
    elif file.role == "seeds":
        role = f"seeds {_rate(file.upload_rate)}"
    elif file.ranges:
        counts = {r: sum(one.role == r for one in file.ranges) for r in ("origin", "follows")}
        role = f"{len(file.ranges)} ranges: " + ", ".join(f"{n} {r}" for r, n in counts.items())
    rate = _rate(file.rate) if file.role in ("origin", "follows") else "-"
    mark = " !" if file.flags else ""
    return (
        who(view), model.state, _short(file.name), role, _done(file) + mark, rate,
        format_size(file.bytes_from_origin), format_size(file.bytes_from_peers),
    )  # fmt: skip


def _range_rows(file: FileView, most: int = 8) -> list[tuple[str, ...]]:
    """Rows under a file dealt in ranges: its ranges not here yet (``most`` of them)."""
    behind = [r for r in file.ranges if r.done < r.length]
    rows: list[tuple[str, ...]] = [
        ("", "", f"  {_span(r)}", f"follows {(r.node or '?')[:8]}" if r.role == "follows"
         else r.role, f"{r.done / r.length:.1%}" if r.length else "-", "", "", "")
        for r in behind[:most]
    ]  # fmt: skip
    if len(behind) > most:
        rows.append(("", "", f"  {len(behind) - most} more range(s) not here", "", "", "", "", ""))
    return rows


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEAD))]
    return [
        ("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
        for r in rows
    ]


def render(cluster: ClusterView) -> list[str]:
    """The lines ``aioloader swarm view`` prints."""
    lines: list[str] = []
    keys: dict[str, str] = {}
    for view in cluster.nodes:
        for model in view.models:
            keys.setdefault(model.key, model.url)
    for key, url in keys.items():
        lines.append(f"model {key[:12]}  {url}")
        rows: list[tuple[str, ...]] = [_HEAD]
        why: list[str] = []
        for view in cluster.nodes:
            found = view.model(key)
            if found is None:
                continue
            for f in found.files:
                rows += [_row(view, found, f), *_range_rows(f)]
            if not found.files:
                rows.append((who(view), found.state, "-", "-", "-", "-", "-", "-"))
            said = diagnose(cluster, view, found)
            if said is not None:
                why.append(f"  {who(view)}: {said}")
        lines += _table(rows)
        lines += why
    if not keys:
        lines.append("no node fetches or offers a model")
    for view in cluster.nodes:
        if view.flags:
            lines.append(f"{who(view)}: reports what cannot be: {'; '.join(view.flags)}")
    lines += [f"unreachable {u.api}: {u.reason}" for u in cluster.unreachable]
    totals = [
        f"{who(v)}: {format_size(v.bytes_from_origin)} from the origin, "
        f"{format_size(v.bytes_from_peers)} from peers, in {_rate(v.download_rate)}, "
        f"out {_rate(v.upload_rate)}" + (f", {v.banned} peer(s) banned" if v.banned else "")
        for v in cluster.nodes
    ]
    return [*lines, "nodes:", *(f"  {t}" for t in totals)]
