"""hf:// URLs and a commit's snapshot: the pure parts of the Hub source, with hostile input."""

from __future__ import annotations

import pytest

from aioloader import ConfigError, NotFoundError
from aioloader.sources.hf.snapshot import Snapshot
from aioloader.sources.hf.url import MAX_URL, HfLocation, is_commit, parse_hf_url

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("hf://org/name", HfLocation("org/name", "main", "")),
        ("HF://org/name/", HfLocation("org/name", "main", "")),
        ("hf://org/name@v1.0", HfLocation("org/name", "v1.0", "")),
        (f"hf://org/name@{SHA}", HfLocation("org/name", SHA, "")),
        ("hf://org/name@dev/sub/folder", HfLocation("org/name", "dev", "sub/folder")),
        ("hf://org/name@dev/sub/folder/", HfLocation("org/name", "dev", "sub/folder")),
        ("hf://o/n@main/model.safetensors", HfLocation("o/n", "main", "model.safetensors")),
        ("hf://org/name/model.safetensors", HfLocation("org/name", "main", "model.safetensors")),
        ("hf://org/name@feature%2Fx/a", HfLocation("org/name", "feature/x", "a")),
        ("hf://org/name@refs/pr/12/a", HfLocation("org/name", "refs/pr/12", "a")),
        ("hf://org/name@refs/convert/parquet", HfLocation("org/name", "refs/convert/parquet", "")),
        # The path is a name in the listing, never decoded: "%2e%2e" is a literal name.
        ("hf://org/name@main/%2e%2e/x", HfLocation("org/name", "main", "%2e%2e/x")),
        ("hf://org/name@main/a@b.safetensors", HfLocation("org/name", "main", "a@b.safetensors")),
        ("hf://Org_1/my-model.v2", HfLocation("Org_1/my-model.v2", "main", "")),
    ],
)
def test_good_urls(url: str, expected: HfLocation) -> None:
    assert parse_hf_url(url) == expected
    assert parse_hf_url(expected.url()) == expected


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("hf://", "names no repository"),
        ("hf://org", "names no repository"),
        ("hf://org/", "names no repository"),
        ("hf:///name", "names no repository"),
        ("hf://org/name@", "revision after '@' is empty"),
        ("hf://org/name@a@b", "'@' appears twice"),
        ("hf://org@x/name", "not a valid owner"),
        ("hf://org/na me", "not a valid repository name"),
        ("hf://org/-name", "not a valid repository name"),
        ("hf://org/na--me", "not a valid repository name"),
        ("hf://or..g/name", "not a valid owner"),
        ("hf://" + "o" * 97 + "/name", "not a valid owner"),
        ("hf://org/name@..", "'..'"),
        ("hf://org/name@a..b", "'..'"),
        ("hf://org/name@%2e%2e", "'..'"),
        ("hf://org/name@x%00y", "git refuses"),
        ("hf://org/name@x%20y", "git refuses"),
        ("hf://org/name@x%2F", "starts or ends"),
        ("hf://org/name@%2Fx", "starts or ends"),
        ("hf://org/name@a%2F%2Fb", "'//'"),
        ("hf://org/name@main/../x", "'.' or '..'"),
        ("hf://org/name@main/./x", "'.' or '..'"),
        ("hf://org/name@main/a//b", "two slashes"),
        ("hf://org/name@main/a\\b", "backslash"),
        ("hf://org/name@main/a\nb", "control character"),
        ("hf://org/name?x=1", "no query or fragment"),
        ("hf://org/name#frag", "no query or fragment"),
        ("s3://org/name", "not an hf:// URL"),
        ("org/name", "not an hf:// URL"),
        ("hf://org/name@" + "r" * 256, "longer than 255"),
    ],
)
def test_bad_urls_say_which_part(url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_hf_url(url)


@pytest.mark.parametrize("value", [None, b"hf://org/name", 42, ["hf://org/name"]])
def test_wrong_types(value: object) -> None:
    with pytest.raises(ConfigError, match="must be a str"):
        parse_hf_url(value)


def test_huge_input_is_refused_without_echoing_it() -> None:
    url = "hf://org/name@main/" + "a" * (10 * MAX_URL)
    with pytest.raises(ConfigError, match=f"over {MAX_URL}") as caught:
        parse_hf_url(url)
    assert len(str(caught.value)) < 300


def test_is_commit() -> None:
    assert is_commit(SHA)
    assert not is_commit(SHA.upper()) and not is_commit(SHA[:-1]) and not is_commit("main")


def _snapshot() -> Snapshot:
    files = {"config.json": 10, "model.safetensors": 100, "sub/a/w.safetensors": 5}
    return Snapshot("org/name", "main", SHA, files)


def test_snapshot_lists_folders_and_files() -> None:
    snap = _snapshot()
    assert snap.names_in("") == ["config.json", "model.safetensors", "sub/"]
    assert snap.names_in("sub") == ["a/"]
    assert snap.names_in("sub/a") == ["w.safetensors"]
    assert snap.names_in("model.safetensors") is None
    assert snap.size_of("sub/a/w.safetensors") == 5
    assert snap.describe() == f"org/name@main (commit {SHA})"


def test_snapshot_names_what_is_missing() -> None:
    snap = _snapshot()
    with pytest.raises(NotFoundError, match=r"hf://org/name@main/nope: .*no file or folder"):
        snap.names_in("nope")
    with pytest.raises(NotFoundError, match="holds a folder named 'sub'"):
        snap.size_of("sub")
    with pytest.raises(NotFoundError, match="no file or folder named 'su'"):
        snap.size_of("su")
