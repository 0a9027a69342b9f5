"""`python -m bridge.config.schema`: the schema, as the reference the README embeds.

The schema is a package so that running it does not execute a second copy of a module the
`bridge.config` package has already imported.
"""

from bridge.config.reference import render_reference_markdown

print(render_reference_markdown(heading_level=3))
