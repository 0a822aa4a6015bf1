# SPDX-License-Identifier: BSL-1.0
# Doxygen input filter for the Markdown pages (docs/Doxyfile, FILTER_PATTERNS).
# Doxygen 1.9.4 gives headings no GitHub-style ids, so an in-page link such as
# [Performance](#performance) warns "unable to resolve reference"; in the
# reference it becomes plain text. Links to other files are left alone.
s/\[([^]]*)\]\(#[^)]*\)/\1/g
# A link to a heading of another page, [x](page.md#heading), links to the page.
s/\]\(([^)#:]*\.md)#[^)]*\)/](\1)/g
