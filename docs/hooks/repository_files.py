"""mkdocs hook: pages link to files outside docs/ exactly as on GitHub, and the site serves them.

A page may point at a figure under results/, a script or a CSV with the relative link that works when the markdown is
read on GitHub (`../results/evidence_grid_500k/score_vs_lag.png`). mkdocs only publishes what lies under docs/, so
such a link would be reported as broken. This hook finds every such link in the pages, and publishes each target file
with the site under `repository/` (an image shows, a script or CSV opens as text). The link itself is left to mkdocs,
which resolves and validates it as usual: a link to a file that does not exist still fails `mkdocs build --strict`.
Nothing is copied into docs/, so a figure regenerated under results/ is on the site at the next build.
"""

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

# The target of a markdown link or image, `](../x)`, or of an html `src="../x"` / `href="../x"`.
LINK_RE = re.compile(r"""(?:\]\(|(?:src|href)=["'])(\.\./[^)"'\s#?]+)""")
PUBLISHED_UNDER = "repository"


class RepositoryFile(File):
    """A file from outside docs/ (markdown included), published as it is rather than rendered as a page."""

    def is_documentation_page(self):
        return False

    def is_static_page(self):
        return False


def linked_outside(page_uri, markdown, docs_dir, root):
    """(the link's target as mkdocs resolves it, the file) for each link in `markdown` to a file outside docs/."""
    for link in LINK_RE.findall(markdown):
        target_uri = posixpath.normpath(posixpath.join(posixpath.dirname(page_uri), link))
        path = (docs_dir / target_uri).resolve()
        if path.is_file() and root in path.parents and docs_dir not in path.parents:
            yield target_uri, path


def on_files(files, config):
    docs_dir = Path(config.docs_dir).resolve()
    root = docs_dir.parent
    published = set()
    for page in list(files.documentation_pages()):
        for target_uri, path in linked_outside(page.src_uri, page.content_string, docs_dir, root):
            if target_uri in published:
                continue
            published.add(target_uri)
            # INCLUDED explicitly: mkdocs would exclude a source path that starts with a dot, as `../` does.
            file = RepositoryFile.generated(config, target_uri, abs_src_path=str(path), inclusion=InclusionLevel.INCLUDED)
            file.dest_uri = posixpath.join(PUBLISHED_UNDER, path.relative_to(root).as_posix())
            file.url = file.dest_uri
            files.append(file)
    return files
