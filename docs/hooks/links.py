"""The site's links (an mkdocs hook, named in mkdocs.yml).

The pages are written to be read where they lie, on a forge or in a clone: docs/ links
to ``../loadtest/FIGURES.md`` and ``../examples/``, and the two pages the site includes
from elsewhere (loadtest/FIGURES.md, CHANGELOG.md) link from where they lie. Here each
relative link is resolved against the file its text comes from, then pointed at the
site's page for that file; a link to a file the site has no page for (an example, a
test) becomes its path in code, so that ``mkdocs build --strict`` still fails on a link
that leads nowhere at all.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
SITE_PAGES = {"loadtest/FIGURES.md": "figures.md", "CHANGELOG.md": "changelog.md", "README.md": "index.md"}
IMAGES = "loadtest/figures"  # copied to the site as figures/
INCLUDE = re.compile(r'^--8<-- "([^"]+)"$', re.MULTILINE)
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s#]*)(#[^)\s]*)?\)")


def on_files(files: Files, config: Any) -> Files:
    for image in sorted((ROOT / IMAGES).iterdir()):
        files.append(File(f"figures/{image.name}", str(ROOT / "loadtest"), config["site_dir"], False))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """The page's links, then each file it includes (``--8<-- "path"``), relinked from
    where that file lies."""
    page_dir = posixpath.dirname(page.file.src_uri)
    parts = INCLUDE.split(markdown)  # text, included path, text, ...
    for index, part in enumerate(parts):
        if index % 2:
            text = (ROOT / part).read_text(encoding="utf-8")
            parts[index] = relinked(text, posixpath.dirname(part), page_dir)
        else:
            parts[index] = relinked(part, posixpath.join("docs", page_dir), page_dir)
    return "".join(parts)


def relinked(markdown: str, source: str, page_dir: str) -> str:
    """``markdown``'s relative links, written from the folder ``source``, as links from a
    page in the site's folder ``page_dir``."""

    def relink(match: re.Match[str]) -> str:
        bang, text, target, anchor = match.group(1), match.group(2), match.group(3), match.group(4) or ""
        if not target or "://" in target or target.startswith("mailto:"):
            return match.group(0)
        path = posixpath.normpath(posixpath.join(source, target))
        if path.startswith(IMAGES + "/"):
            site_path = "figures/" + path[len(IMAGES) + 1 :]
        elif path in SITE_PAGES:
            site_path = SITE_PAGES[path]
        elif path.startswith("docs/"):
            site_path = path[len("docs/") :]
        else:
            return f"{text} (`{path}`)" if text.strip("`") != path else f"`{path}`"
        return f"{bang}[{text}]({posixpath.relpath(site_path, page_dir or '.')}{anchor})"

    return LINK.sub(relink, markdown)
