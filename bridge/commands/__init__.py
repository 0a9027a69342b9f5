"""The command line: the parser (`cli`) and one module per verb."""
