"""Names too long for a file system (issue 42): a segment over 255 bytes or a path over
4096 is refused or left out with a message that names it (cut short) and says so,
never one that blames another character."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from aioloader import FormatError, SourceError, load_model
from aioloader.fetch.copy import copy_folder
from aioloader.fetch.dest import name_problem
from aioloader.format.names import MAX_PATH, MAX_SEGMENT, length_problem, shown
from aioloader.sinks.hf.cache_writes import wait_hf_cache
from aioloader.sources.hf.tree import bad_path
from aioloader.sources.layout import parse_index

from . import test_hf
from .helpers import assert_matches_files, some_big, write_sharded
from .hub_server import LocalHub
from .s3_server import MotoS3Server

hub = test_hf.hub

LONG_SEGMENT = "x" * (MAX_SEGMENT + 1)
WIDE_SEGMENT = "é" * 128  # 128 characters, 256 bytes in UTF-8
LONG_PATH = "/".join(["d" * 200] * 21)  # every segment fits, the path does not
HUGE = "x" * 5000


@pytest.mark.parametrize("name", [LONG_SEGMENT, WIDE_SEGMENT, LONG_PATH, HUGE, "a/" + HUGE])
def test_a_name_too_long_is_refused_everywhere_with_a_message_that_says_so(name: str) -> None:
    for why in (length_problem(name), bad_path(name), name_problem(name)):
        assert why is not None and ("255 bytes" in why or "4096 bytes" in why), why
        assert "backslash" not in why and len(why) < 300
    with pytest.raises(FormatError) as caught:
        parse_index(b'{"weight_map": {"t": "%s"}}' % name.encode(), "file:///m/index.json")
    message = str(caught.value)
    assert "bytes" in message and "backslash" not in message and len(message) < 600


@pytest.mark.parametrize("name", ["x" * MAX_SEGMENT, "é" * 127, "/".join(["d" * 200] * 20)])
def test_a_name_at_the_limit_is_accepted(name: str) -> None:
    assert len(name.encode()) <= MAX_PATH
    assert length_problem(name) is None and bad_path(name) is None
    assert name_problem(name) is None


def test_shown_cuts_a_long_name_and_says_how_long_it_is() -> None:
    assert shown("model.safetensors") == "'model.safetensors'"
    text = shown(HUGE)
    assert len(text) < 120 and "5000 characters" in text
    assert shown(3) == "3"  # type: ignore[arg-type] - a listing may hold anything


async def test_a_hub_file_with_a_5000_character_name_is_left_out_as_too_long(
    hub: LocalHub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "src"
    write_sharded(folder, some_big(1), shards=2)
    files = test_hf._files(folder) | {HUGE: b"odd", "back\\slash.txt": b"odd"}
    hub.commit("org/model", files)
    with caplog.at_level(logging.WARNING):
        assert_matches_files(
            await load_model("hf://org/model"), *sorted(folder.glob("*.safetensors"))
        )
        await wait_hf_cache()
    (warning,) = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(warning) < 1000, "the 5000-character name is cut short"
    assert "5000 characters" in warning and "4096 bytes" in warning
    assert "'back\\\\slash.txt' (it holds a backslash" in warning
    long_part = warning[warning.index("'xxx") :]
    assert "backslash" not in long_part.split(")")[0]


async def test_an_s3_key_with_a_segment_too_long_fails_the_fetch_by_name(
    tmp_path: Path, s3_env: MotoS3Server
) -> None:
    s3_env.create_bucket("long-names")
    s3_env.put_object("long-names", "m/config.json", b"{}")
    s3_env.put_object("long-names", f"m/{LONG_SEGMENT}.json", b"{}")
    dest = tmp_path / "dest"
    with pytest.raises(SourceError) as caught:
        await copy_folder("s3://long-names/m/", dest)
    message = str(caught.value)
    assert "255 bytes" in message and "xxxx" in message and len(message) < 600
    assert not dest.exists() or not any(dest.iterdir())
