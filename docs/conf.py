"""Sphinx configuration of the documentation site (Sphinx + MyST Markdown).

Build: ``make docs`` (``sphinx-build -W --keep-going``: every warning, a broken link or a page in no
table of contents included, fails the build). Everything builds offline: diagrams are text, the
theme is Sphinx's bundled alabaster, and no extension fetches anything.
"""

project = "MindSpeed-RL · ASP"
author = "MindSpeed-RL ASP contributors"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
# Anchors for headings down to ####, so pages link to sections (`page.md#some-heading`); a link to
# a missing page or anchor is a warning, hence an error under -W.
myst_heading_anchors = 4
html_theme = "alabaster"
html_theme_options = {"page_width": "1200px", "sidebar_width": "260px"}
html_show_sourcelink = False
# Code blocks carry a tag after the language (```bash device-only); Pygments sees only "bash".
highlight_language = "text"
