"""Which commit a branch or tag is at now: one question to the Hub, bounded in time.

A node that holds a model in the hub cache must be able to start it while the Hub
is away. So when the cache has a ref for the revision and the listing of its
commit, the Hub is asked with one GET of the revision's API page, on the event
loop, under ``RevisionCheck.timeout`` for the whole question (every attempt and
pause included). What comes back is one of three things:

* a commit sha: the answer;
* an answer that is no sha (``401``/``403``/``404``, another status, a page that
  says something else): the Hub answered, so the load fails as it would without a
  cache (huggingface_hub is asked again, to name the error);
* no answer (the deadline passed, connections refused, ``5xx`` or throttling on
  every attempt): the cached commit is loaded, with a warning that it may be out of
  date, as huggingface_hub serves its cache then; ``RevisionCheck.fresh`` makes it
  an error instead.

``HF_HUB_OFFLINE`` is another matter: the Hub is never asked (hf_cache.py).
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from urllib.parse import quote

from ...errors import LoaderError, ReadError, SourceError
from ...redact import redacting_logger
from ...settings.values import MAX_SECONDS, check_number
from ..http.store import HttpStore
from .hub import HubSettings
from .url import HfLocation, is_commit

__all__ = ["NoAnswer", "RevisionCheck", "ask_commit"]

logger = redacting_logger(__name__)

_LAST = re.compile(r"\(last: (.*)\); check")  # the last failure, in the Retrier's ReadError


@dataclass(frozen=True)
class RevisionCheck:
    """How a branch or tag the hub cache holds is checked against the Hub.

    Attributes:
        timeout: seconds the whole question may take (``hf_revision_timeout``).
        fresh: fail rather than load the cached commit when the Hub gives no answer
            (``hf_fresh``).
    """

    timeout: float = 10.0  # as LoadOptions, and huggingface_hub's wait for metadata
    fresh: bool = False

    def __post_init__(self) -> None:
        check_number("hf_revision_timeout", self.timeout, positive=True, maximum=MAX_SECONDS)

    def settle(
        self, settings: HubSettings, location: HfLocation, cached: str, silence: NoAnswer
    ) -> str:
        """``cached``, the commit the hub cache holds for ``location``'s revision, once
        the Hub gave no answer: after a warning, or, with ``fresh``, never.

        Raises:
            SourceError: ``fresh`` is set.
        """
        where = (
            f"{location.url()}: the Hub at {settings.endpoint} did not say which commit "
            f"{location.revision!r} of {location.repo_id} is at ({silence})"
        )
        if self.fresh:
            raise SourceError(
                f"{where}, and hf_fresh is set, so the commit the Hugging Face cache holds for "
                f"it ({cached[:12]}) is not loaded; check the network and HF_ENDPOINT, or "
                "unset hf_fresh (AIOLOADER_HF_FRESH) to load the cached commit"
            ) from silence
        logger.warning(
            "%s; loading the commit the Hugging Face cache at %s holds for it, %s, which may "
            "be out of date (set hf_fresh, AIOLOADER_HF_FRESH=1, to fail instead)",
            where,
            settings.cache,
            cached[:12],
        )
        return cached


class NoAnswer(Exception):
    """The Hub gave no answer in time (see the module)."""


async def ask_commit(
    store: HttpStore, settings: HubSettings, location: HfLocation, check: RevisionCheck
) -> str | None:
    """The commit sha the Hub says ``location.revision`` is at now, or None when it
    answered something else (see the module).

    Raises:
        NoAnswer: no answer within ``check.timeout`` seconds.
    """
    timeout = check.timeout
    url = location.url()
    page = f"{settings.endpoint}/api/models/{quote(location.repo_id)}/revision/" + quote(
        location.revision, safe=""
    )
    try:
        async with asyncio.timeout(timeout):
            body = await store.read_body(url, page, lambda detail: detail)
    except ReadError as exc:  # every attempt failed: refused, reset, stalled, 5xx, 429
        last = _LAST.search(str(exc))
        raise NoAnswer(f"every attempt failed, the last: {last[1]}" if last else str(exc)) from exc
    except TimeoutError as exc:
        raise NoAnswer(f"no answer within hf_revision_timeout, {timeout:g} s") from exc
    except LoaderError:
        return None  # an answer: 401, 403, 404, another status, a refused URL
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    sha = answer.get("sha") if isinstance(answer, dict) else None
    return sha if isinstance(sha, str) and is_commit(sha) else None
