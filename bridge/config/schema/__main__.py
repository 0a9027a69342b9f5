"""`python -m bridge.config.schema`: the schema, as the reference docs/configuration.md holds.

The schema is a package so that running it does not execute a second copy of a module the
`bridge.config` package has already imported.
"""

from bridge.config.reference import main

main()
